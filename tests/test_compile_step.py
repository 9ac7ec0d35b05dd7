"""The compiled step of train.py (runtime/compiled.py): compiled, or eager in one line; TorchAir on an NPU.

Compiling costs seconds even for a tiny model on this CPU: these tests trace
with dynamo but compile with a backend that fails on purpose (the rehearsal
NPU_WIZARD_REHEARSE=compile-fails, runtime/rehearsal.py) or with the TorchAir double, never inductor.
tests/test_compile_runs.py has the one real run that compiles.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from runtime import checkpoint, compiled, device, rehearsal
from tests.doubles.torch_npu_double import RECORD_ENV, install_torch_npu_double, load_package


def tiny_step() -> tuple[nn.Module, object]:
    """A one-layer model and its forward-and-loss step."""
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    loss_fn = nn.CrossEntropyLoss()
    return model, lambda inputs, targets: loss_fn(model(inputs), targets)


def test_off_runs_the_step_as_it_is() -> None:
    _model, step = tiny_step()
    run = compiled.CompiledStep(step, "off", "cpu")
    assert not run.compiled and run.fallback is None
    inputs, targets = torch.randn(8, 4), torch.randint(0, 2, (8,))
    assert torch.equal(run(inputs, targets), step(inputs, targets))


def test_a_step_that_cannot_compile_trains_eagerly_said_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(rehearsal.ENV_REHEARSE, "compile-fails")  # the backend raises, as for a model it cannot take
    model, step = tiny_step()
    run = compiled.CompiledStep(step, "default", "cpu")
    assert run.compiled  # torch.compile is lazy: nothing failed yet
    inputs, targets = torch.randn(8, 4), torch.randint(0, 2, (8,))
    loss = run(inputs, targets)
    assert torch.equal(loss, step(inputs, targets))
    loss.backward()
    assert model.weight.grad is not None
    assert not run.compiled
    assert run.fallback == "RuntimeError: this backend always fails (NPU_WIZARD_REHEARSE=compile-fails, a rehearsal)"
    assert capsys.readouterr().err.splitlines() == [
        f"training.compile default: the step did not compile on cpu ({run.fallback}); training eagerly"
    ]
    assert torch.equal(run(inputs, targets), step(inputs, targets))
    assert capsys.readouterr().err == ""  # said once


def test_a_models_own_error_is_raised_from_the_eager_call_not_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(rehearsal.ENV_REHEARSE, "compile-fails")
    _model, step = tiny_step()
    run = compiled.CompiledStep(step, "default", "cpu")
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        run(torch.randn(8, 5), torch.randint(0, 2, (8,)))  # 5 features where the model takes 4


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="expected one of off, default, reduce-overhead"):
        compiled.CompiledStep(lambda: None, "max-autotune", "cpu")


def test_cpu_and_cuda_compile_with_torch_compiles_own_modes() -> None:
    assert compiled.compile_options("default", "cpu") == {}
    assert compiled.compile_options("reduce-overhead", "cuda") == {"mode": "reduce-overhead"}


def test_a_compiled_modules_weights_save_and_load_without_its_prefix(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    wrapped = torch.compile(model)  # lazy: wrapping compiles nothing
    assert next(iter(wrapped.state_dict())).startswith(checkpoint.COMPILED_PREFIX)
    assert checkpoint.unwrap(wrapped) is model
    assert list(checkpoint.unwrap(wrapped).state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    # a checkpoint some script saved from the compiled wrapper loads into the plain module
    torch.save({"model": wrapped.state_dict(), "step": 3}, tmp_path / "step-000000003.pt")
    state = checkpoint.load_checkpoint(tmp_path / "step-000000003.pt")
    fresh = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    fresh.load_state_dict(state["model"])
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values(), strict=True))


def npu_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str, mode: str
) -> tuple[compiled.CompiledStep, list[dict]]:
    """Run a compiled step on the "npu" with the torch_npu double of `version` (tensors stay on the CPU)."""
    double = install_torch_npu_double(tmp_path, version)
    monkeypatch.setenv(RECORD_ENV, str(double.record_dir))
    monkeypatch.setattr(device, "_import_torch_npu", lambda: load_package(tmp_path / "package", version))
    spec = importlib.util.spec_from_file_location("torchair", double.site_dir / "torchair" / "__init__.py")
    assert spec is not None and spec.loader is not None
    torchair = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(torchair)
    monkeypatch.setitem(sys.modules, "torchair", torchair)  # as torch_npu makes `import torchair` find its own
    _model, step = tiny_step()
    run = compiled.CompiledStep(step, mode, "npu")
    inputs, targets = torch.randn(8, 4), torch.randint(0, 2, (8,))
    assert torch.equal(run(inputs, targets), step(inputs, targets))
    return run, double.torchair_calls()


@pytest.mark.parametrize(
    ("mode", "torchair_mode"), [("default", "max-autotune"), ("reduce-overhead", "reduce-overhead")]
)
def test_on_an_npu_the_step_compiles_with_torchair_in_the_matching_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, torchair_mode: str
) -> None:
    run, calls = npu_step(tmp_path, monkeypatch, "2.9.0.post6", mode)  # torch_npu double: no NPU here
    assert run.compiled and run.fallback is None
    assert calls[0] == {"call": "get_npu_backend", "mode": torchair_mode}
    assert [call["call"] for call in calls[1:]] == ["compile"]  # TorchAir's backend got the step's graph


def test_an_npu_torchair_without_reduce_overhead_trains_eagerly_said_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # the 6.0.0 branches' TorchAir has no mode option (the wizard's answers refuse this pair; a run's
    # installed torch_npu may still be older than the answers said)
    run, calls = npu_step(tmp_path, monkeypatch, "2.1.0.post10", "reduce-overhead")
    assert not run.compiled
    assert run.fallback == "ValueError: CompilerConfig has no option mode, all options []"
    assert calls == []
    assert capsys.readouterr().err.splitlines() == [
        "training.compile reduce-overhead: the step did not compile on npu "
        "(ValueError: CompilerConfig has no option mode, all options []); training eagerly"
    ]
    default, calls = npu_step(tmp_path / "default", monkeypatch, "2.1.0.post10", "default")
    assert default.compiled and calls[0] == {"call": "get_npu_backend", "mode": "max-autotune"}


def _backend_failing(*, first_compile: bool = False, backward: bool = False) -> object:
    """A compiler backend (AOT autograd, no inductor) that fails where asked, as TorchAir can."""
    from torch._dynamo.backends.common import aot_autograd

    compiles = []

    def forward_compiler(graph: torch.fx.GraphModule, example_inputs: object) -> object:
        compiles.append(graph)
        if len(compiles) > 1 and not first_compile:
            raise RuntimeError("the recompile failed (a test backend)")
        return graph

    def backward_compiler(graph: torch.fx.GraphModule, example_inputs: object) -> object:
        if backward:
            raise RuntimeError("the backward did not compile (a test backend)")
        return graph

    return aot_autograd(fw_compiler=forward_compiler, bw_compiler=backward_compiler)


def test_a_later_recompile_that_fails_trains_eagerly_instead_of_raising(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(compiled, "compile_options", lambda mode, device_type: {"backend": _backend_failing()})
    model, step = tiny_step()
    run = compiled.CompiledStep(step, "default", "cpu")
    run(torch.randn(8, 4), torch.randint(0, 2, (8,)))
    assert run.compiled
    inputs, targets = torch.randn(5, 4), torch.randint(0, 2, (5,))  # another batch size: a recompile
    loss = run(inputs, targets)
    assert torch.equal(loss, step(inputs, targets))
    assert not run.compiled
    assert run.fallback == "RuntimeError: the recompile failed (a test backend)"
    assert "training eagerly" in capsys.readouterr().err


def test_a_first_backward_that_does_not_compile_reruns_the_step_eagerly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(
        compiled, "compile_options", lambda mode, device_type: {"backend": _backend_failing(backward=True)}
    )
    model, step = tiny_step()
    run = compiled.CompiledStep(step, "default", "cpu")
    inputs, targets = torch.randn(8, 4), torch.randint(0, 2, (8,))
    loss = run(inputs, targets)
    loss = run.backward(loss, lambda loss: loss.backward(), lambda: run(inputs, targets))
    assert not run.compiled
    assert run.fallback == "RuntimeError: the backward did not compile (a test backend)"
    expected_model, expected_step = tiny_step()
    expected_step(inputs, targets).backward()
    assert torch.allclose(model.weight.grad, expected_model.weight.grad)
    assert torch.equal(loss, expected_step(inputs, targets))
    assert "training eagerly" in capsys.readouterr().err
