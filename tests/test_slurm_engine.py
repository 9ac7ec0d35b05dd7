"""`npu-wizard run` on a real two-node Slurm cluster (tests/slurm_cluster.py), CPU demo with engine slurm.

slurmctld and two slurmd run on this host from a temporary folder; the job goes
through the project's own slurm/job.sbatch and launch/entry.sh. Each test bounds
every wait, and the cluster's daemons are stopped by PID when the module ends.

The engine's point is the nodes Slurm gives the job, not the ranks on each: the jobs
here run one rank a node with the shell launcher (ONE_RANK_A_NODE), the same two
srun tasks as 2 x 2 under torchrun without the agent and the second rank that import
torch on every node.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.runs import (
    clean_up,
    events_of,
    kinds,
    node_env,
    run_dirs,
    start_runner,
    started_pid,
    wait_for,
)
from tests.slurm_cluster import SlurmCluster, have_slurm, slurm_cluster
from wizard.answers.model import resolve
from wizard.render.render import render

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not have_slurm(), reason="needs slurm-wlm and munge (.ci/run installs them)"),
]

START_S = 240  # sbatch, two slurmd, then the torch processes on a loaded two-core machine
LONG_RUN = {"training.samples": 65536, "training.epochs": 2}
ONE_RANK_A_NODE = {"devices_per_node": 1, "launcher": "shell"}
"""2 nodes x 1 rank, each started by launch/run-node.sh itself: ranks 0 and 1, one on each node."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """One running two-node cluster for the module's tests."""
    with slurm_cluster(tmp_path_factory.mktemp("slurm")) as running:
        yield running


def render_slurm(tmp_path: Path, **overrides: Any) -> Path:
    """The CPU demo (2 nodes x 2 ranks, gloo) rendered with engine slurm."""
    raw: dict[str, Any] = {
        "project_name": "slurm-demo",
        "device": "cpu",
        "nodes": 2,
        "devices_per_node": 2,
        "launcher": "torchrun",
        "amp": "off",
        "cluster.engine": "slurm",
        "cluster.time": "00:20:00",
        "training.samples": 1024,
        "training.batch_size": 16,
        "training.epochs": 2,
        "training.log_every": 4,
    }
    raw.update(overrides)
    return render(resolve(raw), tmp_path).project_dir


def runner_env(cluster: SlurmCluster, project: Path) -> dict[str, str]:
    """The runner's environment, which sbatch passes on to the job. OMP_NUM_THREADS=1: both nodes share this
    machine's cores, and a node's only rank would otherwise take a thread for each of them (runtime/device.py)."""
    return node_env(project / "runs" / "unused", SLURM_CONF=str(cluster.conf), OMP_NUM_THREADS="1")


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def test_the_cpu_demo_trains_to_the_end_through_sbatch(tmp_path: Path, cluster: SlurmCluster) -> None:
    project = render_slurm(tmp_path, **ONE_RANK_A_NODE)
    runner = start_runner(project, "--interval", "2", env=runner_env(cluster, project))
    try:
        output, _ = runner.communicate(timeout=START_S + 300)
    finally:
        clean_up(project, runner)
    assert runner.returncode == 0, output
    (run_dir,) = run_dirs(project)
    summary = summary_of(run_dir)
    assert summary["outcome"] == "finished"
    assert [info["node"] for info in summary["ranks"].values()] == [0, 1]
    assert summary["steps"] == 1024 // 16 // 2 * 2
    job_id = json.loads((run_dir / "run.json").read_text())["job_id"]
    assert f"slurm: submitted job {job_id}" in output and f"slurm: job {job_id} COMPLETED ExitCode=0:0" in output
    assert (run_dir / "logs" / f"slurm-{job_id}.out").is_file()
    # the nodes found their master and ports from the job id, not from the answers
    assert f"master 127.0.0.1:{29500 + int(job_id) % 1000}" in (run_dir / "logs" / "node-1.log").read_text()
    wait_for(lambda: not cluster.queue(), 60, "squeue to be empty")


def test_a_killed_rank_fails_the_job_with_the_rank_and_slurms_state(tmp_path: Path, cluster: SlurmCluster) -> None:
    project = render_slurm(tmp_path, **LONG_RUN, **ONE_RANK_A_NODE)
    runner = start_runner(project, "--interval", "1", env=runner_env(cluster, project))
    try:
        run_dir = wait_for(lambda: run_dirs(project), 60, "the run folder")[0]
        victim = wait_for(lambda: started_pid(run_dir, 1), START_S, "rank 1 to train")
        os.kill(victim, signal.SIGKILL)
        output, _ = runner.communicate(timeout=120)
    finally:
        clean_up(project, runner)
    assert runner.returncode == 3, output
    assert "root cause: rank 1 (node 1)" in output
    job_id = json.loads((run_dir / "run.json").read_text())["job_id"]
    assert f"slurm: job {job_id} CANCELLED" in output or f"slurm: job {job_id} FAILED" in output
    assert summary_of(run_dir)["failure"]["rank"] == 1
    wait_for(lambda: not cluster.queue(), 60, "squeue to be empty")


