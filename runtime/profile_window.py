"""A profiling window on chosen ranks, driven by the step calls of the training loop.

`npu-wizard run --profile 20:30 --profile-ranks all|0,3|straggler` passes
NPU_WIZARD_PROFILE and NPU_WIZARD_PROFILE_RANKS to the ranks. A window A:B
records the B - A steps after step A (20:30: steps 21 to 30, as the monitor
counts them) with the device's profiler: torch_npu.profiler on an NPU,
torch.profiler with the CPU (and CUDA, where the job runs on it) elsewhere.
Its schedule waits WAIT step(s) and warms up WARMUP step(s) before the
window, so the trace holds steady steps only.

The generated train.py calls `step(n)` after each step, and so does
runtime.report's `report.step`: a script of your own that reports its steps
is profiled with no other change. With --profile-ranks straggler, the
runner asks {"ask": "profile", "steps": N} down the status stream (the
channel that collects the stacks at a hang) of the flagged rank and a median
rank when the monitor flags a straggler: `request(steps)` starts a window at
the next step.

Traces go into the run folder: profile/rank-<R>/ holds torch.profiler's
chrome trace JSON (rank-<R>.<stamp>.pt.trace.json: Perfetto,
chrome://tracing, and TensorBoard's profile plugin with --logdir
<run>/profile). torch_npu writes each rank's rank-<R>_<stamp>_ascend_pt
folder side by side in profile/ascend/, the layout msprof-analyze -d reads.

Off (no NPU_WIZARD_PROFILE, no request) `step` returns at once, and torch's
profiler is never imported.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import events, status

ENV_PROFILE = "NPU_WIZARD_PROFILE"
ENV_PROFILE_RANKS = "NPU_WIZARD_PROFILE_RANKS"
# set by an NPU project's launch script where its torch_npu parses a window's data in a child process
ENV_ASYNC_PARSE = "NPU_WIZARD_PROFILE_ASYNC_PARSE"
PROFILE_DIR = "profile"
ASCEND_DIR = "ascend"
STRAGGLER = "straggler"
ASK = "profile"  # the runner's ask on the status stream (wizard/run/profile_asks.py)
DEFAULT_STEPS = 10  # a straggler's window, when --profile gives no length
MAX_ASKED_STEPS = 1000  # the longest window an ask may start
WAIT, WARMUP = 1, 1


@dataclass(frozen=True)
class Plan:
    """What the run asked for: a window A:B, on which ranks, or windows on the straggler's ask."""

    first: int  # A: the window records the steps after it ...
    last: int  # B: ... up to this one
    ranks: frozenset[int] | None  # None: every rank
    straggler: bool = False  # windows only on the runner's request
    windows: int = 1  # with straggler: how many the runner may ask for

    @property
    def steps(self) -> int:
        """How many steps a window records."""
        return self.last - self.first

    def records(self, rank: int) -> bool:
        """Whether `rank` records the window A:B itself (not on a request)."""
        return not self.straggler and (self.ranks is None or rank in self.ranks)


def parse_window(text: str) -> tuple[int, int]:
    """A:B as two whole numbers, 1 <= A < B; ValueError saying what is wrong."""
    first, colon, last = text.partition(":")
    if not colon or not (_whole(first) and _whole(last)):
        raise ValueError(
            f"{text!r}: give two step numbers A:B, e.g. 50:60 (the steps after step A up to step B)"
        )
    a, b = int(first), int(last)
    if a < 1 or b <= a:
        raise ValueError(
            f"{text!r}: A must be 1 or more (the first step holds the start-up) and B above A, e.g. 50:60"
        )
    return a, b


def parse_ranks(text: str) -> tuple[frozenset[int] | None, bool, int]:
    """all | 0,3 | straggler | straggler:N as (ranks or None for all, straggler, windows); ValueError if not."""
    if text == "all":
        return None, False, 1
    if text == STRAGGLER or text.startswith(f"{STRAGGLER}:"):
        count = text.partition(":")[2] or "1"
        if not _whole(count) or int(count) < 1:
            raise ValueError(
                f"{text!r}: straggler:N takes a number of windows, 1 or more"
            )
        return None, True, int(count)
    parts = text.split(",")
    if not all(_whole(part) for part in parts):
        raise ValueError(
            f"{text!r}: give all, straggler[:N], or rank numbers separated by commas, e.g. 0,3"
        )
    return frozenset(int(part) for part in parts), False, 1


