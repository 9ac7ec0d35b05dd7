"""Steps, loss and checkpoints from a script of your own, for npu-wizard's monitor.

    from runtime import report

    waited = time.perf_counter()
    for step, (inputs, targets) in enumerate(loader, start=1):
        data_s = time.perf_counter() - waited  # waiting for the batch
        began = time.perf_counter()
        loss = loss_fn(model(inputs), targets)
        forward_s = time.perf_counter() - began  # the forward pass, no collective in it
        ...  # backward, optimizer step
        report.step(step, loss=loss, samples=len(inputs), data_s=data_s, forward_s=forward_s,
                    total_steps=epochs * len(loader))
        waited = time.perf_counter()
    report.checkpoint(step, path)
    if report.should_stop_together():  # a rank got SIGUSR1 or SIGTERM: all save at this step, then
        sys.exit(report.PREEMPTED_EXIT)

`should_stop()` answers for this rank alone: a rank that stops on it leaves
its peers waiting in the next collective. `should_stop_together()` is one
all_reduce of a flag, so every rank must call it at the same step.

Under npu-wizard (the launch scripts start the script through
runtime.userscript) each call feeds the rank's events as the generated
train.py does: the step, the loss, samples per second and, with
`total_steps`, the ETA. Outside npu-wizard every call returns at once.
The step calls also drive `npu-wizard run --profile` (runtime/profile_window.py):
a script that calls report.step is profiled with no other change.

A step event is written about once per NPU_WIZARD_REPORT_S seconds (default
1), with the newest loss, the window's throughput and its mean data and
forward times. `loss` may be a tensor: it is read (a host-device
synchronisation) only when an event is written.

Without `data_s` and `forward_s` the straggler detector has nothing to
compare, and the summary says the stragglers were not judged.

Every rank writes at the same steps, so that the monitor can compare their
windows (wizard/monitor/stragglers.py matches them by step): an event is
written at the first call past a multiple of a stride, a power of two sized
from the last window to about the interval. Ranks in one DDP job step
together and so pick the same stride; where two ranks' picks differ, the
coarser one's steps are still steps of the finer. Where step numbers start
again (a script counting per epoch) an event is written at once and the
stride is kept; where steps slow down so much that no multiple comes for
OVERDUE (4) intervals, an event is written anyway. A call between
events costs a clock read and an integer division.
"""

from __future__ import annotations

import contextlib
import math
import operator
import os
import time
from pathlib import Path
from typing import Any

from . import events, preemption, profile_window

ENV_REPORT_S = "NPU_WIZARD_REPORT_S"
DEFAULT_REPORT_S = 1.0
OVERDUE = 4  # an event is written anyway this many intervals after the last
# a step or a count at or past this is dropped: the monitor does arithmetic on them in floats and JSON
LARGEST = 2**63
# exit with this after saving on should_stop(): npu-wizard reads it as "preempted, checkpoint saved"
PREEMPTED_EXIT = preemption.PREEMPTED_EXIT


