"""Rules that tie the language-model and training-loop answers together, as plain functions (see rules.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from runtime import hf_folder
from runtime.errors import SetupError
from wizard.answers.language_model import LANGUAGE_MODELS, PRESETS, hf_block_size, shape_from_answers
from wizard.errors import Problem

Values = Mapping[str, Any]


def model_reads_its_data(v: Values) -> Iterator[Problem]:
    """gpt and hf train on token windows and only they read them: the image models need images or tensors."""
    model, dataset = v["training.model"], v["training.dataset"]
    if model in LANGUAGE_MODELS and dataset != "tokens":
        yield Problem(
            "training.dataset",
            dataset,
            f"the {model} model reads token windows: set training.dataset to tokens (train.bin and val.bin, made by "
            "the generated prepare_data.py)",
        )
    elif dataset == "tokens" and model not in LANGUAGE_MODELS:
        yield Problem(
            "training.model",
            model,
            "token data needs a language model: set training.model to gpt or hf (or a dataset of images for this "
            "model)",
        )


def hf_folder_fits(v: Values) -> Iterator[Problem]:
    """An absolute hf model folder that is here is read now: whole, and with a context of at least block_size.

    A relative folder lies in a project not written yet, and a cluster's folder may be on its nodes alone:
    the generated train.py reads it at start-up and says the same.
    """
    path = Path(v["training.hf_model_path"])
    if not path.is_absolute() or not path.exists():
        return
    try:
        folder = hf_folder.read_model_folder(path)
    except SetupError as error:
        yield Problem("training.hf_model_path", str(path), str(error))
        return
    block_size = hf_block_size(v)
    origin = "" if v.get("training.block_size") is not None else " (hf's default, training.block_size being empty)"
    problem = hf_folder.block_size_problem(block_size, folder, origin)
    if problem is not None:
        yield Problem("training.block_size", block_size, problem)


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
    (("training.hf_model_path", "training.block_size"), hf_folder_fits),
    (("training.warmup_steps", "training.max_steps"), warmup_within_run),
    (("training.min_lr",), cosine_ends_below_peak),
)
