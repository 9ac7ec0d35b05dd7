"""`npu-wizard run --restarts N`: the whole job started again after a failure a restart can fix.

Real processes on 127.0.0.1, gloo on the CPU, the manual engine. The 2 x 2 run
is shared by the tests that read it (one kill, one restart); the others run one
rank of a user's own script, which is cheap.
"""

from __future__ import annotations

import html
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.runs import (
    RunEnded,
    clean_up,
    events_of,
    kinds,
    leftover_processes,
    npu_wizard_run_plain,
    render_cpu,
    render_own_one_rank,
    run_dirs,
    start_runner,
    wait_for,
)
from wizard.monitor.ranks import Failure
from wizard.monitor.state import JobState
from wizard.monitor.summary_text import format_summary, summarize
from wizard.run.attempts import Attempts, node_health
from wizard.run.job import Job

pytestmark = pytest.mark.slow

START_S = 240
STEPS = 16384 // 16 // 4  # samples / batch / world size, one epoch: 256 steps a rank


def summary_of(run_dir: Path) -> dict:
    """The summary.json the runner wrote at the end."""
    return json.loads((run_dir / "summary.json").read_text())


def checkpoint_pid(run_dir: Path) -> int | None:
    """Rank 3's pid once node 1 (its local rank 0, rank 2) wrote a checkpoint, else None."""
    found = events_of(run_dir)
    if not kinds(found.get(2, []), "checkpoint") or not kinds(found.get(3, []), "started"):
        return None
    return kinds(found[3], "started")[-1]["pid"]


@pytest.fixture(scope="module")
def killed_once_run(tmp_path_factory: pytest.TempPathFactory) -> RunEnded:
    """`npu-wizard run --restarts 1` of a 2 x 2 torchrun project whose rank 3 is SIGKILLed after a checkpoint."""
    project = render_cpu(tmp_path_factory.mktemp("killed-once"), "torchrun", nodes=2, samples=16384, epochs=1)
    runner = start_runner(project, "--interval", "2", "--restarts", "1")
    try:
        run_dir = wait_for(lambda: run_dirs(project), 60, "the run folder")[0]
        os.kill(wait_for(lambda: checkpoint_pid(run_dir), START_S, "node 1's first checkpoint"), signal.SIGKILL)
        output, _ = runner.communicate(timeout=2 * START_S)
        left = leftover_processes(project)
    finally:
        clean_up(project, runner)
    return RunEnded(project, run_dir, runner.returncode, output, "", left)


def attempt_of(events: list[dict], number: int) -> list[dict]:
    """A rank's events of its `number`th start (each attempt opens with a `started` event)."""
    starts = [i for i, event in enumerate(events) if event.get("event") == "started"]
    bounds = [*starts, len(events)]
    return events[bounds[number - 1] : bounds[number]]


@pytest.mark.xdist_group("killed-once-run")
def test_a_rank_killed_after_a_checkpoint_restarts_the_job_once_from_it_to_the_planned_steps(
    killed_once_run: RunEnded,
) -> None:
    run = killed_once_run
    assert run.code == 0, run.stdout
    assert run.left == []
    found = events_of(run.run_dir)
    # the newest step both nodes saved before the kill: what every rank can load
    saved = [{e["step"] for e in kinds(attempt_of(found[rank], 1), "checkpoint")} for rank in (0, 2)]
    newest = max(saved[0] & saved[1])
    for rank in range(4):
        started = kinds(found[rank], "started")
        assert len(started) == 2, rank
        assert started[1]["resumed_step"] == newest > 0
        assert kinds(attempt_of(found[rank], 2), "finished"), rank  # every rank finished in the second attempt
    summary = summary_of(run.run_dir)
    assert summary["outcome"] == "finished"
    assert summary["steps"] == STEPS
    assert {info["step"] for info in summary["ranks"].values()} == {STEPS}
    assert summary["job_restarts"] == 1
    first, second = summary["attempts"]
    assert first["kind"] == "vanished" and first["cause"].startswith("rank 3 (node 1): its process")
    assert first["resumed_from_step"] == newest
    assert first["steps_lost"] == first["failed_at_step"] - newest >= 0
    assert first["failure_to_first_step_s"] > 0
    assert second["outcome"] == "finished" and second["cause"] is None


