"""The plain view (CI logs, nohup) says each rank, when a stalled job last stepped, and a launcher's worker restart.

Issue 37 item 8: it printed one aggregate line, repeated the frozen throughput and ETA through a stall and
never mentioned a torchrun worker restart (--max-restarts). The job is fed events as its ranks write them.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from wizard.monitor.attach import watch_plain
from wizard.monitor.plain import run_plain
from wizard.monitor.plain_lines import COMPACT_AFTER, progress_block, restart_lines
from wizard.monitor.state import JobState
from wizard.monitor.summary_text import progress_line


def event(rank: int, kind: str, at: float, **fields: object) -> dict:
    """One runtime event."""
    return {"schema": 1, "event": kind, "time": at, "rank": rank, **fields}


def training(world_size: int, now: float, *, stepped_at: float = 20.0) -> JobState:
    """Ranks on node 0 that started at t=10 and logged step 4 at `stepped_at`, heartbeating until `now`."""
    state = JobState(world_size, hang_after=10, clock=lambda: now)
    for rank in range(world_size):
        state.ingest(event(rank, "started", 10.0, node=0, pid=1000 + rank, world_size=world_size))
        state.ingest(event(rank, "step", stepped_at, step=4, loss=1.0, samples_per_s=400.0, total_steps=100))
        state.ingest(event(rank, "heartbeat", now - 1, step=4))
    return state


def test_the_plain_view_has_a_line_per_rank_under_the_jobs() -> None:
    state = training(2, now=22.0)
    assert progress_block(state, 12.0, 22.0).splitlines()[1:] == [
        "  rank 0 (node 0): running, step 4, loss 1.0000, 200 samples/s",
        "  rank 1 (node 0): running, step 4, loss 1.0000, 200 samples/s",
    ]


def test_a_stalled_job_says_how_long_ago_it_last_stepped_not_its_frozen_throughput_and_eta() -> None:
    state = training(2, now=65.0)
    head, *ranks = progress_block(state, 55.0, 65.0).splitlines()
    assert head.endswith("2 ranks: stalled 2 | step 4/100 loss 1.0000 | last step 45s ago")
    assert "samples/s" not in head and "ETA" not in head
    assert ranks == [f"  rank {rank} (node 0): stalled, step 4, loss 1.0000, last step 45s ago" for rank in (0, 1)]


def test_a_job_that_steps_still_shows_its_throughput_and_eta() -> None:
    line = progress_line(training(2, now=22.0), 12.0, 22.0)
    assert "| 400 samples/s | ETA" in line and "last step" not in line


def test_many_ranks_are_a_line_per_state_naming_the_ranks() -> None:
    world = COMPACT_AFTER * 2
    late = JobState(world, hang_after=10, clock=lambda: 65.0)
    for rank in range(world):
        late.ingest(event(rank, "started", 10.0, node=rank // 16, world_size=world))
        late.ingest(event(rank, "step", 30.0 if rank == 5 else 64.0, step=3 if rank == 5 else 4))
        late.ingest(event(rank, "heartbeat", 64.5, step=3 if rank == 5 else 4))
    assert progress_block(late, 55.0, 65.0).splitlines()[1:] == [
        "  ranks 0-4, 6-31: running, step 4",
        "  rank 5: stalled, step 3, last step 35s ago",
    ]


def test_a_rank_its_launcher_started_again_is_said_once() -> None:
    state = training(2, now=30.0)
    said: dict[int, int] = {}
    assert restart_lines(state, said) == []
    state.ingest(event(1, "lost", 25.0, pid=1001))
    state.ingest(event(1, "started", 26.0, node=0, pid=2001, world_size=2))
    assert restart_lines(state, said) == [
        "RESTARTED: rank 1 started again by its launcher (worker restart 1, the launcher's --max-restarts)"
    ]
    assert restart_lines(state, said) == []
    assert progress_block(state, 20.0, 30.0).splitlines()[2].endswith(", started again 1x by its launcher")


class TickingJob:
    """A job source that ingests one batch of events per tick (stands in for wizard.run.job.Job)."""

    def __init__(self, run_dir: Path, ticks: list[list[dict]]) -> None:
        self.now = 20.0
        self.run_dir, self.nodes, self.answers, self.notes = run_dir, [0], {"nodes": 1}, []
        self.state, self.engine_lines, self.summary, self.interval = JobState(2, clock=self.clock), [], None, 1.0
        self.started_at, self.ended_at, self.outcome, self.ticks = 10.0, None, None, ticks

    def clock(self) -> float:
        return self.now

    def start(self) -> None:
        """Nothing to start."""

    def tick(self) -> str | None:
        self.now += 1.0
        if not self.ticks:
            self.outcome, self.ended_at = "finished", self.now
            return self.outcome
        self.state.ingest_all(self.ticks.pop(0))
        return None

    def stop(self, outcome: str = "interrupted", signum: int = 2) -> str:
        self.outcome = outcome
        return outcome

    def finished_note(self) -> None:
        return None

    def print_smoke_report(self, out: object) -> None:
        """No smoke run."""


def test_run_plain_prints_each_rank_and_a_worker_restart(tmp_path: Path) -> None:
    started = [event(rank, "started", 11.0, node=0, pid=100 + rank, world_size=2) for rank in (0, 1)]
    stepped = [event(rank, "step", 21.0, step=8, loss=0.5, samples_per_s=64.0) for rank in (0, 1)]
    again = [event(1, "lost", 22.0, pid=101), event(1, "started", 22.5, node=0, pid=201, world_size=2)]
    job = TickingJob(tmp_path, [started + stepped, again, []])
    out = io.StringIO()
    run_plain(job, out=out, poll=0)  # type: ignore[arg-type]
    lines = out.getvalue().splitlines()
    assert "  rank 0 (node 0): running, step 8, loss 0.5000, 32 samples/s" in lines
    assert (
        lines.count("RESTARTED: rank 1 started again by its launcher (worker restart 1, the launcher's --max-restarts)")
        == 1
    )


class SteppedWallClockJob(TickingJob):
    """A job whose runner's ticker advances 0.25 s a tick while its wall clock steps by `step` s at tick 8 (NTP)."""

    def __init__(self, run_dir: Path, step: float, ticks: int = 40) -> None:
        heartbeats = [[event(rank, "heartbeat", 20.0, step=0) for rank in (0, 1)] for _ in range(ticks)]
        super().__init__(run_dir, [[event(rank, "started", 11.0, node=0, world_size=2) for rank in (0, 1)]])
        self.ticks += heartbeats
        self.step, self.ticked, self.monotonic = step, 0, 100.0
        self.state = JobState(2, clock=self.clock, ticker=lambda: self.monotonic)

    def tick(self) -> str | None:
        self.ticked += 1
        self.monotonic += 0.25
        self.now += 0.25 + (self.step if self.ticked == 8 else 0.0)
        if not self.ticks:
            self.outcome, self.ended_at = "finished", self.now
            return self.outcome
        self.state.ingest_all(self.ticks.pop(0))
        return None


