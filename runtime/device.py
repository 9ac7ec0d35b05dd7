"""Device and collective backend: NPU with HCCL, CUDA with NCCL, CPU with gloo.

`select_device` decides what a rank runs on and says why; `bind_device` makes
the rank's own device current (one process per device). torch_npu is imported
only here, and only when an NPU is asked for or probed.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from . import cann
from .errors import DeviceError

REQUESTS = ("npu", "auto", "cpu")
BACKENDS = {"npu": "hccl", "cuda": "nccl", "cpu": "gloo"}
ENV_DEVICE = "NPU_WIZARD_DEVICE"


@dataclass(frozen=True)
class DeviceChoice:
    """The device type a job runs on, its collective backend, and why it was chosen."""

    type: str
    backend: str
    reason: str


def requested_device(
    flag: str | None,
    default: str,
    env: Mapping[str, str] = os.environ,
) -> str:
    """The device asked for: the --device flag, else NPU_WIZARD_DEVICE, else the answers'."""
    for source, value in (("--device", flag), (ENV_DEVICE, env.get(ENV_DEVICE))):
        if value:
            if value not in REQUESTS:
                choices = ", ".join(REQUESTS)
                raise DeviceError(f"{source}={value!r} is not a device: use {choices}")
            return value
    return default


def select_device(requested: str) -> DeviceChoice:
    """The device for `requested` (npu, auto or cpu); raise DeviceError when npu is unusable."""
    if requested == "cpu":
        return DeviceChoice("cpu", BACKENDS["cpu"], "simulation on the CPU, as asked")
    if requested == "npu":
        count = _probe_npu()
        return DeviceChoice("npu", BACKENDS["npu"], f"{count} NPU(s) visible")
    if requested != "auto":
        choices = ", ".join(REQUESTS)
        raise DeviceError(f"unknown device {requested!r}: use {choices}")
    try:
        count = _probe_npu()
    except DeviceError as error:
        why_not_npu = str(error).split(":", 1)[0]
    else:
        return DeviceChoice("npu", BACKENDS["npu"], f"auto: {count} NPU(s) visible")
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        reason = f"auto: no usable NPU ({why_not_npu}); {count} CUDA device(s) visible"
        return DeviceChoice("cuda", BACKENDS["cuda"], reason)
    reason = f"auto: no usable NPU ({why_not_npu}) and no CUDA device; using the CPU"
    return DeviceChoice("cpu", BACKENDS["cpu"], reason)


def bind_device(
    choice: DeviceChoice,
    local_rank: int,
    local_world_size: int = 1,
) -> torch.device:
    """Make this rank's device current and return it (`npu:N` for local rank N)."""
    if choice.type == "cpu":
        # torchrun sets OMP_NUM_THREADS=1; other launchers would oversubscribe cores
        if "OMP_NUM_THREADS" not in os.environ:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world_size))
        return torch.device("cpu")
    module = npu_module() if choice.type == "npu" else torch.cuda
    count = module.device_count()
    if local_rank >= count:
        raise DeviceError(
            f"local rank {local_rank} needs {choice.type} device {local_rank} but only "
            f"{count} are visible: one process per device, so lower --nproc-per-node "
            "or check ASCEND_RT_VISIBLE_DEVICES"
        )
    module.set_device(local_rank)
    return torch.device(f"{choice.type}:{local_rank}")


def use_binary_kernels(choice: DeviceChoice) -> bool:
    """On NPUs, run precompiled (binary) kernels instead of compiling operators online; True when set.

    A2 and A3 default to binary kernels; the Atlas training series compiles
    online unless told (torch_npu's set_compile_mode), which Huawei's scripts do.
    """
    if choice.type != "npu":
        return False
    _import_torch_npu().npu.set_compile_mode(jit_compile=False)
    return True


def npu_module() -> Any:
    """`torch.npu` (registered by torch_npu), importing torch_npu on first use."""
    torch_npu = _import_torch_npu()
    return getattr(torch, "npu", None) or torch_npu.npu


def torch_npu_module() -> ModuleType:
    """The torch_npu package itself (its amp scaler, its version), imported on first use."""
    return _import_torch_npu()


def explain_torch_npu_error(error: BaseException) -> str:
    """A clear cause and fix for an error raised while loading torch_npu."""
    text = f"{type(error).__name__}: {error}"
    if isinstance(error, ModuleNotFoundError) and error.name == "torch_npu":
        return (
            "torch_npu is not installed: install the torch-npu release that pairs "
            f"with torch {torch.__version__.split('+')[0]} (see requirements.txt), "
            f"or simulate on the CPU with --device cpu or {ENV_DEVICE}=cpu"
        )
    if "Two accelerators cannot be used at the same time" in text:
        return (
            "torch is a build for another accelerator and torch_npu cannot share it: "
            "install the CPU build of torch (pip install torch==X.Y.Z+cpu --index-url "
            f"https://download.pytorch.org/whl/cpu), then torch-npu ({text})"
        )
    if "Failed to load the backend extension" in text:
        return (
            "torch failed to auto-load torch_npu: set TORCH_DEVICE_BACKEND_AUTOLOAD=0 "
            "to stop the auto-load, or fix the torch_npu install (torch and torch_npu "
            f"versions must pair) ({text})"
        )
    if "libhccl.so" in text or "set_env.sh" in text:
        found, tried = cann.find_set_env("", os.environ)
        source = (
            f"`source {found}`"
            if found
            else f"`source` your CANN's set_env.sh (none at {', '.join(tried)})"
        )
        return (
            "CANN is not sourced: import torch_npu could not load libhccl.so; run "
            f"{source} first; the launch scripts do it for you ({text})"
        )
    return f"import torch_npu failed: check the CANN and torch_npu install ({text})"


def _probe_npu() -> int:
    try:
        module = npu_module()
    except (ImportError, OSError, RuntimeError) as error:
        raise DeviceError(explain_torch_npu_error(error)) from error
    count = module.device_count() if module.is_available() else 0
    if count == 0:
        visible = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
        hint = f"ASCEND_RT_VISIBLE_DEVICES={visible}" if visible else "npu-smi info"
        raise DeviceError(
            "no NPU visible: torch_npu loaded but sees no device; check the driver "
            f"and {hint}, or use --device cpu to simulate"
        )
    return count


def _import_torch_npu() -> ModuleType:
    # the one place torch_npu is imported: tests replace it with a double
    return importlib.import_module("torch_npu")
