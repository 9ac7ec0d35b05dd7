"""The hang clock is the runner's monotonic clock, and a repeat is known by its number: an NTP step moves neither.

Issue 36 item 20. The ranks stamp their events with their own wall clock, and so does node 0's stream; a host's
clock stepped back an hour made every later event look like a repeat (dropped), one stepped forward made every
rank silent for an hour (hung, and with --abort-on-hang or --restarts a healthy job killed). Here the wall clock
is a double that steps when told (tests/test_status_clock_steps.py); the ranks' events carry `pid` and `seq` as
runtime/events.py writes them. First the state alone with a ticker double, then the runner's own state hearing
ranks on a real socket, then a monitor reading a run folder's files.
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import pytest

from tests.runs import render_cpu, wait_for
from tests.test_status_clock_steps import HOUR, SteppedWallClock
from tests.test_status_stream import AUTH, TOKEN, connect, wire
from wizard.monitor.attach import RunFolder
from wizard.monitor.state import HUNG, RUNNING, JobState
from wizard.monitor.status_server import StatusServer
from wizard.run.job import Job
from wizard.run.launch import RunOptions

# Mostly waiting (on a deadline, a socket, another process), little CPU: run early (tests/conftest.py)
pytestmark = pytest.mark.waits


class Ticker:
    """A monotonic clock double that moves only when the test says."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class RankProcess:
    """One rank's process: its events numbered 1, 2, ... and stamped with `wall`, as runtime/events.py does."""

    def __init__(self, rank: int, pid: int, wall: SteppedWallClock) -> None:
        self.rank, self.pid, self.wall, self.seq = rank, pid, wall, 0

    def event(self, kind: str, **fields: object) -> dict:
        """Its next event."""
        self.seq += 1
        return {"schema": 1, "event": kind, "time": self.wall(), "rank": self.rank, "pid": self.pid, "seq": self.seq}


def started(process: RankProcess, world_size: int) -> dict:
    """The rank's `started` event."""
    return {**process.event("started"), "world_size": world_size, "node": 0}


def stepped(process: RankProcess, step: int) -> dict:
    """A step event of the rank."""
    return {**process.event("step"), "step": step, "epoch": 0, "loss": 1.0 / step, "samples_per_s": 100.0}


# ---- the state alone ------------------------------------------------------------------------------------


@pytest.mark.parametrize("step", [-HOUR, HOUR], ids=["backward", "forward"])
def test_a_clock_step_while_ranks_report_drops_no_event_and_hangs_no_rank(step: float) -> None:
    wall, ticker = SteppedWallClock(step), Ticker()
    state = JobState(2, hang_after=10, clock=wall, ticker=ticker, nodes=1)
    ranks = [RankProcess(rank, 4000 + rank, wall) for rank in range(2)]
    for process in ranks:
        state.ingest(started(process, 2))
    for number in range(1, 41):
        ticker.now += 1.0
        if number == 10:
            wall.jump()  # every host's clock: the ranks' stamps and the runner's own
        assert state.hung() == [] and not state.stalled()  # judged between two events too
        for process in ranks:
            state.ingest(stepped(process, number))
        assert state.hung() == [] and not state.stalled()
    assert [state.state(rank) for rank in range(2)] == [RUNNING, RUNNING]
    assert [len(state.ranks[rank].losses) for rank in range(2)] == [40, 40]  # not one step taken for a repeat
    assert [state.ranks[rank].step for rank in range(2)] == [40, 40]


def test_a_rank_that_stops_reporting_is_hung_one_deadline_later_on_the_ticker_whatever_the_wall_clock() -> None:
    wall, ticker = SteppedWallClock(-HOUR), Ticker()
    state = JobState(2, hang_after=10, clock=wall, ticker=ticker, nodes=1)
    ranks = [RankProcess(rank, 4000 + rank, wall) for rank in range(2)]
    for process in ranks:
        state.ingest(started(process, 2))
        state.ingest(stepped(process, 1))
    wall.jump()
    for number in range(2, 12):  # rank 1 says nothing more
        ticker.now += 1.0
        state.ingest(stepped(ranks[0], number))
    assert state.hung() == []  # silent for exactly the deadline: not yet
    ticker.now += 0.5
    state.ingest(stepped(ranks[0], 12))
    assert state.hung() == [1]
    assert "rank 1 (node 0) is hung: no heartbeat or step for 10s" in state.hang_report()


def test_the_start_up_deadline_counts_on_the_ticker() -> None:
    wall, ticker = SteppedWallClock(HOUR), Ticker()
    state = JobState(2, hang_after=10, clock=wall, ticker=ticker, nodes=1, start_deadline=60.0)
    state.ingest(started(RankProcess(0, 4000, wall), 2))
    wall.jump()
    assert state.late() == []  # an hour of wall time is no hour of waiting
    ticker.now += 61.0
    assert state.late() == [1]


def test_the_same_numbered_event_from_the_file_and_the_stream_counts_once_and_a_new_process_counts_again() -> None:
    wall, ticker = SteppedWallClock(-HOUR), Ticker()
    state = JobState(1, hang_after=10, clock=wall, ticker=ticker, nodes=1)
    first = RankProcess(0, 4000, wall)
    state.ingest(started(first, 1))
    step = stepped(first, 1)
    state.ingest(step)
    state.ingest({**step, "received": wall() + 0.1})  # the same event again, from node 0's stream
    assert len(state.ranks[0].losses) == 1
    wall.jump()
    again = RankProcess(0, 4001, wall)  # the launcher started the rank again: its numbers start at 1 again
    state.ingest(started(again, 1))
    state.ingest(stepped(again, 1))
    assert state.ranks[0].restarts == 1 and len(state.ranks[0].losses) == 2


