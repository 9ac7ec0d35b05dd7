"""`npu-wizard run` on a rendered CPU project: progress, a summary, and the root cause of a failure."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.factories import answers
from tests.runs import RunEnded, events_of, kinds, node_env, render_cpu, run_dirs
from wizard.errors import TargetError
from wizard.monitor.ranks import Failure
from wizard.monitor.summary_text import format_summary
from wizard.render.render import render
from wizard.run.job import Job
from wizard.run.launch import RunOptions, load_project, nodes_to_start, restart_note


def npu_wizard_run(project: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the real command the way a user does, with this venv on PATH."""
    return subprocess.run(
        [sys.executable, "-m", "wizard", "run", str(project), "--interval", "1", "--plain", *args],
        env=node_env(tmp_path / "unused"),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
@pytest.mark.xdist_group("finished-2x2-run")
def test_run_starts_every_simulated_node_and_reports_the_finish(finished_2x2_run: RunEnded) -> None:
    run = finished_2x2_run  # tests/conftest.py: npu-wizard run of a 2 x 2 torchrun project, to its end
    assert run.code == 0, run.stdout + run.stderr
    assert "starting nodes 0, 1 of 2" in run.stdout
    assert "4 ranks: finished 4" in run.stdout
    assert "outcome: finished" in run.stdout
    assert [p for p in (run.project / "runs").iterdir() if p.is_dir() and p.name != "unused"] == [run.run_dir]
    assert sorted(p.name for p in (run.run_dir / "events").iterdir()) == [f"rank-{r}.jsonl" for r in range(4)]


@pytest.mark.slow
@pytest.mark.xdist_group("finished-2x2-run")
def test_every_event_of_a_real_run_is_numbered_in_order_within_its_process(finished_2x2_run: RunEnded) -> None:
    run = finished_2x2_run  # the runner tells repeats by (rank, pid, seq), so an NTP step cannot (issue 36 item 20)
    for rank, written in events_of(run.run_dir).items():
        numbers: dict[int, list[int]] = {}
        for event in written:
            numbers.setdefault(event["pid"], []).append(event["seq"])
        assert numbers, f"rank {rank} wrote no event"
        for pid, seqs in numbers.items():
            assert seqs == list(range(1, len(seqs) + 1)), f"rank {rank}, process {pid}: {seqs[:20]}"
        assert any(event["event"] == "step" for event in written)


@pytest.mark.slow
def test_a_failing_job_exits_3_and_names_the_first_failing_rank(tmp_path: Path) -> None:
    project = render_cpu(tmp_path, "shell", nodes=1, dataset="mnist", data_dir="no-such-folder", model="convnet")
    result = npu_wizard_run(project, tmp_path)
    assert result.returncode == 3, result.stdout + result.stderr
    assert "root cause: rank " in result.stderr
    assert "no-such-folder" in result.stderr


def test_separate_hosts_need_a_node_number() -> None:
    cluster = answers(nodes=2, network__host_ips=["10.0.0.1", "10.0.0.2"], network__master_addr="10.0.0.1")
    with pytest.raises(TargetError, match="--node N"):
        nodes_to_start(cluster, None)
    assert nodes_to_start(cluster, 1) == [1]
    with pytest.raises(TargetError, match="nodes 0 to 1"):
        nodes_to_start(cluster, 2)


def test_run_refuses_a_folder_that_is_no_project(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "wizard", "run", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    assert "not an npu-wizard project" in result.stderr


def test_max_restarts_is_said_to_be_ignored_by_a_launcher_without_restarts() -> None:
    assert "shell launcher has no restart mechanism" in (restart_note("shell", 1) or "")
    assert restart_note("torchrun", 1) is None
    assert restart_note("shell", 0) is None


def test_monitor_reads_a_finished_run_folder(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "events").mkdir(parents=True)
    lines = [
        {"schema": 1, "event": "started", "time": 10.0, "rank": 0, "node": 0, "world_size": 1, "pid": 1},
        {"schema": 1, "event": "step", "time": 12.0, "rank": 0, "step": 4, "loss": 0.5, "samples_per_s": 100.0},
        {"schema": 1, "event": "finished", "time": 13.0, "rank": 0, "step": 4},
    ]
    (run_dir / "events" / "rank-0.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = subprocess.run(
        [sys.executable, "-m", "wizard", "monitor", str(run_dir), "--plain"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "outcome: finished" in result.stdout
    assert "rank 0 (node 0): finished, step 4, loss 0.5000, 100 samples/s" in result.stdout


@pytest.mark.slow
def test_a_node_script_stopped_by_its_preflight_shows_the_preflights_own_lines(tmp_path: Path) -> None:
    project = render_cpu(tmp_path, "torchrun", nodes=1)
    port = load_project(project)["network.master_port"]
    with socket.socket() as holder:  # a leftover job holds the master port
        holder.bind(("127.0.0.1", port))
        holder.listen()
        result = npu_wizard_run(project, tmp_path)
    assert result.returncode == 3, result.stdout + result.stderr
    assert (
        "root cause: node 0's launcher: its launch script stopped in its preflight (exit code 1) "
        "before any rank reported an error; from " in result.stderr
    )
    assert f"  | node 0: preflight FAIL: master port: {port} is taken" in result.stderr
    assert "rank None" not in result.stdout + result.stderr


def test_a_failure_without_a_rank_names_the_nodes_launcher() -> None:
    killed = Failure(None, 1, 0.0, "launcher", "its launch script exited (exit code 137)")
    assert killed.headline() == "node 1's launcher: its launch script exited (exit code 137)"
    summary = {"outcome": "failed", "ranks": {}, "failure": {"rank": None, "node": 1, "summary": "agent killed"}}
    assert "failure: node 1's launcher: agent killed" in format_summary(summary)
    assert Failure(3, 1, 0.0, "error", "boom").headline() == "rank 3 (node 1): boom"


@pytest.mark.slow
def test_a_second_run_of_a_finished_project_says_how_to_go_on_and_fresh_moves_checkpoints_aside(
    tmp_path: Path,
) -> None:
    project = render_cpu(tmp_path, "shell", devices_per_node=1, samples=128)  # one process: 8 steps an epoch, 2 epochs
    checkpoints = project / "checkpoints"
    assert npu_wizard_run(project, tmp_path).returncode == 0

    again = npu_wizard_run(project, tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert (
        "nothing to train: the checkpoint at step 16 already completes the 2 epoch(s) asked; "
        "to train on, run again with --epochs N (more than 2); "
        f"to start afresh, run again with --fresh (moves the checkpoints in {checkpoints} into a subfolder, "
        "deletes nothing)"
    ) in again.stdout

    more = npu_wizard_run(project, tmp_path, "--epochs", "3")
    assert more.returncode == 0, more.stdout + more.stderr
    assert "nothing to train" not in more.stdout
    started = kinds(events_of(run_dirs(project)[-1])[0], "started")[0]
    assert (started["resumed_step"], started["total_steps"]) == (16, 24)

    kept = sorted(p.name for p in checkpoints.iterdir() if p.name != ".gitignore")  # it stays: git leaves it out
    fresh = npu_wizard_run(project, tmp_path, "--fresh")
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    (aside,) = checkpoints.glob("set-aside-*")
    assert f"--fresh: moved the old checkpoints into {aside}" in fresh.stdout
    assert sorted(p.name for p in aside.iterdir()) == kept  # nothing deleted
    assert kinds(events_of(run_dirs(project)[-1])[0], "started")[0]["resumed_step"] == 0


def resumed_at_the_end(job: Job, step: int) -> Job:
    """`job` finished with every rank resuming at `step`, its total, and stepping no more."""
    for rank in job.state.ranks:
        job.state.ingest({"event": "started", "rank": rank, "time": 1.0, "resumed_step": step, "total_steps": step})
    job.outcome = "finished"
    return job


def test_a_run_max_steps_ended_says_to_ask_for_more_steps_not_more_epochs(tmp_path: Path) -> None:
    rendered = answers(training__model="gpt", training__dataset="tokens", training__max_steps=200, project_name="lm")
    project = render(rendered, tmp_path).project_dir
    said = resumed_at_the_end(Job(project, RunOptions()), 200).finished_note()
    assert said is not None and said.startswith(
        "nothing to train: the checkpoint at step 200 already completes the 200 step(s) of max steps; "
        "to train on, run again with -- --max-steps N (more than 200); to start afresh, run again with --fresh"
    )
    assert "--epochs" not in said
    asked = Job(project, RunOptions(extra_args=("--max-steps", "50")))  # the run's own limit, after --
    assert "-- --max-steps N (more than 50)" in (resumed_at_the_end(asked, 50).finished_note() or "")
    epochs = Job(project, RunOptions(extra_args=("--max-steps", "0")))  # no limit: the epochs ended it
    assert "run again with --epochs N (more than" in (resumed_at_the_end(epochs, 80).finished_note() or "")
