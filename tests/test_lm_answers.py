"""The language-model answers (issue 38): gpt presets and overrides, token data, the training-loop settings."""

from __future__ import annotations

import pytest

from tests.factories import answers_yaml
from wizard.answers.language_model import PRESETS, gpt_config
from wizard.answers.model import load_text, resolve, to_context
from wizard.errors import AnswersError

BASE = {"project_name": "demo", "device": "cpu", "nodes": 1, "devices_per_node": 2, "amp": "off"}
GPT = {**BASE, "training.model": "gpt", "training.dataset": "tokens"}


def problems_of(raw: dict) -> list[str]:
    """The error lines resolve() reports for `raw`."""
    with pytest.raises(AnswersError) as caught:
        resolve(raw)
    return [str(p) for p in caught.value.problems]


def test_gpt_on_tokens_takes_the_tiny_preset_and_language_model_defaults() -> None:
    values = resolve(GPT).values
    assert values["training.gpt_size"] == "tiny"
    assert [values[f"training.{name}"] for name in ("n_layer", "n_head", "n_embd", "block_size", "dropout")] == [
        None
    ] * 5
    assert values["training.max_steps"] == 1000
    assert values["training.eval_every"] == 100
    assert values["training.grad_clip"] == 1.0
    assert values["training.base_lr"] == 0.001  # AdamW's scale, not SGD's 0.05
    assert values["training.warmup_epochs"] == 0


def test_an_override_replaces_one_setting_of_the_preset_and_the_rest_follow_the_size() -> None:
    context = to_context(resolve({**GPT, "training.gpt_size": "small", "training.n_layer": 3}))
    shape = gpt_config(context)
    small = PRESETS["small"]
    assert (shape.n_layer, shape.n_head, shape.n_embd, shape.block_size) == (3, small.n_head, small.n_embd, 256)
    assert context["n_layer"] == "3" and context["n_head"] == ""


@pytest.mark.parametrize(
    ("raw", "field", "words"),
    [
        ({"training.n_head": 5}, "training.n_head", "n_embd 64 (tiny's) is not a multiple of n_head 5 (given)"),
        (
            {"training.gpt_size": "small", "training.n_embd": 100},
            "training.n_embd",
            "n_embd 100 (given) is not a multiple of n_head 6 (small's)",
        ),
        ({"training.gpt_size": "huge"}, "training.gpt_size", "tiny, small, gpt2-124m"),
        ({"training.n_layer": 0}, "training.n_layer", "at least 1"),
        ({"training.dropout": 1.5}, "training.dropout", "at most 0.9"),
        ({"training.block_size": "long"}, "training.block_size", "an integer"),
        ({"training.lr_schedule": "linear"}, "training.lr_schedule", "constant, cosine"),
        ({"training.grad_accum": 0}, "training.grad_accum", "at least 1"),
        ({"training.grad_clip": -1}, "training.grad_clip", "at least 0"),
        ({"training.max_steps": 10, "training.warmup_steps": 10}, "training.warmup_steps", "not below"),
        (
            {"training.lr": 0.001, "training.lr_schedule": "cosine", "training.min_lr": 0.01},
            "training.min_lr",
            "above the peak rate",
        ),
        ({"training.peak_tflops": 0}, "training.peak_tflops", "at least 0.001"),
    ],
)
def test_each_bad_language_model_answer_names_its_field_value_and_what_is_allowed(
    raw: dict, field: str, words: str
) -> None:
    problems = problems_of({**GPT, **raw})
    assert any(line.startswith(f"{field}: ") and words in line for line in problems), problems


def test_gpt_needs_token_data_and_token_data_needs_gpt() -> None:
    assert problems_of({**BASE, "training.model": "gpt"}) == [
        "training.dataset: 'synthetic': the gpt model reads token windows: set training.dataset to tokens "
        "(train.bin and val.bin, made by the generated prepare_data.py)"
    ]
    (line,) = problems_of({**BASE, "training.dataset": "tokens"})
    assert line.startswith("training.model: 'mlp': token data needs a language model")


def test_every_problem_of_a_file_is_reported_at_once() -> None:
    text = answers_yaml(
        {
            **{key: value for key, value in BASE.items()},
            "training": {"model": "gpt", "dataset": "tokens", "n_head": 3, "grad_accum": 0, "lr_schedule": "step"},
        }
    )
    with pytest.raises(AnswersError) as caught:
        load_text(text)
    fields = sorted(p.field for p in caught.value.problems)
    assert fields == ["training.grad_accum", "training.lr_schedule", "training.n_head"]


def test_gpt_settings_given_for_an_image_model_are_ignored_with_a_warning() -> None:
    warnings = [str(w) for w in resolve({**BASE, "training.n_layer": 4}).warnings]
    assert "training.n_layer: 4: ignored: it does not apply to these answers" in warnings


def test_loop_settings_do_not_apply_to_a_users_own_script() -> None:
    loaded = resolve({**BASE, "launcher": "torchrun", "training.script": "main.py", "training.grad_accum": 4})
    assert "training.grad_accum" not in loaded.values
    assert any(w.field == "training.grad_accum" for w in loaded.warnings)


def test_steps_warmup_replaces_the_epoch_warmup_of_a_scaled_rate() -> None:
    values = resolve({**BASE, "training.warmup_steps": 50}).values
    assert "training.warmup_epochs" not in values
    assert resolve(BASE).values["training.warmup_epochs"] == 5


def test_min_lr_is_asked_only_for_the_cosine_schedule() -> None:
    assert "training.min_lr" not in resolve(GPT).values
    assert resolve({**GPT, "training.lr_schedule": "cosine"}).values["training.min_lr"] == 0.0


def test_the_other_datasets_keep_their_epochs_as_the_length() -> None:
    values = resolve(BASE).values
    assert (values["training.max_steps"], values["training.grad_accum"], values["training.grad_clip"]) == (0, 1, 0.0)
    assert values["training.eval_every"] == 0  # asked, but off: a held-out split would take samples from training