def test_ctrl_c_cancels_the_job(tmp_path: Path, cluster: SlurmCluster) -> None:
    project = render_slurm(tmp_path, **LONG_RUN, **ONE_RANK_A_NODE)
    runner = start_runner(project, "--interval", "1", env=runner_env(cluster, project))
    try:
        run_dir = wait_for(lambda: run_dirs(project), 60, "the run folder")[0]
        wait_for(lambda: kinds(events_of(run_dir).get(0, []), "step"), START_S, "rank 0 to train")
        runner.send_signal(signal.SIGINT)
        output, _ = runner.communicate(timeout=120)
    finally:
        clean_up(project, runner)
    assert runner.returncode == 130, output
    assert cluster.queue() == []
    job_id = json.loads((run_dir / "run.json").read_text())["job_id"]
    assert f"slurm: job {job_id} CANCELLED" in output


def test_smoke_through_slurm_reports_every_rank(tmp_path: Path, cluster: SlurmCluster) -> None:
    project = render_slurm(tmp_path, **ONE_RANK_A_NODE)
    runner = start_runner(project, "--smoke", env=runner_env(cluster, project))
    try:
        output, _ = runner.communicate(timeout=START_S + 120)
    finally:
        clean_up(project, runner)
    assert runner.returncode == 0, output
    assert "smoke ok" in output
    rank_lines = [line for line in output.splitlines() if line.strip().startswith("rank ") and "all_reduce" in line]
    assert [line.split()[1:4:2] for line in rank_lines] == [["0", "0"], ["1", "1"]]


def test_doctor_on_a_slurm_project_points_at_smoke_instead(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from wizard.cli import main

    project = render_slurm(tmp_path)
    assert main(["doctor", str(project)]) == 1
    assert "nodes are chosen when the job starts" in capsys.readouterr().err


def test_a_dry_run_prints_the_sbatch_command_and_script_and_starts_nothing(tmp_path: Path) -> None:
    project = render_slurm(tmp_path)
    import contextlib
    import io

    from wizard.cli import main

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["run", str(project), "--dry-run"]) == 0
    text = printed.getvalue()
    assert "sbatch --parsable" in text and "slurm/job.sbatch" in text
    assert (project / "slurm" / "job.sbatch").read_text() in text
    assert "NPU_WIZARD_STATUS_ADDR=" in text and "PYTHON=/" in text
    assert not (project / "runs").exists()


def test_scancel_signal_usr1_saves_every_rank_and_the_requeued_job_resumes_there(
    tmp_path: Path, cluster: SlurmCluster
) -> None:
    # 1024 samples / (16 x 2 ranks) = 32 steps an epoch: 8 epochs, 256 steps
    project = render_slurm(tmp_path, **ONE_RANK_A_NODE, **{"training.epochs": 8, "training.checkpoint_every": 0})
    env = runner_env(cluster, project)
    runner = start_runner(project, "--interval", "2", env=env)
    try:
        run_dir = wait_for(lambda: run_dirs(project), 60, "the run folder")[0]
        wait_for(lambda: started_pid(run_dir, 1), START_S, "rank 1 to train")
        job_id = json.loads((run_dir / "run.json").read_text())["job_id"]
        # what Slurm sends before the time limit (#SBATCH --signal=B:USR1@120), now: to the batch script only
        subprocess.run(["scancel", "--batch", "--signal=USR1", job_id], env=env, check=True, timeout=30)
        output, _ = runner.communicate(timeout=START_S + 300)
    finally:
        clean_up(project, runner)
    assert runner.returncode == 0, output
    found = events_of(run_dir)
    preempted = {rank: kinds(found[rank], "preempted") for rank in range(2)}
    assert all(len(said) == 1 for said in preempted.values()), preempted
    (step,) = {said[0]["step"] for said in preempted.values()}  # every rank saved at the same step
    assert 0 < step < 256
    for rank in range(2):
        starts = kinds(found[rank], "started")
        assert [start["resumed_step"] for start in starts] == [0, step]  # the requeued job resumed there
        assert kinds(found[rank], "finished")[-1]["step"] == 256
    assert summary_of(run_dir)["outcome"] == "finished"
    # (the requeued job's batch output replaced the first one's; the ranks' logs are appended to)
    assert f"preempted at step {step}, checkpoint saved" in (run_dir / "logs" / "rank-0.log").read_text()
    wait_for(lambda: not cluster.queue(), 60, "squeue to be empty")