@pytest.mark.xdist_group("killed-once-run")
def test_each_attempt_is_a_section_of_the_same_run_folder_and_the_output_lists_them(
    killed_once_run: RunEnded,
) -> None:
    run = killed_once_run
    assert len(run_dirs(run.project)) == 1
    kept = run.run_dir / "logs" / "attempt-1"
    logs = {*(f"node-{node}.log" for node in (0, 1)), *(f"rank-{rank}.log" for rank in range(4))}
    assert logs <= {path.name for path in kept.iterdir()}  # with whatever else the attempt logged (stacks)
    assert (run.run_dir / "logs" / "node-1.log").is_file()  # the second attempt's own
    assert "RESTART 1 of 1: attempt 1 failed at step" in run.stdout
    assert "attempts: 2 (1 restart(s) of the whole job)" in run.stdout
    assert "  attempt 1: failed at step " in run.stdout and "  attempt 2: finished" in run.stdout


OWN_FAILING_AFTER_A_STEP = """
from runtime import report

report.step(1, loss=1.0, samples=1)
report.flush()
raise RuntimeError("the loss went wrong at step 1")
"""


def test_a_script_failing_on_every_attempt_stops_after_n_restarts_naming_each_cause(tmp_path: Path) -> None:
    project = render_own_one_rank(tmp_path, "fails-always", "own.py", OWN_FAILING_AFTER_A_STEP)
    done = npu_wizard_run_plain(project, "--restarts", "2")
    assert done.returncode == 3, done.stdout + done.stderr
    (run_dir,) = run_dirs(project)
    attempts = summary_of(run_dir)["attempts"]
    assert [a["attempt"] for a in attempts] == [1, 2, 3]
    for attempt in attempts:
        assert attempt["outcome"] == "failed"
        assert "RuntimeError: the loss went wrong at step 1" in attempt["cause"]
    assert attempts[-1]["refused"] == "not restarted: the 2 restart(s) of --restarts 2 are used up"
    assert done.stdout.count("not restarted:") == 1  # said once
    assert len(kinds(events_of(run_dir)[0], "started")) == 3


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("import no_such_module_here\n", "the script failed before the job's first step"),
        (
            "raise RuntimeError('checkpoint step-8.pt does not fit this model (size mismatch)')\n",
            "the checkpoint does not fit the model",
        ),
        (
            "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n",
            "the script crashed (signal 11, SIGSEGV) before the job's first step",
        ),
    ],
    ids=["import", "checkpoint", "native-crash-at-import"],
)
def test_a_failure_a_restart_cannot_fix_is_never_retried(tmp_path: Path, text: str, why: str) -> None:
    project = render_own_one_rank(tmp_path, "never-retried", "own.py", text)
    done = npu_wizard_run_plain(project, "--restarts", "3")
    assert done.returncode == 3, done.stdout + done.stderr
    (run_dir,) = run_dirs(project)
    (attempt,) = summary_of(run_dir)["attempts"]
    assert attempt["refused"].startswith(f"not restarted: {why}")
    assert done.stdout.count("not restarted:") == 1
    assert len(kinds(events_of(run_dir)[0], "started")) == 1


def test_bad_answers_are_never_retried(tmp_path: Path) -> None:
    project = render_own_one_rank(tmp_path, "bad-answers", "own.py", "print('never run')\n")
    answers = project / "answers.yaml"
    answers.write_text(answers.read_text().replace("nodes: 1", "nodes: many"))
    done = npu_wizard_run_plain(project, "--restarts", "3")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "nodes" in done.stderr and "Traceback" not in done.stderr
    assert run_dirs(project) == []


def npu_smi_double(folder: Path, pid: int) -> Path:
    """A recording double of `npu-smi info` (no NPU here) whose process table shows `pid` on device 0."""
    folder.mkdir()
    script = folder / "npu-smi"
    table = f"| 0       0                 | {pid}         | python3                  | 2345                    |"
    script.write_text(f'#!/bin/sh\necho "$*" >> "{folder}/npu-smi.calls"\necho "{table}"\n')
    script.chmod(0o755)
    return folder