class _Window:
    """What the calls since the last step event add up to."""

    def __init__(self, writer: events.EventWriter) -> None:
        self.writer = writer
        self.every_s = _seconds(os.environ.get(ENV_REPORT_S), DEFAULT_REPORT_S)
        self.world_size = _count(os.environ.get("WORLD_SIZE"), 1)
        self.emitted_at: float | None = None  # when the last step event was written
        self.emitted_step: int | None = None  # the step it was written at
        self.stride = (
            1  # an event at the first call past a multiple of this (a power of two)
        )
        self.started_at = 0.0  # where the window's time and samples count from
        self.pending = False  # a call not written yet
        self.step = 0
        self.loss: Any = None
        self.total_steps: int | None = None
        self.samples = 0
        self.calls = 0
        self.data_s = self.forward_s = 0.0
        self.data_calls = self.forward_calls = 0

    def add(
        self,
        step: int,
        loss: Any,
        samples: int | None,
        data_s: float | None,
        forward_s: float | None,
        total_steps: int | None,
    ) -> None:
        self.step, self.pending, self.calls = step, True, self.calls + 1
        if loss is not None:
            detach = getattr(
                loss, "detach", None
            )  # a tensor: keep no autograd graph alive
            self.loss = detach() if detach is not None else loss
        if samples is not None and self.emitted_at is not None:
            self.samples += (
                samples  # the first call's samples took a time nobody measured
            )
        if data_s is not None:
            self.data_s, self.data_calls = self.data_s + data_s, self.data_calls + 1
        if forward_s is not None:
            self.forward_s += forward_s
            self.forward_calls += 1
        if total_steps is not None:
            self.total_steps = total_steps
        self.writer.progress(step, self.writer.epoch)
        last, now = self.emitted_step, time.perf_counter()
        # at a multiple of the stride; at counting again (steps per epoch: every rank
        # does at this step); or when steps slowed down past the stride
        if (
            last is None
            or step // self.stride != last // self.stride
            or step < last
            or now - self.emitted_at >= OVERDUE * self.every_s
        ):
            self.emit(now)

    def emit(self, now: float) -> None:
        fields: dict[str, Any] = {"step": self.step}
        if self.loss is not None:
            # a tensor's own conversion may raise anything (more than one element, a device error)
            try:
                fields["loss"] = float(self.loss)
            except Exception as error:  # noqa: BLE001 - dropped with a warning: the hook never raises
                _dropped("loss", self.loss, error)
        if self.samples and self.emitted_at is not None and now > self.started_at:
            # the job's rate as this rank sees it, as train.py reports it
            rate = self.samples * self.world_size / (now - self.started_at)
            if math.isfinite(rate):
                fields["samples_per_s"] = rate
        if self.data_calls:
            fields["data_s"] = self.data_s / self.data_calls
        if self.forward_calls:
            fields["forward_s"] = self.forward_s / self.forward_calls
        if self.total_steps is not None:
            fields["total_steps"] = self.total_steps
        self.writer.emit("step", **fields)
        self._resize(now)
        self.emitted_at = self.started_at = now
        self.emitted_step = self.step
        self.pending, self.samples, self.calls, self.loss = False, 0, 0, None
        self.data_s = self.forward_s = 0.0
        self.data_calls = self.forward_calls = 0

    def _resize(self, now: float) -> None:
        """Size the stride from the window just written: the power of two of steps nearest below the interval.

        It at most doubles per event (a first window of one quick step says little)
        and shrinks at once when steps slow down.
        """
        if self.emitted_at is None or self.emitted_step is None:
            return
        if (
            self.step < self.emitted_step
        ):  # counting again: its steps unknown, its pace not
            return
        steps, elapsed = self.step - self.emitted_step, now - self.emitted_at
        fit = steps * self.every_s / elapsed if elapsed > 0 else float("inf")
        stride = 1
        while stride * 2 <= min(fit, self.stride * 2):
            stride *= 2
        self.stride = stride


_window: _Window | None = None


def _current() -> _Window | None:
    global _window
    writer = events.current_writer()
    if writer is None:
        return None
    if _window is None or _window.writer is not writer:
        _window = _Window(writer)
    return _window


def step(
    step: int,
    *,
    loss: Any = None,
    samples: int | None = None,
    data_s: float | None = None,
    forward_s: float | None = None,
    total_steps: int | None = None,
) -> None:
    """This rank finished `step`: its loss, the samples it processed since the last call, times spent.

    `data_s` and `forward_s`: seconds this step waited for data and spent in
    the forward pass (the monitor compares them across ranks). `total_steps`:
    the steps of the whole run, for the ETA.
    """
    global _window
    window = _window
    if window is None or window.writer is not events.current_writer():
        window = _current()
        if window is None:
            return
    whole = _whole(step)
    if whole is None:
        _dropped("step", step, None)
        return
    try:
        window.add(
            whole,
            loss,
            _number("samples", samples),
            _number("data_s", data_s),
            _number("forward_s", forward_s),
            _count_of("total_steps", total_steps),
        )
    except Exception as error:  # noqa: BLE001 - the hook never raises into the training loop
        _dropped("step call", step, error)
        _window = None  # a fresh window from the next call: nothing half added is kept
        return
    profile_window.step(whole)  # a window of --profile, when one is asked for


def checkpoint(step: int, path: str | os.PathLike[str]) -> None:
    """This rank wrote a checkpoint of `step` to `path` (a relative path counts from the working folder)."""
    window = _current()
    if window is None:
        return
    whole = _whole(step)
    if whole is None:
        _dropped("checkpoint step", step, None)
        return
    try:
        where = Path(os.path.abspath(path))
    except Exception as error:  # noqa: BLE001 - no path: None, a number, a NUL in it, a raising __fspath__
        _dropped("checkpoint path", path, error)
        return
    try:
        window.writer.checkpoint(step=whole, path=where)
    except Exception as error:  # noqa: BLE001 - a full disk, say: the hook never raises into the training loop
        _dropped("checkpoint", step, error)


