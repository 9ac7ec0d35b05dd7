"""A rank's memory per logging window: its peak, and the bytes its training state holds.

`window(device, model, optimizer, rank, step)` is called once per logged step
and returns fields for the step event (runtime/events.py's `step_done`):

- `memory_peak_bytes` with `memory_peak_of`, what the figure is. On an NPU or a
  CUDA GPU: `max_memory_allocated` of the rank's device since the last window
  (the caching allocator's peak of live tensors; reset after each read). On the
  CPU there is no allocator to ask: the peak resident set size of the whole
  process (VmHWM), reset per window through /proc/self/clear_refs where the
  kernel allows it ("peak RSS, this window"); where it does not, the peak since
  the process started (ru_maxrss, "peak RSS since start"), which never falls.
  RSS counts everything the process maps (torch itself, loader memory, the
  token file's pages), so it sits above the tensors' own bytes.
- `memory_state_bytes`: the bytes this rank holds of parameters, gradients and
  optimizer state, counted tensor by tensor (its own shard where the model or
  the optimizer is sharded): exact, the same on every device, no
  synchronisation.

Reading costs no host-device synchronisation beyond what the loss read did.
`rank` and `step` say whose window it is (tests/doubles/out_of_memory wraps it).
"""

from __future__ import annotations

import re
import resource
from collections.abc import Iterator
from pathlib import Path
from typing import Any

DEVICE_PEAK = "max_memory_allocated, this window"
RSS_WINDOW = "peak RSS, this window"
RSS_SINCE_START = "peak RSS since start"
STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")
_resets: dict[str, bool] = {}  # whether this process can reset its peak RSS


def window(
    device: Any, model: Any, optimizer: Any, rank: int = 0, step: int = 0
) -> dict[str, Any]:
    """This window's peak and the training state's bytes, for the step event; the peak is reset."""
    peak, of = read_peak(device)
    return {
        "memory_peak_bytes": peak,
        "memory_peak_of": of,
        "memory_state_bytes": state_bytes(model, optimizer),
    }


def read_peak(device: Any) -> tuple[int, str]:
    """(bytes, what they are) of the peak since the last call, then reset where that can be done."""
    kind = getattr(device, "type", str(device))
    if kind in ("npu", "cuda"):
        module = _device_module(kind)
        peak = int(module.max_memory_allocated(device))
        module.reset_peak_memory_stats(device)
        return peak, DEVICE_PEAK
    return _rss_peak()


def _rss_peak() -> tuple[int, str]:
    found = _status_bytes("VmHWM")
    if found is None:
        # ru_maxrss is in KiB on Linux; it cannot be reset
        return resource.getrusage(
            resource.RUSAGE_SELF
        ).ru_maxrss * 1024, RSS_SINCE_START
    if "rss" not in _resets:
        # the first window: is a reset allowed here at all?
        _resets["rss"] = _reset_rss_peak()
    elif _resets["rss"]:
        _reset_rss_peak()
    return found, RSS_WINDOW if _resets["rss"] else RSS_SINCE_START


def _reset_rss_peak() -> bool:
    # "5" resets the peak RSS (VmHWM) to the current RSS (Linux 4.0+, proc(5))
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


def _status_bytes(field: str) -> int | None:
    try:
        text = STATUS.read_text()
    except OSError:
        return None
    found = re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE)
    return int(found.group(1)) * 1024 if found else None


def state_bytes(model: Any, optimizer: Any) -> int:
    """Bytes of this rank's parameters, gradients and optimizer state (its own shards only)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for tensor in _state_tensors(model, optimizer):
        local = _local(tensor)
        size = local.numel() * local.element_size()
        if (local.data_ptr(), size) not in seen:  # a tensor met twice counts once
            seen.add((local.data_ptr(), size))
            total += size
    return total


def _state_tensors(model: Any, optimizer: Any) -> Iterator[Any]:
    import torch

    for parameter in model.parameters():
        yield parameter
        if parameter.grad is not None:
            yield parameter.grad
    # ZeroRedundancyOptimizer keeps this rank's shard in its inner optimizer
    inner = getattr(optimizer, "optim", optimizer)
    for state in inner.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                yield value


def _local(tensor: Any) -> Any:
    # a DTensor (FSDP2) holds only this rank's shard locally
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def _device_module(kind: str) -> Any:
    if kind == "npu":
        from .device import npu_module

        return npu_module()
    import torch

    return torch.cuda
