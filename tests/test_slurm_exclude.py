"""Under Slurm a restart keeps the failed node off the resubmitted job, while the partition can still place it.

The real two-node cluster of tests/slurm_cluster.py: a one-node job (one rank, shell
launcher: what moves is the node) whose rank is killed after a checkpoint is resubmitted
with `sbatch --exclude=` the node it ran on, runs on the other node, resumes and
finishes. A two-node job cannot be placed without one of the two nodes, so its failed
node is not excluded, and the plan says why.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.runs import clean_up, events_of, kinds, run_dirs, start_runner, wait_for
from tests.slurm_cluster import SlurmCluster, have_slurm, slurm_cluster
from tests.test_slurm_engine import START_S, render_slurm, runner_env, summary_of
from wizard.answers.model import resolve
from wizard.run.engines.slurm import SlurmEngine, parse_job
from wizard.run.hosts import HostPlan

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not have_slurm(), reason="needs slurm-wlm and munge (.ci/run installs them)"),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """One running two-node cluster for the module's tests."""
    with slurm_cluster(tmp_path_factory.mktemp("slurm")) as running:
        yield running


def rank_after_a_checkpoint(run_dir: Path) -> int | None:
    """The rank's pid once it wrote a checkpoint, else None."""
    found = events_of(run_dir).get(0, [])
    return kinds(found, "started")[-1]["pid"] if kinds(found, "checkpoint") else None


def test_a_one_node_job_whose_node_failed_is_resubmitted_off_it_and_finishes(
    tmp_path: Path, cluster: SlurmCluster
) -> None:
    # 1024 steps, a checkpoint every 50: the rank dies well before the end, even on a loaded machine
    overrides = {"training.samples": 16384, "training.epochs": 1, "training.checkpoint_every": 50}
    project = render_slurm(tmp_path, nodes=1, devices_per_node=1, launcher="shell", **overrides)
    runner = start_runner(project, "--interval", "2", "--restarts", "1", env=runner_env(cluster, project))
    try:
        run_dir = wait_for(lambda: run_dirs(project), 60, "the run folder")[0]
        victim = wait_for(lambda: rank_after_a_checkpoint(run_dir), START_S, "the rank's first checkpoint")
        os.kill(victim, signal.SIGKILL)
        output, _ = runner.communicate(timeout=3 * START_S)
    finally:
        clean_up(project, runner)
    assert runner.returncode == 0, output
    summary = summary_of(run_dir)
    assert summary["outcome"] == "finished" and summary["job_restarts"] == 1
    assert summary["attempts"][0]["failed_at_step"] < 1024 == summary["steps"]
    (change,) = summary["hosts_changed"]
    failed = change["replaced"]
    other = {"n1": "n2", "n2": "n1"}[failed]
    assert (change["node"], change["by"], change["attempt"]) == (0, None, 2)
    assert summary["slurm_excluded"] == [failed]
    second_job = json.loads((run_dir / "run.json").read_text())["job_id"]
    assert f"slurm: submitted job {second_job} kept off {failed} (sbatch --exclude)" in output
    assert f"slurm: job {second_job} RUNNING on {other}" in output
    assert f"attempt 2: node 0's host {failed} kept off the job (sbatch --exclude={failed})" in output
    assert f"attempt 2: {failed} (node 0) kept off the job" in output  # the summary's line
    found = events_of(run_dir)
    assert kinds(found[0], "started")[1]["resumed_step"] > 0
    wait_for(lambda: not cluster.queue(), 60, "squeue to be empty")


def test_a_two_node_job_keeps_its_failed_node_when_no_other_could_take_its_place(
    cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    answers = resolve({"project_name": "two", "device": "cpu", "nodes": 2, "cluster.engine": "slurm"})
    engine = SlurmEngine()
    engine.node_list = parse_job("JobId=7 NodeList=n[1-2]")["NodeList"]
    plan = HostPlan.for_answers(answers)

    plan._exclude(1, engine.host_of(1), attempt=2)

    assert plan.excluded == [] and plan.changes == []
    assert plan.notes == [
        "n2 (node 1) not excluded: without it the partition has 1 usable node(s) (n1) and the job needs 2; "
        "resubmitted on any node"
    ]