def plan_from_env(env: Mapping[str, str] = os.environ) -> Plan | None:
    """The run's plan from NPU_WIZARD_PROFILE(_RANKS), or None when it asked for no profiling."""
    window, ranks = env.get(ENV_PROFILE, ""), env.get(ENV_PROFILE_RANKS, "")
    if not window and not ranks:
        return None
    try:
        first, last = parse_window(window) if window else (0, DEFAULT_STEPS)
        chosen, straggler, windows = parse_ranks(ranks or "all")
    except ValueError as error:
        print(
            f"runtime.profile_window: {error}; no profiling",
            file=sys.stderr,
            flush=True,
        )
        return None
    if not window and not straggler:
        return None
    return Plan(first, last, chosen, straggler, windows)


def _whole(text: str) -> bool:
    return text.isascii() and text.isdigit()


class _Recorder:
    """One window: the profiler, and how many step calls are left until its trace is written."""

    def __init__(
        self, rank: int, run_dir: Path, first: int, pre: int, steps: int, reason: str
    ) -> None:
        warmup = min(
            WARMUP, pre
        )  # `pre` steps come before the window: warm-up last, waiting before it
        self.rank, self.reason = rank, reason
        self.first, self.last = first, first + steps
        self.pre = pre
        self.left = pre + steps  # step calls until the schedule has saved the trace
        self.folder = _folder(run_dir, rank)
        self.profiler = _profiler(self.folder, rank, pre - warmup, warmup, steps)
        self.profiler.start()

    def step(self) -> bool:
        """One step ended: advance the schedule; True once the window's trace is written."""
        self.profiler.step()
        self.left -= 1
        if self.left > 0:
            return False
        self.profiler.stop()
        return True

    def cut_short(self) -> None:
        """Stop before the window's end (the training ended): the profiler saves what it recorded."""
        self.profiler.stop()
        # the window's steps that ended before the training did
        recorded = max(0, self.last - self.first - self.left)
        self.last = self.first + recorded


def _folder(run_dir: Path, rank: int) -> Path:
    if _on_npu():
        return run_dir / PROFILE_DIR / ASCEND_DIR
    return run_dir / PROFILE_DIR / f"rank-{rank}"


def _on_npu() -> bool:
    """Whether this process trains on an NPU: it imported torch_npu and an NPU is there."""
    torch_npu = sys.modules.get("torch_npu")
    return torch_npu is not None and bool(torch_npu.npu.is_available())


