"""`npu-wizard run --restarts N`: the whole job started again after a failure a restart can fix.

Real processes on 127.0.0.1, gloo on the CPU, the manual engine. The 2 x 2 run
is shared by the tests that read it (one kill, one restart); the others run one
rank of a user's own script, which is cheap.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

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
from wizard.run.attempts import Attempts, node_health

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
    assert sorted(p.name for p in kept.iterdir()) == [
        *(f"node-{n}.log" for n in (0, 1)),
        *(f"rank-{r}.log" for r in range(4)),
    ]
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
    ],
    ids=["import", "checkpoint"],
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
    assert node_health(run_dir, answers, 1, [424242, 7]) == [
        "npu-smi shows process(es) 424242 of this job on its devices"
    ]
    assert node_health(run_dir, answers, 1, [555555]) == []
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
        assert node_health(run_dir, answers, 0, []) == [
            f"the master port {answers['network.master_port']} is still taken"
        ]
    assert node_health(run_dir, answers, 0, []) == []


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
