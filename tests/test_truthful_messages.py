"""What `npu-wizard run` and its views say is true of a user's own script (issue 37 item 7).

SIGTERM's line promised a checkpoint from a script that never asks report.should_stop(); a `monitor --stacks`
snapshot was printed and drawn as a hang; the summary said "restarts 0" beside "1 restart of the whole job";
the failure of a stall named every rank where the verdict above it named one; the root cause was printed twice.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from runtime import events, preemption, report
from tests.test_hang_verdict_records import stuck_outside, waiting_in
from tests.test_plain_view import TickingJob, event
from wizard.monitor.hang_verdict import judge
from wizard.monitor.plain import run_plain
from wizard.monitor.state import JobState
from wizard.monitor.stop_text import stop_words
from wizard.monitor.summary_text import format_summary
from wizard.run import hang_stacks
from wizard.run.job_stacks import JobStacks
from wizard.run.verdict import hang_failure, outcome_error
from wizard.run_page.hang_section import hang_section

# ---- SIGTERM: what it does to this script ------------------------------------------------------------


def started(world_size: int) -> JobState:
    """Ranks of a user's script that started at t=10 on node 0."""
    state = JobState(world_size, hang_after=10, clock=lambda: 20.0)
    for rank in range(world_size):
        state.ingest(event(rank, "started", 10.0, node=0, pid=100 + rank, world_size=world_size))
    return state


def test_a_rank_says_once_that_its_script_asks_should_stop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preemption, "_watched", False)
    with events.EventWriter(tmp_path, 0).recording():
        assert report.should_stop() is False
        assert report.should_stop() is False
    written = [json.loads(line) for line in events.events_path(tmp_path, 0).read_text().splitlines()]
    assert [e["event"] for e in written].count("stop_asked") == 1
    state = started(1)
    state.ingest_all(written)
    assert state.ranks[0].asks_stop


def test_sigterm_is_said_to_save_nothing_for_a_script_that_never_asks_unless_it_saves_on_sigterm_itself() -> None:
    said = stop_words(started(2), own_script=True, grace=60)
    assert "save a checkpoint" not in said
    assert said.startswith(
        "stopping: every rank was sent SIGTERM, which reaches your script as it would without npu-wizard: it never "
        "asked report.should_stop(), so no checkpoint is saved on the way unless your script saves on SIGTERM "
        "itself; what still runs in 60 s is killed"
    )


def test_sigterm_is_said_to_have_a_script_that_asks_save() -> None:
    state = started(2)
    state.ingest(event(0, "stop_asked", 12.0))
    assert (
        "rank 0 asked report.should_stop() and save when they next ask, the others never asked and end on the "
        "signal unless your script saves on SIGTERM itself"
    ) in stop_words(state, own_script=True, grace=60)
    state.ingest(event(1, "stop_asked", 12.0))
    assert "so each rank saves when it next asks and exits" in stop_words(state, own_script=True, grace=60)
    generated = stop_words(started(2), own_script=False, grace=60)
    assert generated.startswith("stopping: every rank was sent SIGTERM to save a checkpoint at its next logged step")


# ---- a snapshot asked for is no hang -----------------------------------------------------------------


class StacksOnly(JobStacks):
    """The attributes of wizard.run.job.Job that collecting the stacks reads."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir, self.state, self.intake, self.unwritten = run_dir, JobState(2), None, []
        self.answers = SimpleNamespace(world_size=2)


def test_stacks_asked_for_are_judged_as_asked_not_as_a_hang(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    records = {0: stuck_outside(4), 1: waiting_in(5)}
    monkeypatch.setattr(hang_stacks, "collect", lambda *args, **kwargs: records)
    job = StacksOnly(tmp_path)
    job.collect_stacks("asked", asked_id="1234")
    assert job.hang_verdict is not None and job.hang_verdict.text.startswith("stacks asked: rank 1 waits in")
    job.collect_stacks("hang")
    assert job.hang_verdict.text.startswith("hang: rank 1 waits in")


def asked_snapshot(reason: str) -> dict[str, Any]:
    """summary.json's "hang" of a 2-rank job: rank 0 in its data loading, rank 1 in all_reduce #5."""
    verdict = judge({0: stuck_outside(4), 1: waiting_in(5)}, 1000.0, asked=reason == "asked")
    return {**verdict.as_dict(), "reason": reason, "folder": "hang/", "problems": []}


