"""Rules that tie the language-model and training-loop answers together, as plain functions (see rules.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from wizard.answers.language_model import PRESETS, shape_from_answers
from wizard.errors import Problem

Values = Mapping[str, Any]


def model_reads_its_data(v: Values) -> Iterator[Problem]:
    """gpt trains on token windows and only gpt reads them: the image models need images or tensors."""
    model, dataset = v["training.model"], v["training.dataset"]
    if model == "gpt" and dataset != "tokens":
        yield Problem(
            "training.dataset",
            dataset,
            "the gpt model reads token windows: set training.dataset to tokens (train.bin and val.bin, made by "
            "the generated prepare_data.py)",
        )
    elif dataset == "tokens" and model != "gpt":
        yield Problem(
            "training.model",
            model,
            "token data needs a language model: set training.model to gpt (or a dataset of images for this model)",
        )


def heads_divide_width(v: Values) -> Iterator[Problem]:
    """Each attention head takes an equal slice of the embedding: n_embd must be a multiple of n_head."""
    shape = shape_from_answers(v)
    if shape.n_embd % shape.n_head == 0:
        return
    preset = PRESETS[v["training.gpt_size"]]
    named = [name for name in ("n_embd", "n_head") if v.get(f"training.{name}") is not None]
    field = f"training.{named[0]}" if named else "training.gpt_size"
    origin = {
        name: "given" if v.get(f"training.{name}") is not None else f"{v['training.gpt_size']}'s"
        for name in ("n_embd", "n_head")
    }
    fits = [heads for heads in range(1, min(shape.n_embd, 64) + 1) if shape.n_embd % heads == 0]
    yield Problem(
        field,
        v.get(field, v["training.gpt_size"]),
        f"n_embd {shape.n_embd} ({origin['n_embd']}) is not a multiple of n_head {shape.n_head} "
        f"({origin['n_head']}): each head takes an equal slice of the embedding. Heads that divide "
        f"{shape.n_embd}: {', '.join(map(str, fits[-6:]))}; or an n_embd that is a multiple of {shape.n_head} "
        f"(the {v['training.gpt_size']} preset has n_embd {preset.n_embd}, n_head {preset.n_head})",
    )


def warmup_within_run(v: Values) -> Iterator[Problem]:
    """A warmup that lasts the whole run never reaches its peak rate."""
    warmup, steps = v["training.warmup_steps"], v["training.max_steps"]
    if steps and warmup >= steps:
        yield Problem(
            "training.warmup_steps",
            warmup,
            f"not below training.max_steps ({steps}): the rate would never reach its peak; give fewer warmup steps",
        )


def cosine_ends_below_peak(v: Values) -> Iterator[Problem]:
    """The cosine falls from the peak rate to min_lr: min_lr above a given peak is a rising curve."""
    lr, min_lr = v.get("training.lr"), v["training.min_lr"]
    if lr is not None and min_lr > lr:
        yield Problem(
            "training.min_lr",
            min_lr,
            f"above the peak rate training.lr ({lr:g}): the cosine falls from the peak to min_lr; give a smaller one",
        )


LM_RULES: tuple[tuple[tuple[str, ...], Callable[[Values], Iterator[Problem]]], ...] = (
    (("training.model", "training.dataset"), model_reads_its_data),
    (("training.gpt_size",), heads_divide_width),
    (("training.warmup_steps", "training.max_steps"), warmup_within_run),
    (("training.min_lr",), cosine_ends_below_peak),
)
