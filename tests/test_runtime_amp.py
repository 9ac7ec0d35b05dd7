"""Mixed precision: fp16 with a dynamic loss scaler, bf16 without one.

On the CPU everything is real. The NPU scaler comes from the torch_npu test
double (tests/doubles): no NPU exists here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from runtime import amp, checkpoint, device
from tests.doubles.torch_npu_double import load_package

# torch 2.3 brought torch.amp.GradScaler, the CPU's loss scaler; torch 2.1 has neither
# that nor CPU fp16 autocast
CPU_FP16 = hasattr(torch.amp, "GradScaler")
needs_cpu_fp16 = pytest.mark.skipif(not CPU_FP16, reason="this torch has no CPU fp16 autocast or scaler")


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


@needs_cpu_fp16
def test_fp16_autocasts_and_scales_the_loss() -> None:
    output, scaler, _model = step("fp16")
    assert output.dtype == torch.float16
    assert scaler.is_enabled()
    assert scaler.get_scale() == 65536.0  # the default initial scale, no overflow yet


@needs_cpu_fp16
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


@pytest.mark.skipif(CPU_FP16, reason="this torch simulates fp16 on the CPU")
def test_fp16_on_an_old_torchs_cpu_runs_float32_unscaled_and_says_so() -> None:
    output, scaler, _model = step("fp16")
    assert output.dtype == torch.float32
    assert not scaler.is_enabled()
    version = torch.__version__.split("+")[0]
    assert amp.simulation_note("cpu", "fp16") == (
        f"AMP fp16 on the CPU: torch {version} has no CPU fp16 autocast, so this simulation "
        "computes in float32 and scales no loss; it runs the code path only"
    )


@needs_cpu_fp16
def test_fp16_on_the_cpu_says_what_is_simulated_and_what_is_not() -> None:
    version = torch.__version__.split("+")[0]
    assert amp.simulation_note("cpu", "fp16") == (
        f"AMP fp16 on the CPU: torch {version} autocasts to float16 and its loss scaler skips a "
        "step when the CPU's gradients overflow; an NPU's scaler (torch_npu's, reading the "
        "device's overflow flag) is not simulated"
    )


def test_no_simulation_note_off_the_cpu_or_without_amp() -> None:
    assert amp.simulation_note("npu", "fp16") is None
    assert amp.simulation_note("cpu", "off") is None


@pytest.fixture(params=["2.1.0.post10", "2.9.0.post6"])
def torch_npu_double(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> object:
    """The torch_npu double of a release, as the runtime's `import torch_npu` would give it."""
    package = load_package(tmp_path, request.param)
    monkeypatch.setattr(device, "_import_torch_npu", lambda: package)
    return package


def test_fp16_on_npu_takes_torch_npus_own_scaler(torch_npu_double: object) -> None:
    scaler = amp.grad_scaler("npu", "fp16")
    assert isinstance(scaler, torch_npu_double.npu.amp.GradScaler)
    assert scaler.calls == [
        {
            "call": "__init__",
            "init_scale": 2.0**16,
            "growth_factor": 2.0,
            "backoff_factor": 0.5,
            "growth_interval": 2000,
            "dynamic": True,
            "enabled": True,
        }
    ]


def test_bf16_on_npu_gets_a_disabled_npu_scaler(torch_npu_double: object) -> None:
    scaler = amp.grad_scaler("npu", "bf16")
    assert isinstance(scaler, torch_npu_double.npu.amp.GradScaler)
    assert not scaler.is_enabled()


def test_the_npu_scalers_state_comes_back_from_a_checkpoint(torch_npu_double: object, tmp_path: Path) -> None:
    scaler = amp.grad_scaler("npu", "fp16")
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler.scale(model(torch.full((1, 2), float("inf"))).sum()).backward()
    scaler.step(optimizer)
    scaler.update()  # an overflow: the scale halves
    path = checkpoint.save_checkpoint(tmp_path / "ckpt", 1, {"scaler": scaler.state_dict()})
    resumed = amp.grad_scaler("npu", "fp16")
    amp.restore_scaler(resumed, checkpoint.load_checkpoint(path)["scaler"])
    assert resumed.get_scale() == 2.0**15
    assert resumed.state_dict() == scaler.state_dict()
    assert resumed.state_dict()["dynamic"] is True


@needs_cpu_fp16
def test_an_npu_run_resumes_from_a_cpu_runs_scaler_state(torch_npu_double: object, tmp_path: Path) -> None:
    saved = amp.grad_scaler("cpu", "fp16").state_dict()  # torch's scaler saves no `dynamic`
    path = checkpoint.save_checkpoint(tmp_path / "ckpt", 1, {"scaler": saved})
    resumed = amp.grad_scaler("npu", "fp16")
    amp.restore_scaler(resumed, checkpoint.load_checkpoint(path)["scaler"])
    assert resumed.state_dict()["dynamic"] is True
    assert resumed.get_scale() == saved["scale"]


def test_a_disabled_scalers_empty_state_starts_the_scale_afresh(torch_npu_double: object) -> None:
    resumed = amp.grad_scaler("npu", "fp16")
    amp.restore_scaler(resumed, {})
    assert resumed.get_scale() == 2.0**16
