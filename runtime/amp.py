"""Mixed precision: off, fp16 with dynamic loss scaling, or bf16.

`torch.autocast(device_type=...)` serves NPU, CUDA and CPU alike. The fp16
loss scaler depends on the device: on an NPU it is torch_npu's own
`torch_npu.npu.amp.GradScaler` (Ascend 910 has no inf/nan mode; that scaler
reads the device's overflow flag and all-reduces it so every rank skips the
same step); on CUDA and the CPU it is the scaler the installed torch has.
"""

from __future__ import annotations

import functools
import warnings
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

MODES = ("off", "fp16", "bf16")
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def autocast(device_type: str, mode: str) -> AbstractContextManager[Any]:
    """The forward pass's autocast context for `mode` (a no-op when AMP is off)."""
    _check(mode)
    if mode == "off" or (device_type == "cpu" and not autocast_computes_in(mode)):
        return nullcontext()  # old torch refuses CPU fp16 autocast: simulate in float32
    return torch.autocast(device_type=device_type, dtype=DTYPES[mode])


def grad_scaler(device_type: str, mode: str) -> Any:
    """A dynamic loss scaler for fp16, a pass-through otherwise (same interface either way)."""
    _check(mode)
    enabled = mode == "fp16"
    if device_type == "npu":
        from . import device

        return device.torch_npu_module().npu.amp.GradScaler(enabled=enabled)
    if hasattr(torch.amp, "GradScaler"):  # torch 2.3 and later
        return torch.amp.GradScaler(device_type, enabled=enabled)
    if device_type == "cuda":
        return torch.cuda.amp.GradScaler(enabled=enabled)
    # torch before 2.3 has no CPU scaler (and no CPU fp16 autocast): scale nothing
    return torch.cuda.amp.GradScaler(enabled=False)


def restore_scaler(scaler: Any, state: dict[str, Any]) -> None:
    """Load a checkpoint's scaler state; a state another device's scaler saved fits too.

    A disabled scaler saves nothing: then the scale starts afresh. torch_npu's
    scaler also needs `dynamic`, which torch's does not save (it is always dynamic).
    """
    if not state or not scaler.is_enabled():
        return
    if "dynamic" in scaler.state_dict() and "dynamic" not in state:
        state = {**state, "dynamic": True}
    scaler.load_state_dict(state)


def simulation_note(device_type: str, mode: str) -> str | None:
    """What a CPU run of `mode` really exercises with the installed torch (None off the CPU)."""
    _check(mode)
    if device_type != "cpu" or mode == "off":
        return None
    version = torch.__version__.split("+")[0]
    if not autocast_computes_in(mode):
        return (
            f"AMP {mode} on the CPU: torch {version} has no CPU {mode} autocast, so this "
            "simulation computes in float32 and scales no loss; it runs the code path only"
        )
    if mode == "bf16":
        return (
            f"AMP bf16 on the CPU: torch {version} autocasts to bfloat16; "
            "the numerics follow the CPU's kernels, not an NPU's"
        )
    if grad_scaler("cpu", mode).is_enabled():
        scaler = "its loss scaler skips a step when the CPU's gradients overflow"
    else:
        scaler = "no loss is scaled (this torch has no CPU loss scaler)"
    return (
        f"AMP fp16 on the CPU: torch {version} autocasts to float16 and {scaler}; an NPU's "
        "scaler (torch_npu's, reading the device's overflow flag) is not simulated"
    )


@functools.cache
def autocast_computes_in(mode: str) -> bool:
    """Whether CPU autocast of the installed torch really computes in `mode`'s dtype."""
    if mode == "off":
        return True
    probe = torch.ones(2, 2)
    try:
        with warnings.catch_warnings():
            # some releases warn and disable the dtype instead of refusing it
            warnings.simplefilter("ignore")
            with torch.autocast(device_type="cpu", dtype=DTYPES[mode]):
                return torch.mm(probe, probe).dtype == DTYPES[mode]
    except RuntimeError:  # torch 2.1: "AutocastCPU only support Bfloat16"
        return False


def _check(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"unknown AMP mode {mode!r}: use {', '.join(MODES)}")
