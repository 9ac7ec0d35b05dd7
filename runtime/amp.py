"""Mixed precision: off, fp16 with dynamic loss scaling, or bf16.

The same `torch.autocast(device_type=...)` and `torch.amp.GradScaler(device)`
serve NPU, CUDA and CPU alike, so train.py never names a device.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

MODES = ("off", "fp16", "bf16")
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def autocast(device_type: str, mode: str) -> AbstractContextManager[Any]:
    """The forward pass's autocast context for `mode` (a no-op when AMP is off)."""
    _check(mode)
    if mode == "off":
        return nullcontext()
    return torch.autocast(device_type=device_type, dtype=DTYPES[mode])


def grad_scaler(device_type: str, mode: str) -> torch.amp.GradScaler:
    """A dynamic loss scaler: enabled for fp16, a pass-through otherwise."""
    _check(mode)
    return torch.amp.GradScaler(device_type, enabled=mode == "fp16")


def _check(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"unknown AMP mode {mode!r}: use {', '.join(MODES)}")
