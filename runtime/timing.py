"""Where a rank's steps go, per logging window: waiting for data, and the forward pass.

The monitor compares these two times across ranks to name a straggler
(wizard/monitor/stragglers.py). Neither phase runs a collective (DDP with
broadcast_buffers=False broadcasts nothing in forward), so neither includes
waiting for another rank; the step as a whole does, since its gradient
all_reduce makes every rank as slow as the slowest.

On the CPU the host clock measures both. On an NPU (or a CUDA GPU) the host
only queues the forward's kernels, so a pair of device events with timing on is
recorded around each forward and read at the window's end, after the loss read
that already synchronises the device: no synchronisation is added. Waiting for
data is host time on every device: the host is what waits for the loader.

A step is an optimizer step: with gradient accumulation (`micro_batches` per
step) both times add up over the step's micro-batches, so ranks compare the
same unit whatever training.grad_accum is.

NPU_WIZARD_STEP_TIMING=0 turns the timing off: the step events then carry
neither time and the loop runs without the timers. A rehearsed hang
(NPU_WIZARD_REHEARSE, runtime/rehearsal.py) still happens at its step then.

Not checked on an NPU (none here; the torch_npu test double records the calls):
that torch.npu.Event(enable_timing=True).elapsed_time gives milliseconds like
CUDA's, that recording events through the task queue (TASK_QUEUE_ENABLE=2)
keeps them in stream order around the forward's kernels, and that the events
are complete after the loss read, so that elapsed_time waits for nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from time import perf_counter
from types import TracebackType
from typing import Any, TypeVar

from . import rehearsal

ENV_STEP_TIMING = "NPU_WIZARD_STEP_TIMING"
DEVICE_TIMED = ("npu", "cuda")  # devices whose forward is timed with device events

Batch = TypeVar("Batch")
_UNTIMED = nullcontext()


def timing_enabled(env: Mapping[str, str] = os.environ) -> bool:
    """Whether the step timing is on: NPU_WIZARD_STEP_TIMING, default 1."""
    return env.get(ENV_STEP_TIMING, "1") != "0"


class StepTimer:
    """Sums one rank's data-wait and forward time between two `window()` calls."""

    def __init__(
        self, device_type: str, *, enabled: bool = True, micro_batches: int = 1
    ) -> None:
        self.enabled = enabled
        self.micro_batches = max(1, micro_batches)  # forwards per optimizer step
        self._device_events: Any = (
            None  # torch.npu or torch.cuda, whose Event the forward is timed with
        )
        if enabled and device_type in DEVICE_TIMED:
            self._device_events = _device_module(device_type)
        self._pairs: list[
            tuple[Any, Any]
        ] = []  # device events, reused window after window
        self._steps = 0  # forwards in this window (micro-batches)
        self._data_s = 0.0
        self._forward_s = 0.0
        self._forward_started = 0.0
        # forwards run and batches fetched by this process, for a rehearsed hang's step
        self._forwards = self._fetched = 0
        self._hang = (
            rehearsal.planned()
        )  # None but in a rehearsal (runtime/rehearsal.py)

    def batches(self, batches: Iterable[Batch]) -> Iterable[Batch]:
        """`batches`, each one's arrival timed as waiting for data."""
        # an epoch's short last group was fetched and never run (no optimizer step): the fetches count
        # on from the forwards run, so a rehearsed data hang stays at its step epoch after epoch
        self._fetched = self._forwards
        watched = self.enabled or self._hang is not None
        return self._timed(batches) if watched else batches

    def _step_of(self, micro_batch: int) -> int:
        """The optimizer step (from 1) that this process's micro-batch (from 0) belongs to."""
        return micro_batch // self.micro_batches + 1

    def _first_of_step(self, micro_batch: int) -> bool:
        """Whether the micro-batch (from 0) is its step's first: a rehearsed hang happens once a step."""
        return micro_batch % self.micro_batches == 0

    def _timed(self, batches: Iterable[Batch]) -> Iterator[Batch]:
        iterator = iter(batches)
        while True:
            started = perf_counter()
            if self._hang is not None and self._first_of_step(self._fetched):
                self._hang.before_batch(self._step_of(self._fetched))
            try:
                batch = next(iterator)
            except StopIteration:
                return
            self._data_s += perf_counter() - started
            self._fetched += 1
            yield batch

    def forward(self) -> AbstractContextManager[Any]:
        """A context around one micro-batch's forward pass (loss included), timed."""
        return self if self.enabled or self._hang is not None else _UNTIMED

    def __enter__(self) -> None:
        if self._device_events is None:
            self._forward_started = perf_counter()
            return
        if self._steps == len(self._pairs):
            timed = self._device_events.Event
            self._pairs.append((timed(enable_timing=True), timed(enable_timing=True)))
        self._pairs[self._steps][0].record()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._device_events is None:
            self._forward_s += perf_counter() - self._forward_started
        else:
            self._pairs[self._steps][1].record()
        self._steps += 1
        self._forwards += 1
        if self._hang is not None and self._first_of_step(self._forwards - 1):
            self._hang.after_forward(self._step_of(self._forwards - 1))

    def window(self) -> dict[str, float]:
        """Mean `data_s` and `forward_s` per optimizer step since the last call, then start afresh.

        Call it after the device was synchronised (the loss read): the device
        events are then complete, and reading them waits for nothing. Empty
        when timing is off or no step ran.
        """
        if not self.enabled or self._steps == 0:
            return {}
        forward_s = self._forward_s
        if self._device_events is not None:
            milliseconds = sum(
                start.elapsed_time(end) for start, end in self._pairs[: self._steps]
            )
            forward_s = milliseconds / 1000
        steps = self._steps / self.micro_batches
        means = {"data_s": self._data_s / steps, "forward_s": forward_s / steps}
        self._steps, self._data_s, self._forward_s = 0, 0.0, 0.0
        return means


def _device_module(device_type: str) -> Any:
    if device_type == "npu":
        from .device import npu_module

        return npu_module()
    import torch

    return torch.cuda
