"""The learning rate per step: linear scaling with a gradual warmup (Goyal et al. 2017)."""

from __future__ import annotations

import pytest
import torch

from runtime.schedule import GOYAL_WARMUP_EPOCHS, LinearWarmup


def test_a_scaled_rate_climbs_linearly_from_the_base_rate() -> None:
    warmup = LinearWarmup.scaled(base_lr=0.1, target_lr=0.8, warmup_epochs=2, steps_per_epoch=35)
    assert warmup == LinearWarmup(0.1, 0.8, 70)
    assert [warmup.lr_at(step) for step in (0, 35, 70, 71, 10_000)] == pytest.approx([0.1, 0.45, 0.8, 0.8, 0.8])
    rates = [warmup.lr_at(step) for step in range(71)]
    assert rates == sorted(rates)


def test_no_warmup_when_scaling_does_not_raise_the_rate_or_it_is_turned_off() -> None:
    assert LinearWarmup.scaled(0.1, 0.1, 5, 100).warmup_steps == 0
    assert LinearWarmup.scaled(0.1, 0.05, 5, 100).lr_at(0) == 0.05
    assert LinearWarmup.scaled(0.1, 0.8, 0, 100).lr_at(0) == 0.8


def test_the_default_is_the_papers_five_epochs() -> None:
    assert GOYAL_WARMUP_EPOCHS == 5


def test_apply_sets_every_parameter_group() -> None:
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD([{"params": [model.weight]}, {"params": [model.bias]}], lr=1.0)
    assert LinearWarmup(0.1, 0.5, 4).apply(optimizer, 2) == pytest.approx(0.3)
    assert [group["lr"] for group in optimizer.param_groups] == pytest.approx([0.3, 0.3])


def test_describe_names_the_ramp() -> None:
    assert LinearWarmup(0.05, 0.4, 160).describe() == (
        "learning rate warmup: 0.05 -> 0.4 linearly over the first 160 steps (Goyal et al. 2017), then 0.4"
    )
    assert LinearWarmup(0.4, 0.4, 0).describe() == "learning rate 0.4 from the first step (no warmup)"