def test_the_health_check_waits_while_npu_smi_shows_a_process_of_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = render_own_one_rank(tmp_path, "health", "own.py", "print('hi')\n")
    from wizard.run.launch import load_project

    answers = load_project(project)
    doubles = npu_smi_double(tmp_path / "doubles", 424242)
    monkeypatch.setenv("PATH", f"{doubles}:{os.environ['PATH']}")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    assert node_health(run_dir, answers, [424242, 7], master_here=False) == [
        "npu-smi shows process(es) 424242 of this job on its devices"
    ]
    assert node_health(run_dir, answers, [555555], master_here=False) == []
    assert (doubles / "npu-smi.calls").read_text() == "info\ninfo\n"


def test_a_node_still_holding_the_master_port_is_not_healthy(tmp_path: Path) -> None:
    import socket

    project = render_own_one_rank(tmp_path, "port", "own.py", "print('hi')\n")
    from wizard.run.launch import load_project

    answers = load_project(project)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with socket.socket() as holder:
        holder.bind((answers["network.master_addr"], answers["network.master_port"]))
        holder.listen()
        assert node_health(run_dir, answers, [], master_here=True) == [
            f"the master port {answers['network.master_port']} is still taken"
        ]
    assert node_health(run_dir, answers, [], master_here=True) == []


def test_no_restart_is_asked_by_default_and_the_count_is_kept() -> None:
    state = JobState(2, nodes=1)
    state.ingest({"event": "started", "rank": 0, "time": 1.0, "node": 0, "pid": 11})
    state.ingest({"event": "step", "rank": 0, "time": 2.0, "step": 4})
    lost = Failure(0, 0, 3.0, "vanished", "its process 11 vanished")
    assert Attempts(0).refusal("failed", lost, state) == ""
    attempts = Attempts(1, clock=lambda: 3.0)
    assert attempts.refusal("failed", lost, state) is None
    attempts.failed(lost, state, 3.0)
    attempts.started_again(5.0)
    assert attempts.refusal("failed", lost, state) == "not restarted: the 1 restart(s) of --restarts 1 are used up"


