"""Mixed precision on the CPU: fp16 with a dynamic loss scaler, bf16 without one."""

from __future__ import annotations

import pytest
import torch

from runtime import amp


def step(mode: str) -> tuple[torch.Tensor, torch.amp.GradScaler, torch.nn.Linear]:
    """One AMP training step of a tiny model on the CPU; the output and the scaler."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = amp.grad_scaler("cpu", mode)
    with amp.autocast("cpu", mode):
        output = model(torch.randn(16, 8))
    loss = output.float().pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return output, scaler, model


def test_fp16_autocasts_and_scales_the_loss() -> None:
    output, scaler, _model = step("fp16")
    assert output.dtype == torch.float16
    assert scaler.is_enabled()
    assert scaler.get_scale() == 65536.0  # the default initial scale, no overflow yet


def test_fp16_overflow_skips_the_step_and_lowers_the_scale() -> None:
    model = torch.nn.Linear(2, 1)
    before = model.weight.detach().clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = amp.grad_scaler("cpu", "fp16")
    with amp.autocast("cpu", "fp16"):
        loss = model(torch.full((1, 2), float("inf"))).float().sum()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    assert torch.equal(model.weight.detach(), before)
    assert scaler.get_scale() == 32768.0


def test_bf16_autocasts_without_a_scaler() -> None:
    output, scaler, _model = step("bf16")
    assert output.dtype == torch.bfloat16
    assert not scaler.is_enabled()


def test_off_keeps_float32() -> None:
    output, scaler, _model = step("off")
    assert output.dtype == torch.float32
    assert not scaler.is_enabled()


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown AMP mode 'fp8'"):
        amp.autocast("cpu", "fp8")
