"""One rank as its events describe it (`RankView`), its loss history, and a `Failure` that names who failed and why."""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field

from wizard.monitor.hints import Hint
from wizard.monitor.values import is_step

LOSS_HISTORY = 256  # loss points kept per rank: the plot shows 120


class LossHistory:
    """A rank's newest losses, oldest first, in one fixed block of memory (no object per point)."""

    def __init__(self, size: int | None) -> None:
        self.size = size  # None keeps every point
        self._values = array("d")
        self._start = 0

    def append(self, value: float) -> None:
        """Add the newest loss, dropping the oldest when full."""
        if self.size is None or len(self._values) < self.size:
            self._values.append(value)
        else:
            self._values[self._start] = value
            self._start = (self._start + 1) % self.size

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self) -> Iterator[float]:
        yield from self._values[self._start :]
        yield from self._values[: self._start]

    def newest(self, count: int) -> list[float]:
        """The newest `count` losses, oldest first."""
        return list(self)[-count:]


@dataclass
class RankView:
    """One rank, as its events describe it."""

    rank: int
    node: int | None = None
    host: str | None = None
    device: str | None = None  # as the rank reported it: npu:3, cpu
    pid: int | None = None
    world_size: int | None = None
    step: int = 0
    epoch: int = 0
    loss: float | None = None
    samples_per_s: float | None = None  # this rank's own samples, not the job's
    total_steps: int | None = None
    starts: int = 0
    resumed_step: int = 0
    started_at: float | None = None
    started_heard: float | None = None  # when its newest start was heard, on the state's clock (JobState.now)
    ended_heard: float | None = None  # when its process was found gone, on the state's clock
    first_step_at: float | None = None
    first_step: int | None = None  # the step its first step event named (a user's script resumed one before)
    last_seen: float | None = None  # when it was last heard, on the state's clock (JobState.now)
    last_said: float | None = None  # the same in wall time, for people: its newest event's stamp or arrival
    progress_at: float | None = None  # when its step last changed, on the state's clock
    ended_at: float | None = None
    outcome: str | None = None  # finished, failed (an error event), lost (the process vanished) or preempted
    stop_signal: str | None = None  # the signal a preempted rank saved on
    asks_stop: bool = False  # its script asked report.should_stop(): a stop signal has it save, not end
    error: dict | None = None
    checkpoint: tuple[int, str, float] | None = None  # the newest this rank wrote: step, path, time
    printed_at: float | None = None  # when its log last grew, on the state's clock (runtime.userscript's heartbeats)
    exit_code: int | None = None  # as its finished or error event said (runtime.userscript)
    compute_s: float | None = None  # its newest window's data_s + forward_s (a straggler's median rank by it)
    losses: LossHistory = field(default_factory=lambda: LossHistory(LOSS_HISTORY))
    rate_count: int = 0  # step events with a positive rate, and the sum of 1/rate: the overall rate, in O(1)
    inverse_rate_sum: float = 0.0
    step_times: list[tuple[float, int]] = field(default_factory=list)
    newest: dict[str, float] = field(default_factory=dict)  # per event kind: the newest time (events without seq)
    # per (process, event kind): the highest event number ingested (runtime/events.py numbers them)
    newest_seq: dict[tuple[int, str], int] = field(default_factory=dict)

    def repeats(self, kind: str, event: dict) -> bool:
        """Whether `event` (of `kind`) was seen already, in the file or on the stream; notes it as seen if not.

        A process writes its events numbered in order, so one numbered no higher than the highest of its kind
        from that process is a repeat, whatever the clocks did. An older runtime's events carry no number:
        there one no newer than the newest of its kind is (a clock stepped back loses events, as it did then).
        """
        seq, pid = event.get("seq"), event.get("pid")
        if is_step(seq) and is_step(pid):
            key = (pid, kind)
            if seq <= self.newest_seq.get(key, -1):
                return True
            self.newest_seq[key] = seq
            return False
        at = event["time"]
        if at <= self.newest.get(kind, float("-inf")):
            return True
        self.newest[kind] = at
        return False

    @property
    def restarts(self) -> int:
        """How often the launcher started this rank again."""
        return max(0, self.starts - 1)

    @property
    def steps_reported(self) -> bool:
        """True once the rank sent a step event; a user's script without runtime.report never does."""
        return self.first_step_at is not None

    @property
    def overall_rate(self) -> float | None:
        """This rank's samples per second over the run (each step event covers the same samples)."""
        return self.rate_count / self.inverse_rate_sum if self.rate_count else None


@dataclass(frozen=True)
class Failure:
    """Why a rank stopped: its error, or that its process vanished, with a hint."""

    rank: int | None
    node: int | None
    time: float
    kind: str  # error, vanished, hung, launcher
    summary: str
    traceback: str = ""
    hint: Hint | None = None
    device: str | None = None  # the rank's device (npu:3), when it said
    pid: int | None = None
    memory_peak: tuple[int, int, str] | None = None  # its newest logged peak: step, bytes, what they are

    @property
    def secondary(self) -> bool:
        """True when the error says another rank failed first."""
        return self.hint is not None and self.hint.caused_by_peer

    def headline(self) -> str:
        """One line naming the rank (and node) and what happened."""
        return f"{where(self.rank, self.node)}: {self.summary}"


def where(rank: int | None, node: int | None) -> str:
    """Who failed: `rank 3 (node 1)`, `node 1's launcher` (no rank: its agent or script) or `the job`."""
    if rank is None:
        return f"node {node}'s launcher" if node is not None else "the job"
    return f"rank {rank} (node {node})" if node is not None else f"rank {rank}"