def should_stop() -> bool:
    """True once SIGUSR1 or SIGTERM reached this rank (Slurm's warning before the time limit, a stop).

    Under npu-wizard (runtime.userscript) the signal is only noted once the
    script has asked this at least once: save a checkpoint, then exit with
    PREEMPTED_EXIT. A script that never asks, or sets its own handler for
    the signal, is not changed: the signal does what it did before.
    """
    return preemption.should_stop()


def should_stop_together(device: Any = None) -> bool:
    """True on every rank once any rank got SIGUSR1 or SIGTERM: call it at the same step on every rank.

    One all_reduce (MAX) of one integer, on `device` (by default the one the
    process group's backend speaks: the current NPU for hccl, CUDA for nccl,
    the CPU for gloo). Without a process group, or with one rank, it is
    `should_stop()`. A rank that learns it here stops as if it got the signal.
    """
    preemption.should_stop()  # asking, so a signal is noted from now on, not fatal
    return (
        preemption.agree(_collective_device() if device is None else device) is not None
    )


def _collective_device() -> Any:
    """The device the default process group's collectives take tensors on."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return "cpu"
    backend = str(dist.get_backend())
    if backend == "hccl":
        from .device import npu_module

        return torch.device("npu", npu_module().current_device())
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return "cpu"


def flush() -> None:
    """Write the step event the last calls have not written yet (runtime.userscript does, at the end)."""
    window = _window
    if (
        window is not None
        and window.pending
        and window.writer is events.current_writer()
    ):
        try:
            window.emit(time.perf_counter())
        except Exception as error:  # noqa: BLE001 - the hook never raises into the user's code
            _dropped("step", window.step, error)


def _seconds(value: str | None, default: float) -> float:
    try:
        return max(0.0, float(value)) if value else default
    except ValueError:
        return default


def _count(value: str | None, default: int) -> int:
    return int(value) if value and value.isdigit() and value.isascii() else default


def _whole(value: Any) -> int | None:
    """`value` as a whole number the monitor can take (below LARGEST either way), else None."""
    if type(value) is not int:
        try:
            value = operator.index(value)  # numpy and 0-d tensor integers too
        except Exception:  # noqa: BLE001 - a user's __index__ may raise anything: no whole number
            return None
    return value if -LARGEST < value < LARGEST else None


def _number(name: str, value: Any) -> float | int | None:
    """`value` as a finite number, else None with a warning (None stays None, without one)."""
    if value is None or (type(value) in (int, float) and -LARGEST < value < LARGEST):
        return value
    try:
        number = float(value)
    except Exception as error:  # noqa: BLE001 - dropped with a warning: the hook never raises
        _dropped(name, value, error)
        return None
    if not math.isfinite(number) or abs(number) >= LARGEST:
        _dropped(name, value, None)
        return None
    return number


def _count_of(name: str, value: Any) -> int | None:
    """`value` as a whole number, else None with a warning (None stays None, without one)."""
    if value is None:
        return None
    whole = _whole(value)
    if whole is None:
        _dropped(name, value, None)
    return whole


_warned: set[str] = set()  # the arguments a warning was given for: one each per process


def _dropped(name: str, value: Any, error: BaseException | None) -> None:
    """Say once per argument that a value runtime.report could not take was left out."""
    if name in _warned:
        return
    _warned.add(name)
    shown = _shown(value)
    why = f" ({type(error).__name__}: {error})" if error is not None else ""
    text = f"runtime.report: {name}={shown} cannot be recorded{why}; it is left out (this warning is given once)"
    # events.warn prints it first: where the events file then cannot take it (a full disk), the output has it
    with contextlib.suppress(OSError):
        events.warn(text, "report")


def _shown(value: Any) -> str:
    """A short repr of a value of the user's, whatever its size."""
    try:
        text = repr(value)
    except Exception as error:  # noqa: BLE001 - a repr of the user's may raise: shown as such
        text = f"<{type(value).__name__}: repr failed: {type(error).__name__}>"
    return text if len(text) <= 60 else f"{text[:40]}...({len(text)} characters)"