class SteppedWallClockFolder:
    """A watched run folder (stands in for attach.RunFolder) on the same two clocks as SteppedWallClockJob."""

    def __init__(self, run_dir: Path, step: float, ticks: int = 40) -> None:
        self.job = SteppedWallClockJob(run_dir, step, ticks)
        self.run_dir, self.notes, self.summary, self.started_at = run_dir, [], None, 10.0
        self.state, self.clock = self.job.state, self.job.clock

    def tick(self) -> str | None:
        return self.job.tick()


@pytest.mark.parametrize("step", [3600.0, -3600.0], ids=["forward-1h", "back-1h"])
def test_a_stepped_wall_clock_neither_spams_nor_silences_the_plain_view(tmp_path: Path, step: float) -> None:
    out = io.StringIO()
    run_plain(SteppedWallClockJob(tmp_path, step), out=out, poll=0)  # type: ignore[arg-type]
    blocks = [line for line in out.getvalue().splitlines() if line.startswith("  rank 0 (node 0):")]
    assert 8 <= len(blocks) <= 11  # 10 ticker seconds, a line a second (and the summary's none)


@pytest.mark.parametrize("step", [3600.0, -3600.0], ids=["forward-1h", "back-1h"])
def test_a_stepped_wall_clock_neither_spams_nor_silences_monitor_plain(tmp_path: Path, step: float) -> None:
    out = io.StringIO()
    watch_plain(SteppedWallClockFolder(tmp_path, step), interval=1.0, out=out, poll=0)  # type: ignore[arg-type]
    blocks = [line for line in out.getvalue().splitlines() if line.startswith("  rank 0 (node 0):")]
    assert 9 <= len(blocks) <= 12
