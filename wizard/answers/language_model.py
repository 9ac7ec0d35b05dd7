"""The GPT model's shape: the presets of training.gpt_size and the overrides a user changes.

An override left empty takes the preset's value, so a later change of
training.gpt_size changes every setting the user did not name. The templates
read the resolved shape through the `gpt_config` filter (release_facts.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

LANGUAGE_MODELS = ("gpt", "hf")  # the models that train on token windows
HF_BLOCK_SIZE = 1024  # an hf model's context length when training.block_size is empty


@dataclass(frozen=True)
class GPTShape:
    """Layers, heads, embedding width, context length and dropout of the generated GPT."""

    n_layer: int
    n_head: int
    n_embd: int
    block_size: int
    dropout: float


PRESETS: dict[str, GPTShape] = {
    # seconds per step on a CPU: what the tests and a first try on a laptop use
    "tiny": GPTShape(n_layer=2, n_head=2, n_embd=64, block_size=64, dropout=0.0),
    # a character-level model that learns real text in minutes on one card
    "small": GPTShape(n_layer=6, n_head=6, n_embd=384, block_size=256, dropout=0.1),
    # GPT-2's smallest published shape (Radford et al. 2019): 124M parameters with its 50257-token vocabulary
    "gpt2-124m": GPTShape(n_layer=12, n_head=12, n_embd=768, block_size=1024, dropout=0.0),
}
OVERRIDES = ("n_layer", "n_head", "n_embd", "block_size", "dropout")


def shape_of(size: str, overrides: Mapping[str, Any]) -> GPTShape:
    """The preset `size` with every override that is set (not None) in place of its value."""
    chosen = {name: overrides[name] for name in OVERRIDES if overrides.get(name) is not None}
    return replace(PRESETS[size], **chosen)


def shape_from_answers(values: Mapping[str, Any]) -> GPTShape:
    """The shape that answers keyed by dotted name ask for."""
    return shape_of(values["training.gpt_size"], {name: values.get(f"training.{name}") for name in OVERRIDES})


def gpt_config(context: Mapping[str, object]) -> GPTShape:
    """The shape a cookiecutter context asks for (its values are text; an empty override takes the preset's)."""
    overrides: dict[str, Any] = {}
    for name in OVERRIDES:
        text = str(context.get(name, "")).strip()
        if text:
            overrides[name] = float(text) if name == "dropout" else int(text)
    return shape_of(str(context["gpt_size"]), overrides)


def hf_block_size(values: Mapping[str, Any]) -> int:
    """The window length an hf model trains on: training.block_size, or HF_BLOCK_SIZE when it is empty."""
    given = values.get("training.block_size")
    return HF_BLOCK_SIZE if given is None else given