def test_events_of_an_older_runtime_without_numbers_are_still_told_apart_by_their_time() -> None:
    state = JobState(1, hang_after=10, clock=lambda: 50.0, nodes=1)
    old = [{"schema": 1, "event": "step", "time": at, "rank": 0, "step": step, "loss": 1.0} for at, step in [(20, 1)]]
    state.ingest({"schema": 1, "event": "started", "time": 10.0, "rank": 0, "world_size": 1})
    state.ingest(old[0])
    state.ingest({**old[0], "received": 20.1})  # the stream's copy
    state.ingest({**old[0], "time": 19.0, "step": 2})  # older than the newest step: taken for a repeat, as before
    assert len(state.ranks[0].losses) == 1 and state.ranks[0].step == 1


# ---- the runner's state, hearing ranks on its status stream ----------------------------------------------


def runner_hearing(tmp_path: Path, wall: SteppedWallClock) -> tuple[Job, StatusServer]:
    """A Job of a 1 x 2 CPU project on the stepping wall clock, its status stream open; nothing started."""
    job = Job(render_cpu(tmp_path, "shell"), RunOptions(hang_after=1.0), clock=wall)
    server = StatusServer("127.0.0.1", 0, TOKEN, clock=wall)
    job.intake.server = server
    return job, server


@pytest.mark.parametrize("step", [-HOUR, HOUR], ids=["backward", "forward"])
def test_the_runner_hears_every_event_through_a_clock_step_and_hangs_only_the_rank_that_stops(
    tmp_path: Path, step: float
) -> None:
    wall = SteppedWallClock(step)
    job, server = runner_hearing(tmp_path, wall)
    ranks = [RankProcess(rank, 5000 + rank, wall) for rank in range(2)]
    clients = [connect(server, AUTH, wire(started(process, 2))) for process in ranks]
    try:
        steps = 0
        begun = time.monotonic()
        while time.monotonic() - begun < 3.0:  # three hang deadlines, the step in the middle
            steps += 1
            if steps == 10:
                wall.jump()
                job.intake.ingest()
                assert job.state.hung() == [], job.state.hang_report()  # judged between two events too
            for client, process in zip(clients, ranks, strict=True):
                client.sendall(wire(stepped(process, steps)))
            quiet_since = time.monotonic()  # rank 1's last word: it is heard after this
            time.sleep(0.1)
            job.intake.ingest()
            assert job.state.hung() == [] and not job.state.stalled(), job.state.hang_report()
        wait_for(lambda: job.intake.ingest() or job.state.ranks[1].step == steps, 30, "every step heard")
        assert [len(job.state.ranks[rank].losses) for rank in range(2)] == [steps, steps]

        def rank_1_hung() -> bool:
            clients[0].sendall(wire(stepped(ranks[0], job.state.ranks[0].step + 1)))
            job.intake.ingest()
            return job.state.hung() == [1]

        wait_for(rank_1_hung, 30, "rank 1, silent, to be judged hung", step=0.05)
        assert time.monotonic() - quiet_since > 1.0  # one deadline of the monotonic clock, no sooner
        assert job.state.state(0) == RUNNING
    finally:
        for client in clients:
            client.close()
        server.close()


# ---- a monitor reading the run folder's files ------------------------------------------------------------


def append(run_dir: Path, *events: dict) -> None:
    """Write events as a rank's EventWriter would."""
    for event in events:
        path = run_dir / "events" / f"rank-{event['rank']}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as handle:
            handle.write(json.dumps(event) + "\n")


@pytest.mark.parametrize("step", [-HOUR, HOUR], ids=["backward", "forward"])
def test_a_monitor_judges_by_when_it_first_read_each_event(tmp_path: Path, step: float) -> None:
    wall = SteppedWallClock(step)
    ranks = [RankProcess(rank, 6000 + rank, wall) for rank in range(2)]
    append(tmp_path, *(started(process, 2) for process in ranks))
    folder = RunFolder(tmp_path, hang_after=1.0, clock=wall)
    steps = 0
    begun = time.monotonic()
    while time.monotonic() - begun < 3.0:
        steps += 1
        if steps == 10:
            wall.jump()
            assert folder.state.hung() == [], folder.state.hang_report()  # judged between two reads too
        append(tmp_path, *(stepped(process, steps) for process in ranks))
        quiet_since = time.monotonic()  # rank 1's last word: the monitor reads it after this
        time.sleep(0.1)
        folder.tick()
        assert folder.state.hung() == [] and not folder.state.stalled(), folder.state.hang_report()
    assert [len(folder.state.ranks[rank].losses) for rank in range(2)] == [steps, steps]
    going_on = itertools.count(steps + 1)

    def rank_1_hung() -> bool:
        append(tmp_path, stepped(ranks[0], next(going_on)))
        folder.tick()
        return folder.state.hung() == [1]

    wait_for(rank_1_hung, 30, "rank 1, silent, to be judged hung", step=0.05)
    assert time.monotonic() - quiet_since > 1.0


def test_a_monitor_opened_on_a_rank_silent_for_long_judges_it_hung_at_once(tmp_path: Path) -> None:
    wall = SteppedWallClock(0.0)
    rank = RankProcess(0, 7000, wall)
    append(tmp_path, {**started(rank, 1), "time": time.time() - 600}, {**stepped(rank, 1), "time": time.time() - 590})
    folder = RunFolder(tmp_path, hang_after=30.0)
    assert folder.state.state(0) == HUNG  # what was there before it opened is as old as its stamps say
