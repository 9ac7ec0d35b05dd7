"""Each rank's peak memory per logged window, as its step events say, and the ranks far above the others.

The generated train.py adds to each logged step `memory_peak_bytes`, with
`memory_peak_of` saying what it is (runtime/memory.py: the device's
max_memory_allocated of the window, or on the CPU the process's peak RSS), and
`memory_state_bytes` (parameters, gradients and optimizer state). A user's
script that sends none has nothing here: then nothing is shown or written.

A rank whose newest peak stands OUTLIER_RATIO above the median of the others'
newest, and at least OUTLIER_BYTES above it, is flagged, as a straggler is for
time: the same data and model on every rank should need the same memory, so
one rank far above the rest has more to hold (uneven batches, a leak, work of
its own such as rank 0's checkpoint), and is the first to run out. Memory is
bounded: per rank the newest and the highest peak, and HISTORY_KEPT points.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from statistics import median
from typing import Any

from wizard.memory.estimate import gib
from wizard.monitor.values import is_step, number

OUTLIER_RATIO = 1.3
OUTLIER_BYTES = 256 * 2**20
HISTORY_KEPT = 1024  # (step, peak) points per rank for the report's plot


@dataclass(frozen=True)
class MemoryOutlier:
    """A rank whose peak stands far above the other ranks' median."""

    rank: int
    step: int
    peak: int
    median: int

    def words(self) -> str:
        """`rank 3 peaked at 20 GiB at step 40, 1.6x the other ranks' median 12 GiB`."""
        times = self.peak / self.median if self.median else float("inf")
        return (
            f"rank {self.rank} peaked at {gib(self.peak)} at step {self.step}, {times:.1f}x the other ranks' "
            f"median {gib(self.median)} (uneven batches, a leak, or work of its own?)"
        )

    def as_dict(self) -> dict[str, int]:
        """The outlier as summary.json keeps it."""
        return {"rank": self.rank, "step": self.step, "peak_bytes": self.peak, "median_bytes": self.median}


class MemoryPeaks:
    """The ranks' peaks: newest, highest and a short history each; empty for a run that sends none."""

    def __init__(self) -> None:
        self.of: str | None = None  # what the figures are: max_memory_allocated, peak RSS
        self.newest: dict[int, tuple[int, int]] = {}  # rank: (step, bytes)
        self.highest: dict[int, int] = {}
        self.state_bytes: dict[int, int] = {}  # rank: parameters + gradients + optimizer state, newest
        self.history: dict[int, deque[tuple[int, int]]] = {}

    def step_done(self, event: dict) -> None:
        """Keep a step event's peak, when it has one."""
        rank, step, peak = event.get("rank"), event.get("step"), number(event.get("memory_peak_bytes"))
        if not is_step(rank) or not is_step(step) or peak is None or peak < 0:
            return
        self.of = str(event.get("memory_peak_of") or self.of or "peak memory")[:80]
        self.newest[rank] = (step, int(peak))
        self.highest[rank] = max(self.highest.get(rank, 0), int(peak))
        self.history.setdefault(rank, deque(maxlen=HISTORY_KEPT)).append((step, int(peak)))
        held = number(event.get("memory_state_bytes"))
        if held is not None and held >= 0:
            self.state_bytes[rank] = int(held)

    def outliers(self) -> list[MemoryOutlier]:
        """The ranks whose newest peak stands far above the others' median (one other rank is its own median)."""
        found = []
        for rank, (step, peak) in sorted(self.newest.items()):
            others = [bytes_ for other, (_, bytes_) in self.newest.items() if other != rank]
            if not others:
                continue
            middle = int(median(others))
            if peak > middle * OUTLIER_RATIO and peak - middle >= OUTLIER_BYTES:
                found.append(MemoryOutlier(rank, step, peak, middle))
        return found

    def last_peak(self, rank: int) -> tuple[int, int, str] | None:
        """(step, bytes, what they are) of the rank's newest peak, or None."""
        if rank not in self.newest:
            return None
        step, peak = self.newest[rank]
        return step, peak, self.of or "peak memory"

    def cell(self, rank: int) -> str:
        """The live view's cell: the rank's newest peak, `-` before one."""
        return gib(self.newest[rank][1]) if rank in self.newest else "-"

    def summary(self) -> dict[str, Any] | None:
        """The peaks as summary.json keeps them; None for a run that sent none."""
        if not self.newest:
            return None
        return {
            "of": self.of,
            "ranks": {
                str(rank): {
                    "peak_bytes": self.highest[rank],
                    "newest_bytes": self.newest[rank][1],
                    "state_bytes": self.state_bytes.get(rank),
                }
                for rank in sorted(self.newest)
            },
            "outliers": [outlier.as_dict() for outlier in self.outliers()],
        }


def summary_lines(memory: dict[str, Any] | None) -> list[str]:
    """The summary's lines on memory: each rank's highest peak, and the outliers."""
    if not memory or not memory.get("ranks"):
        return []
    ranks = memory["ranks"]
    peaks = ", ".join(
        f"rank {rank} {gib(info['peak_bytes'])}" for rank, info in ranks.items() if is_step(info.get("peak_bytes"))
    )
    lines = [f"memory ({memory.get('of')}), highest per rank: {peaks}"]
    held = {info.get("state_bytes") for info in ranks.values()} - {None}
    if held:
        low, high = min(held), max(held)
        span = gib(low) if low == high else f"{gib(low)} to {gib(high)}"
        lines.append(f"parameters + gradients + optimizer state per rank: {span}")
    for outlier in memory.get("outliers") or []:
        lines.append("memory outlier: " + MemoryOutlier(**_outlier_fields(outlier)).words())
    return lines


def _outlier_fields(entry: dict[str, Any]) -> dict[str, int]:
    return {
        "rank": int(entry.get("rank") or 0),
        "step": int(entry.get("step") or 0),
        "peak": int(entry.get("peak_bytes") or 0),
        "median": int(entry.get("median_bytes") or 0),
    }
