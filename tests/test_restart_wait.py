"""Between two attempts the runner starts again as soon as the failed node is free (no process of the job, npu-smi
listing none of its pids, the master port free), never after a fixed wait; a deadline ends a node that stays busy."""

from __future__ import annotations

from pathlib import Path

import pytest

from wizard.monitor.ranks import Failure
from wizard.monitor.state import JobState
from wizard.run import job_restarts
from wizard.run.attempts import HEALTH_DEADLINE_S, Attempts
from wizard.run.job_restarts import JobRestarts


class NoSpares:
    """The host plan of a job without spare hosts: no remote health to read."""

    def remote_health(self, engine: object, launch: object) -> dict[int, list[str]]:
        return {}

    def can_replace(self, remote: object) -> bool:
        return False


class LocalEngine:
    def local_nodes(self) -> list[int]:
        return [0]


class RestartingJob(JobRestarts):
    """The attributes of `Job` that the restart path reads, with clocks the test moves.

    `now` is the monotonic clock the wait is judged on; `wall` the wall clock, which steps only where a test says.
    """

    def __init__(self, tmp_path: Path) -> None:
        self.now = 10.0
        self.wall = 1_800_000_000.0
        self.ticker = lambda: self.now
        self.clock = lambda: self.wall
        self.attempts = Attempts(2, clock=self.clock, ticker=self.ticker)
        self.state = JobState(1, nodes=1)
        self.run_dir = tmp_path
        self.answers = {"network.master_port": 29500, "network.master_addr": "127.0.0.1"}
        self.engine = LocalEngine()
        self.submitted_launch = object()
        self.hosts = NoSpares()
        self.started: list[int] = []
        self.ended: list[Failure | None] = []

    def _start_again(self, number: int, health: object) -> None:
        self.started.append(number)

    def _end(self, outcome: str, failure: Failure | None) -> str:
        self.ended.append(failure)
        return outcome


def failed_job(tmp_path: Path) -> RestartingJob:
    job = RestartingJob(tmp_path)
    job.attempts.failed(Failure(0, 0, 10.0, "vanished", "its process 11 vanished"), job.state, job.now)
    return job


def test_the_job_starts_again_the_moment_its_node_is_free(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(job_restarts, "node_health", lambda *args, **kwargs: [])
    job = failed_job(tmp_path)
    job._restart_when_healthy()
    assert job.started == [2]


def test_the_job_waits_while_npu_smi_lists_its_old_pids_then_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    busy = ["npu-smi shows process(es) 11 of this job on its devices"]
    monkeypatch.setattr(job_restarts, "node_health", lambda *args, **kwargs: busy)
    job = failed_job(tmp_path)
    job.now = 10.0 + HEALTH_DEADLINE_S - 1
    job._restart_when_healthy()
    assert job.started == [] and job.ended == []
    busy = []
    job._restart_when_healthy()
    assert job.started == [2]


def test_a_node_busy_past_the_deadline_ends_the_job_naming_what_stayed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(job_restarts, "node_health", lambda *args, **kwargs: ["the master port 29500 is still taken"])
    job = failed_job(tmp_path)
    job.now = 10.0 + HEALTH_DEADLINE_S
    job._restart_when_healthy()
    assert job.started == []
    (failure,) = job.ended
    assert "was not healthy again in time: the master port 29500 is still taken" in failure.summary


@pytest.mark.parametrize("step", [3600.0, -3600.0], ids=["forward", "backward"])
def test_a_wall_clock_step_neither_ends_the_wait_nor_holds_the_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: float
) -> None:
    """Issue 36 item 20: before, the wait ran on the wall clock: an NTP step forward ended a job whose node was
    still busy at once ("not healthy again in time"); a step back held a free node's restart for the hour."""
    busy = ["npu-smi shows process(es) 11 of this job on its devices"]
    monkeypatch.setattr(job_restarts, "node_health", lambda *args, **kwargs: busy)
    job = failed_job(tmp_path)
    job.wall += step
    job.now += 1.0
    job._restart_when_healthy()
    assert job.started == [] and job.ended == []  # still waiting: 1 s of the deadline gone, whatever the wall says
    busy = []
    job._restart_when_healthy()
    assert job.started == [2]


def test_the_live_view_words_say_which_attempt_runs_or_what_the_restart_waits_for() -> None:
    state = JobState(1, nodes=1)
    lost = Failure(0, 0, 10.0, "vanished", "its process 11 vanished")
    attempts = Attempts(2, clock=lambda: 0.0)
    assert attempts.words(1.0) == ""
    assert attempts.failed(lost, state, 10.0) == HEALTH_DEADLINE_S
    assert attempts.words(10.5) == (
        "attempt 1 failed: restarting once the failed node is free of the job's processes (0/2 used)"
    )
    attempts.started_again(14.0)
    assert attempts.words(15.0) == "attempt 2 (1/2 restart(s) used)"