def _profiler(folder: Path, rank: int, wait: int, warmup: int, active: int) -> Any:
    """The device's profiler over a wait/warmup/active schedule, writing into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    if _on_npu():
        return _npu_profiler(folder, rank, wait, warmup, active)
    import torch
    from torch import profiler

    activities = [profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        activities.append(profiler.ProfilerActivity.CUDA)
    return profiler.profile(
        activities=activities,
        schedule=profiler.schedule(wait=wait, warmup=warmup, active=active, repeat=1),
        on_trace_ready=profiler.tensorboard_trace_handler(
            str(folder), worker_name=f"rank-{rank}"
        ),
    )


def _npu_profiler(folder: Path, rank: int, wait: int, warmup: int, active: int) -> Any:
    """torch_npu.profiler (every offered release has profile, schedule, tensorboard_trace_handler).

    Level1 collects the communication operators msprof-analyze's cluster
    analysis needs. The data is parsed when the window ends, in a child process
    where the release can (async_mode, the 7.0.0 branches on: the launch script
    sets NPU_WIZARD_PROFILE_ASYNC_PARSE=1), else in the rank, which then waits.
    """
    from torch_npu import profiler

    config = profiler._ExperimentalConfig(
        profiler_level=profiler.ProfilerLevel.Level1,
        aic_metrics=profiler.AiCMetrics.PipeUtilization,
        export_type=profiler.ExportType.Text,
    )
    parse = {"async_mode": True} if os.environ.get(ENV_ASYNC_PARSE) == "1" else {}
    return profiler.profile(
        activities=[profiler.ProfilerActivity.CPU, profiler.ProfilerActivity.NPU],
        schedule=profiler.schedule(wait=wait, warmup=warmup, active=active, repeat=1),
        on_trace_ready=profiler.tensorboard_trace_handler(
            str(folder), worker_name=f"rank-{rank}", **parse
        ),
        experimental_config=config,
    )


class _Windows:
    """This process's windows: the planned one, the ones asked for, the one recording."""

    def __init__(self, plan: Plan | None) -> None:
        self.plan = plan
        self.planned_done = plan is None or plan.straggler
        self.asked: int | None = (
            None  # steps of a window asked for, started at the next step
        )
        self.recorder: _Recorder | None = None
        self.lock = threading.Lock()
        # the newest step call's count: where the training was when it ended
        self.done = 0

    def step(self, done: int) -> None:
        self.done = done
        writer = events.current_writer()
        if writer is None:
            return
        if self.recorder is not None:
            if self.recorder.step():
                self._said(writer, self.recorder, "recorded")
                self.recorder = None
            return
        with self.lock:
            asked, self.asked = self.asked, None
        if asked is not None:
            self._start(writer, done, asked, "asked")
        elif not self.planned_done:
            self._planned(writer, done)

    def _planned(self, writer: events.EventWriter, done: int) -> None:
        plan = self.plan
        assert plan is not None
        if not plan.records(writer.rank):
            self.planned_done = True
            return
        if done > plan.first:  # resumed past the window's start
            self.planned_done = True
            events.warn(
                f"profile: rank {writer.rank} is past step {plan.first} (at step {done}), so the window "
                f"{plan.first}:{plan.last} is not recorded",
                "profile",
            )
            return
        if done >= plan.first - WAIT - WARMUP:
            self.planned_done = True
            self._begin(writer, plan.first, done, plan.steps, "planned")

    def _start(
        self, writer: events.EventWriter, done: int, steps: int, reason: str
    ) -> None:
        # the next step warms up, the steps after it are recorded
        self._begin(writer, done + WARMUP, done, steps, reason)

    def _begin(
        self, writer: events.EventWriter, first: int, done: int, steps: int, reason: str
    ) -> None:
        run_dir = writer.path.parent.parent
        try:
            recorder = _Recorder(
                writer.rank, run_dir, first, first - done, steps, reason
            )
        except Exception as error:  # noqa: BLE001 - a profiler that cannot start costs the window, not the run
            events.warn(
                f"profile: rank {writer.rank} cannot start the profiler ({type(error).__name__}: {error})",
                "profile",
            )
            return
        self.recorder = recorder

    def close(self) -> None:
        recorder, self.recorder = self.recorder, None
        writer = events.current_writer()
        if writer is None:
            return
        if recorder is None:
            self._never_reached(writer)
            return
        recorder.cut_short()
        self._said(writer, recorder, "cut short: the training ended first")

    def _never_reached(self, writer: events.EventWriter) -> None:
        """Say that the planned window of this rank lay past the training's end."""
        plan = self.plan
        if self.planned_done or plan is None or not plan.records(writer.rank):
            return
        self.planned_done = True
        events.warn(
            f"profile: the training ended at step {self.done}, before the window "
            f"{plan.first}:{plan.last}: rank {writer.rank} recorded nothing",
            "profile",
        )

    @staticmethod
    def _said(writer: events.EventWriter, recorder: _Recorder, outcome: str) -> None:
        writer.emit(
            "profile",
            first=recorder.first,
            last=recorder.last,
            path=str(recorder.folder),
            reason=recorder.reason,
            outcome=outcome,
        )


def _asked(ask: Mapping[str, Any]) -> dict[str, Any]:
    """The runner's {"ask": "profile", "steps": N} on the status stream: a window from the next step."""
    steps = ask.get("steps")
    steps = steps if isinstance(steps, int) and steps > 0 else DEFAULT_STEPS
    steps = min(
        steps, MAX_ASKED_STEPS
    )  # a window is a look at a few steps, never the rest of the run
    request(steps)
    return {"steps": steps}


_windows: _Windows | None = None
_plan = plan_from_env()
if _plan is not None:
    _windows = _Windows(_plan)
    if _plan.straggler:  # the runner asks when the monitor flags a straggler
        status.on_ask(ASK, _asked)


def step(done: int) -> None:
    """Step `done` of this rank ended: start, advance or end a window (nothing at all when none is asked for)."""
    if _windows is None:
        return
    try:
        _windows.step(done)
    except Exception as error:  # noqa: BLE001 - profiling never stops the training
        _give_up(error)


def request(steps: int) -> None:
    """Record a window of `steps` steps from the next step (the runner asks, e.g. for a straggler); thread-safe."""
    global _windows
    windows = _windows
    if windows is None:
        windows = _windows = _Windows(None)
    with windows.lock:
        windows.asked = max(1, int(steps))


def close() -> None:
    """The training ended: a window still recording is stopped and its trace written."""
    if _windows is None:
        return
    try:
        _windows.close()
    except Exception as error:  # noqa: BLE001 - profiling never stops the training
        _give_up(error)


def _give_up(error: BaseException) -> None:
    """Profiling failed: say so once and profile no more in this process."""
    global _windows
    _windows = None
    events.warn(
        f"profile: no more profiling in this rank ({type(error).__name__}: {error})",
        "profile",
    )