def test_the_report_draws_an_asked_snapshot_as_such_not_as_a_hang() -> None:
    record = SimpleNamespace(run_dir=Path("/nonexistent"), started_at=990.0, ranks={}, state=JobState(2))
    asked = hang_section(record, {"hang": asked_snapshot("asked")})  # type: ignore[arg-type]
    assert '<h2 id="hang">Where each rank was when the stacks were asked</h2>' in asked
    assert "box failure" not in asked and "at the hang" not in asked
    hang = hang_section(record, {"hang": asked_snapshot("hang")})  # type: ignore[arg-type]
    assert '<h2 id="hang">Where each rank was</h2><div class="box failure">' in hang


# ---- restarts ------------------------------------------------------------------------------------------


def restarted_summary(**fields: Any) -> dict[str, Any]:
    """A finished 2-rank job's summary.json."""
    ranks = {str(rank): {"node": 0, "state": "finished", "step": 96, "loss": 0.5, "restarts": 0} for rank in (0, 1)}
    return {"outcome": "finished", "wall_s": 60.0, "steps": 96, "ranks": ranks, **fields}


def test_a_job_restart_is_one_restart_in_the_header_and_no_rank_says_restarts_0() -> None:
    attempts = [{"attempt": 1, "outcome": "failed", "cause": "rank 1: lost"}, {"attempt": 2, "outcome": "finished"}]
    text = format_summary(restarted_summary(restarts=1, job_restarts=1, attempts=attempts))
    assert ", 96 steps, 1 restart of the whole job" in text.splitlines()[1]
    assert "restarts 0" not in text
    assert "attempts: 2 (1 restart(s) of the whole job)" in text


def test_the_header_tells_a_launchers_worker_restarts_from_the_jobs() -> None:
    summary = restarted_summary(restarts=3, job_restarts=1)
    summary["ranks"]["1"]["restarts"] = 2
    text = format_summary(summary)
    assert text.splitlines()[1].endswith("3 restarts: 1 of the whole job, 2 of ranks by their launcher")
    assert "  rank 1 (node 0): finished, step 96, loss 0.5000, - samples/s, started again 2x by its launcher" in text
    assert format_summary(restarted_summary(restarts=0)).splitlines()[1].endswith(", 96 steps, no restart")


# ---- a stall is laid on the rank the verdict names -----------------------------------------------------


def test_a_stalls_failure_names_the_rank_the_verdict_named_not_every_rank() -> None:
    state = started(2)
    for rank in (0, 1):
        state.ingest(event(rank, "step", 11.0, step=4))
        state.ingest(event(rank, "heartbeat", 29.0, step=4))
    verdict = judge({0: waiting_in(5), 1: stuck_outside(4)}, 30.0)
    failure = hang_failure(state, 30.0, verdict)
    assert failure.rank == 1 and failure.node == 0
    assert "ranks 0, 1" not in failure.summary
    assert failure.headline() == (
        "rank 1 (node 0): the job stalled (no rank made a step for 10s): rank 1 never entered #5: its last "
        "collective is #4 and it is at train.py:118 in load_batch"
    )


# ---- the root cause, once ------------------------------------------------------------------------------


class FailedJob(TickingJob):
    """A job that fails at its first tick: rank 1 vanished."""

    def tick(self) -> str | None:
        self.outcome, self.ended_at = "failed", self.now
        self.summary = restarted_summary(outcome="failed")
        self.summary["failure"] = {"rank": 1, "node": 0, "summary": "its process 101 vanished", "hint": "dmesg"}
        return self.outcome


def test_a_failed_runs_root_cause_is_printed_once(tmp_path: Path) -> None:
    job = FailedJob(tmp_path, [])
    out = io.StringIO()
    run_plain(job, out=out, poll=0)  # type: ignore[arg-type]
    error = outcome_error("failed", "root cause: rank 1 (node 0): its process 101 vanished", tmp_path, None, True)
    printed = out.getvalue() + str(error)
    assert printed.count("its process 101 vanished") == 1, printed
