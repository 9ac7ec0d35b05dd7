"""Device and backend selection: NPU with HCCL, CUDA with NCCL, CPU with gloo.

No NPU exists on the test machine, so the NPU branch runs against
FakeTorchNpuRecorder, a test double of torch_npu that records the calls the
runtime makes. Everything else (torch_npu missing, CPU) is real.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import NoReturn

import pytest

from runtime import device
from runtime.errors import DeviceError

REPO = Path(__file__).resolve().parent.parent


class FakeTorchNpuRecorder:
    """Test double of torch_npu (no NPU exists here): `.npu` records set_device calls."""

    def __init__(self, count: int = 8) -> None:
        self.calls: list[tuple[str, tuple[object, ...]]] = []
        self.npu = SimpleNamespace(
            is_available=lambda: count > 0,
            device_count=lambda: count,
            set_device=lambda index: self.calls.append(("set_device", (index,))),
        )


def raising(error: BaseException) -> Callable[[], NoReturn]:
    """An import seam that fails the way a broken install does."""

    def fail() -> NoReturn:
        raise error

    return fail


def test_cpu_takes_gloo() -> None:
    choice = device.select_device("cpu")
    assert (choice.type, choice.backend) == ("cpu", "gloo")
    assert device.bind_device(choice, local_rank=1) == device.torch.device("cpu")


def test_a_cpu_rank_without_omp_num_threads_takes_its_share_of_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    # the suite sets OMP_NUM_THREADS=1 for its runs (tests/conftest.py): the rule for a launcher that sets none
    before = device.torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        monkeypatch.setattr(device.os, "cpu_count", lambda: 8)
        device.bind_device(device.select_device("cpu"), local_rank=0, local_world_size=2)
        assert device.torch.get_num_threads() == 4
        device.bind_device(device.select_device("cpu"), local_rank=0, local_world_size=16)
        assert device.torch.get_num_threads() == 1
        monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's (or torchrun's) own setting is left alone
        device.bind_device(device.select_device("cpu"), local_rank=0, local_world_size=2)
        assert device.torch.get_num_threads() == 1
    finally:
        device.torch.set_num_threads(before)


def test_flag_beats_environment_beats_answers() -> None:
    env = {"NPU_WIZARD_DEVICE": "auto"}
    assert device.requested_device("cpu", "npu", env) == "cpu"
    assert device.requested_device(None, "npu", env) == "auto"
    assert device.requested_device(None, "npu", {}) == "npu"


def test_an_unknown_device_in_the_environment_is_refused() -> None:
    with pytest.raises(DeviceError, match=r"NPU_WIZARD_DEVICE='gpu' is not a device: use npu, auto, cpu"):
        device.requested_device(None, "npu", {"NPU_WIZARD_DEVICE": "gpu"})


def test_strict_npu_without_torch_npu_says_it_is_not_installed() -> None:
    # real: torch_npu is not installed on this machine
    with pytest.raises(DeviceError, match=r"^torch_npu is not installed: .*--device cpu"):
        device.select_device("npu")


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (
            ImportError(
                "libhccl.so: cannot open shared object file: No such file or directory. "
                "Please run 'source set_env.sh' in the CANN installation path."
            ),
            r"^CANN is not sourced: .*`source` your CANN's set_env.sh \(none at /usr/local/Ascend/cann/set_env.sh, "
            r"/usr/local/Ascend/ascend-toolkit/set_env.sh, ",
        ),
        (
            RuntimeError("Failed to load the backend extension: torch_npu. You can disable extension auto-loading"),
            r"^torch failed to auto-load torch_npu: set TORCH_DEVICE_BACKEND_AUTOLOAD=0",
        ),
        (
            RuntimeError("ERR00007 Two accelerators cannot be used at the same time."),
            r"^torch is a build for another accelerator .*install the CPU build of torch",
        ),
    ],
    ids=["cann-not-sourced", "autoload-failed", "two-accelerators"],
)
def test_strict_npu_explains_a_broken_torch_npu(
    error: BaseException, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(device, "_import_torch_npu", raising(error))
    with pytest.raises(DeviceError, match=expected) as caught:
        device.select_device("npu")
    assert caught.value.__cause__ is error


def test_strict_npu_with_no_visible_device_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device, "_import_torch_npu", lambda: FakeTorchNpuRecorder(count=0))
    monkeypatch.delattr(device.torch, "npu", raising=False)
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "0,1")
    with pytest.raises(DeviceError, match=r"^no NPU visible: .*ASCEND_RT_VISIBLE_DEVICES=0,1"):
        device.select_device("npu")


def test_auto_falls_back_to_cpu_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device.torch.cuda, "is_available", lambda: False)
    choice = device.select_device("auto")
    assert (choice.type, choice.backend) == ("cpu", "gloo")
    assert choice.reason == "auto: no usable NPU (torch_npu is not installed) and no CUDA device; using the CPU"


def test_auto_takes_an_npu_when_torch_npu_works(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device, "_import_torch_npu", lambda: FakeTorchNpuRecorder(count=2))
    monkeypatch.delattr(device.torch, "npu", raising=False)
    choice = device.select_device("auto")
    assert (choice.type, choice.backend, choice.reason) == ("npu", "hccl", "auto: 2 NPU(s) visible")


NPU_BRANCH = textwrap.dedent(
    """
    import json
    import torch
    from runtime import device
    from tests.test_runtime_device import FakeTorchNpuRecorder

    # torch_npu renames torch's out-of-tree device to "npu"; the double cannot
    torch.utils.rename_privateuse1_backend("npu")
    double = FakeTorchNpuRecorder(count=4)
    device._import_torch_npu = lambda: double
    choice = device.select_device("npu")
    bound = device.bind_device(choice, local_rank=3, local_world_size=4)
    print(json.dumps({"type": choice.type, "backend": choice.backend,
                      "device": str(bound), "calls": double.calls}))
    """
)


def test_npu_branch_sets_each_rank_device_and_picks_hccl() -> None:
    result = subprocess.run([sys.executable, "-c", NPU_BRANCH], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome == {"type": "npu", "backend": "hccl", "device": "npu:3", "calls": [["set_device", [3]]]}


def test_a_local_rank_beyond_the_visible_npus_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device, "_import_torch_npu", lambda: FakeTorchNpuRecorder(count=2))
    monkeypatch.delattr(device.torch, "npu", raising=False)
    choice = device.DeviceChoice("npu", "hccl", "test")
    with pytest.raises(DeviceError, match=r"local rank 2 needs npu device 2 but only 2 are visible"):
        device.bind_device(choice, local_rank=2)
