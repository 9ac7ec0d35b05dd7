"""A local Hugging Face model folder, read without transformers: is it whole, and how long a context does it take.

Clusters are often offline, so a generated project never downloads a model: it
loads a folder saved with save_pretrained (config.json, the weights, the
tokenizer) that the user fetched on a machine with internet and copied over.
npu-wizard reads the folder when it renders (where the path is absolute and
the folder is there), the generated train.py and prepare_data.py at start-up;
each says the same when it is missing or incomplete.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import SetupError

CONFIG_FILE = "config.json"
# save_pretrained writes one of these (a sharded model: the index beside its shards)
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
# where a causal LM's config.json gives its longest context (GPT-2 and its kin: n_positions)
POSITION_KEYS = ("max_position_embeddings", "n_positions")


@dataclass(frozen=True)
class ModelFolder:
    """What config.json of a whole model folder says: its longest context and vocabulary (None: not said)."""

    path: Path
    max_positions: int | None
    vocab_size: int | None


def fetch_hint(path: Path | str) -> str:
    """How to put a model into `path` from a machine with internet."""
    return (
        "fetch the model on a machine with internet, e.g. `hf download NAME --local-dir DIR` (older "
        "huggingface_hub: `huggingface-cli download NAME --local-dir DIR`), or in Python "
        "AutoModelForCausalLM.from_pretrained(NAME).save_pretrained(DIR) and "
        f"AutoTokenizer.from_pretrained(NAME).save_pretrained(DIR); then copy DIR to {path} on every node"
    )


def read_model_folder(path: Path) -> ModelFolder:
    """The facts of the model saved in `path`; SetupError when the folder, its config.json or its weights are missing."""
    if not path.is_dir():
        raise SetupError(f"no Hugging Face model folder at {path}: {fetch_hint(path)}")
    config = read_config(path)
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        raise SetupError(
            f"{path} holds no weights (none of {', '.join(WEIGHT_FILES)}): the download stopped early, or only "
            f"the config was saved; {fetch_hint(path)}"
        )
    vocab_size = config.get("vocab_size")
    return ModelFolder(
        path, max_positions(config), vocab_size if _count(vocab_size) else None
    )


def read_config(path: Path) -> dict[str, Any]:
    """config.json of the model folder `path` as a mapping; SetupError when it is missing or unreadable."""
    config_path = path / CONFIG_FILE
    if not config_path.is_file():
        raise SetupError(
            f"{path} holds no {CONFIG_FILE}: it is not a model saved with save_pretrained; {fetch_hint(path)}"
        )
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise SetupError(
            f"{config_path} cannot be read as JSON ({error}): {fetch_hint(path)}"
        ) from None
    if not isinstance(config, dict):
        raise SetupError(f"{config_path} is not a JSON object: {fetch_hint(path)}")
    return config


def max_positions(config: Mapping[str, Any]) -> int | None:
    """The longest sequence the model's position embeddings take, as its config says (None: it does not say)."""
    for key in POSITION_KEYS:
        if _count(config.get(key)):
            return int(config[key])
    return None


def block_size_problem(
    block_size: int, folder: ModelFolder, origin: str = ""
) -> str | None:
    """Why windows of `block_size` tokens do not fit the model in `folder` (None: they fit, or it does not say).

    `origin` tells where the figure came from, such as " (the default)".
    """
    if folder.max_positions is None or block_size <= folder.max_positions:
        return None
    return (
        f"block_size {block_size}{origin} is beyond the model's context: {folder.path} takes at most "
        f"{folder.max_positions} positions ({CONFIG_FILE}); set training.block_size to {folder.max_positions} or less"
    )


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