def wizard_command(*args: str) -> subprocess.CompletedProcess[str]:
    """npu-wizard as a user runs it."""
    return subprocess.run([sys.executable, "-m", "wizard", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.xdist_group("killed-once-run")
def test_the_report_and_the_monitor_list_each_attempt_of_the_run(killed_once_run: RunEnded) -> None:
    run = killed_once_run
    summary = summary_of(run.run_dir)
    drawn = wizard_command("report", str(run.run_dir))
    assert drawn.returncode == 0, drawn.stderr
    page = (run.run_dir / "report.html").read_text()
    assert "<h2>Attempts</h2><p>1 restart(s) of the whole job (npu-wizard run --restarts).</p>" in page
    first = summary["attempts"][0]
    row = f"<td>1</td><td>failed</td><td>{html.escape(first['cause'])}</td><td>{first['failed_at_step']}</td>"
    assert row + f"<td>{first['resumed_from_step']}</td><td>{first['steps_lost']}</td>" in page
    watched = wizard_command("monitor", str(run.run_dir), "--plain")
    assert "attempts: 2 (1 restart(s) of the whole job)" in watched.stdout, watched.stdout + watched.stderr


def test_a_hostile_attempts_list_in_summary_json_is_read_as_no_figures() -> None:
    from wizard.monitor.summary_file import checked

    said = checked({"attempts": [{"attempt": "one", "cause": ["x"], "steps_lost": -3}, 7, None], "job_restarts": "2"})
    assert said["job_restarts"] == 0
    assert said["attempts"] == [
        {
            "attempt": None,
            "failed_at_step": None,
            "resumed_from_step": None,
            "steps_lost": None,
            "outcome": None,
            "cause": None,
            "kind": None,
            "refused": None,
            "failure_to_first_step_s": None,
        }
    ]


def test_the_answers_run_restarts_is_the_default_and_the_option_overrides_it(tmp_path: Path) -> None:
    project = render_own_one_rank(tmp_path, "answered", "own.py", OWN_FAILING_AFTER_A_STEP)
    answers = project / "answers.yaml"
    answers.write_text(answers.read_text().replace("run:\n  restarts: 0\n", "run:\n  restarts: 1\n"))
    by_answer = npu_wizard_run_plain(project)
    assert by_answer.returncode == 3, by_answer.stdout + by_answer.stderr
    by_option = npu_wizard_run_plain(project, "--restarts", "0")
    assert by_option.returncode == 3, by_option.stdout + by_option.stderr
    first, second = (summary_of(run_dir)["attempts"] for run_dir in run_dirs(project))
    assert len(first) == 2 and first[-1]["refused"] == "not restarted: the 1 restart(s) of --restarts 1 are used up"
    assert len(second) == 1 and second[0]["refused"] is None


def test_a_stopped_rank_is_a_hang_that_restarts_the_job_which_then_finishes(tmp_path: Path) -> None:
    # two nodes of one rank each (shell launcher): the smallest job a hang stops
    project = render_cpu(tmp_path, "shell", nodes=2, devices_per_node=1, samples=4096, epochs=1)
    runner = start_runner(project, "--interval", "2", "--restarts", "1", "--hang-after", "6")
    try:
        run_dir = wait_for(lambda: run_dirs(project), 60, "the run folder")[0]

        def rank_1_once_saved() -> int | None:
            found = events_of(run_dir)
            saved = kinds(found.get(1, []), "checkpoint") and kinds(found.get(1, []), "started")
            return kinds(found[1], "started")[-1]["pid"] if saved else None

        os.kill(wait_for(rank_1_once_saved, START_S, "node 1's first checkpoint"), signal.SIGSTOP)
        output, _ = runner.communicate(timeout=2 * START_S)
        left = leftover_processes(project)
    finally:
        clean_up(project, runner)
    assert runner.returncode == 0, output
    assert left == []
    summary = summary_of(run_dir)
    assert summary["outcome"] == "finished" and summary["job_restarts"] == 1
    first = summary["attempts"][0]
    assert first["outcome"] == "hung" and first["kind"] == "hung"
    # every rank's stacks were collected at the hang, before the restart stopped anything, and kept
    collected = json.loads((run_dir / "hang" / "attempt-1" / "collected.json").read_text())
    assert collected["reason"] == "hang", collected
    assert first["resumed_from_step"] == kinds(events_of(run_dir)[1], "started")[1]["resumed_step"] > 0
    assert summary["steps"] == 4096 // 16 // 2


@dataclass
class RestartedJob:
    """A job source with no processes behind it, in its second attempt (stands in for wizard.run.job.Job)."""

    state: JobState
    run_dir: Path
    attempt_words: str = "attempt 2 (1/2 restart(s) used)"
    started_at: float = 0.0
    outcome: str | None = None
    summary: dict | None = None

    def clock(self) -> float:
        """A fixed time."""
        return 10.0

    def tick(self) -> str | None:
        """Nothing new happens."""
        return self.outcome

    def stop(self, outcome: str = "interrupted", signum: int = 2) -> str:
        """End the job."""
        self.outcome = outcome
        return outcome


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_live_views_job_line_says_which_attempt_runs(tmp_path: Path, anyio_backend: str) -> None:
    from textual.widgets import Static

    from wizard.monitor.app import MonitorApp

    app = MonitorApp(
        RestartedJob(JobState(1, nodes=1, clock=lambda: 10.0), tmp_path), title="job", owns_job=True, tick_s=0
    )
    async with app.run_test(size=(140, 30)):
        line = str(app.query_one("#job", Static).render())
        assert "|  attempt 2 (1/2 restart(s) used)" in line


def test_a_preflight_failure_is_never_retried(tmp_path: Path) -> None:
    import socket

    project = render_own_one_rank(tmp_path, "preflight", "own.py", "print('never run')\n")
    from wizard.run.launch import load_project

    answers = load_project(project)
    with socket.socket() as holder:  # the master port taken: node 0's preflight stops before any rank starts
        holder.bind((answers["network.master_addr"], answers["network.master_port"]))
        holder.listen()
        done = npu_wizard_run_plain(project, "--restarts", "2")
    assert done.returncode == 3, done.stdout + done.stderr
    (run_dir,) = run_dirs(project)
    assert "preflight failed: nothing started" in (run_dir / "logs" / "node-0.log").read_text()
    (attempt,) = summary_of(run_dir)["attempts"]
    assert attempt["refused"].startswith("not restarted: the launch failed before any rank started")
    assert done.stdout.count("not restarted:") == 1


def test_an_attempts_logs_and_hang_stacks_are_kept_apart_and_a_pending_ask_stays(tmp_path: Path) -> None:
    from wizard.run.attempts import keep_logs

    for name in ("logs/node-0.log", "logs/rank-0.log", "hang/rank-0.txt", "hang/collected.json", "hang/ask"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(name)
    assert keep_logs(tmp_path, 1) == tmp_path / "logs" / "attempt-1"
    assert sorted(p.name for p in (tmp_path / "logs" / "attempt-1").iterdir()) == ["node-0.log", "rank-0.log"]
    assert sorted(p.name for p in (tmp_path / "hang" / "attempt-1").iterdir()) == ["collected.json", "rank-0.txt"]
    assert sorted(p.name for p in (tmp_path / "hang").iterdir() if p.is_file()) == ["ask"]


def hanging_job(allowed: int, restarts_used: int) -> SimpleNamespace:
    """What Job._hang_ends_attempt reads of a job whose rank 0 stepped and then hung (no --abort-on-hang)."""
    state = JobState(1, nodes=1, hang_after=5.0, clock=lambda: 100.0)
    state.ingest({"event": "started", "rank": 0, "time": 1.0, "node": 0, "pid": 11})
    state.ingest({"event": "step", "rank": 0, "time": 2.0, "step": 4})
    attempts = Attempts(allowed, clock=lambda: 0.0)
    for _ in range(restarts_used):
        attempts.started_again(1.0)
    return SimpleNamespace(options=SimpleNamespace(abort_on_hang=False), attempts=attempts, state=state)


def test_a_hang_in_the_last_attempt_ends_the_job_when_the_restarts_are_used_up() -> None:
    """--restarts 1, no --abort-on-hang: the last attempt's hang is its failure too (restarts used up, exit 3)."""
    assert Job._hang_ends_attempt(hanging_job(allowed=1, restarts_used=0))
    assert Job._hang_ends_attempt(hanging_job(allowed=1, restarts_used=1))
    assert not Job._hang_ends_attempt(hanging_job(allowed=0, restarts_used=0))  # no --restarts: the hang is watched


def test_the_headline_covers_every_attempt_not_the_last_one_alone() -> None:
    """After a restart the first logged step is the first attempt's, and the job's restart is counted."""
    first = JobState(1, nodes=1)
    first.ingest({"event": "started", "rank": 0, "time": 1.0, "node": 0, "pid": 11})
    first.ingest({"event": "step", "rank": 0, "time": 4.0, "step": 4})
    attempts = Attempts(1, clock=lambda: 0.0)
    attempts.note_progress(first)
    attempts.failed(Failure(0, 0, 5.0, "vanished", "its process 11 vanished"), first, 5.0)
    attempts.started_again(50.0)
    last = JobState(1, nodes=1)
    last.ingest({"event": "started", "rank": 0, "time": 51.0, "node": 0, "pid": 12})
    last.ingest({"event": "step", "rank": 0, "time": 60.0, "step": 8})
    attempts.note_progress(last)
    summary = summarize(last, started_at=0.0, ended_at=70.0, outcome="finished")
    attempts.cover_summary(summary, last, started_at=0.0)
    assert (summary["time_to_first_step_s"], summary["restarts"]) == (4.0, 1)
    assert "first logged step after 4.0s" in format_summary(summary).splitlines()[1]
