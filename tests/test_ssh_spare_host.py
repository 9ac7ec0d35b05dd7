"""A spare host takes a lost node's rank: the ssh engine across three namespace hosts (tests/ssh_hosts.py).

Two hosts run the job's nodes and the third stands by (network.spare_hosts).
Once node 1 has saved a checkpoint, every process of the second host (its sshd,
its launcher, its ranks) is killed: the host is gone. The runner stops the job,
finds host 1 unreachable over ssh at the health check, starts node 1's launch
script on the spare with the spare's address, and the job resumes from the
checkpoint and finishes. One real run, shared by the tests that read it, of one rank a
node (ONE_RANK_A_NODE): what moves is a node, whatever runs on it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.runs import RunEnded, clean_up, events_of, kinds, leftover_processes, run_dirs, start_runner, wait_for
from tests.ssh_hosts import SshHosts, have_ssh_hosts, ssh_hosts
from tests.test_ssh_engine import ONE_RANK_A_NODE, START_S, render_ssh, runner_env

pytestmark = pytest.mark.slow

SAMPLES = 32768  # long enough that the host is lost well before the end, on a loaded machine
STEPS = SAMPLES // 16 // 2  # samples / batch / world size, one epoch: 1024 steps a rank


def namespace_pids(namespace: str) -> list[int]:
    """Every process in a host's network namespace (its sshd and what it started), by `ip netns pids`."""
    listed = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True, timeout=60)
    return [int(pid) for pid in listed.stdout.split()]


def lose_host(hosts: SshHosts, index: int) -> list[int]:
    """Kill every process of host `index` (its sshd included), as a host that lost power; the pids killed."""
    killed = namespace_pids(hosts.namespaces[index])
    for pid in killed:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return killed


def node1_saved(run_dir: Path) -> bool:
    """Node 1's rank (rank 1) wrote a checkpoint."""
    return bool(kinds(events_of(run_dir).get(1, []), "checkpoint"))


@pytest.fixture(scope="module")
def spare_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunEnded, SshHosts]]:
    """`run --restarts 1` of a 2 x 1 ssh project with one spare host; host 1 lost after node 1's checkpoint."""
    if not have_ssh_hosts():
        pytest.skip("needs root, sshd, ssh, rsync and ip")
    root = tmp_path_factory.mktemp("ssh-spare")
    with ssh_hosts(root, count=3) as hosts:
        nodes, spare = hosts.addresses[:2], hosts.addresses[2]
        overrides = {
            **ONE_RANK_A_NODE,
            "network.spare_hosts": [spare],
            "training.samples": SAMPLES,
            "training.epochs": 1,
            "training.checkpoint_every": 50,
        }
        project = render_ssh(root / "project", nodes, **overrides)
        runner = start_runner(project, "--interval", "2", "--restarts", "1", env=runner_env(hosts, project))
        try:
            run_dir = wait_for(lambda: run_dirs(project), 60, "the run folder")[0]
            wait_for(lambda: node1_saved(run_dir), START_S, "node 1's first checkpoint")
            assert lose_host(hosts, 1)
            output, _ = runner.communicate(timeout=3 * START_S)
            left = leftover_processes(project)
        finally:
            clean_up(project, runner)
        yield RunEnded(project, run_dir, runner.returncode, output, "", left), hosts


@pytest.mark.xdist_group("ssh-spare-run")
def test_the_spare_host_takes_node_1s_rank_and_the_job_finishes(spare_run: tuple[RunEnded, SshHosts]) -> None:
    run, hosts = spare_run
    lost, spare = hosts.addresses[1], hosts.addresses[2]
    assert run.code == 0, run.stdout
    assert run.left == []
    summary = json.loads((run.run_dir / "summary.json").read_text())
    assert summary["outcome"] == "finished"
    assert summary["job_restarts"] == 1
    assert summary["attempts"][0]["failed_at_step"] < STEPS  # the host was lost mid-run
    assert {info["step"] for info in summary["ranks"].values()} == {STEPS}
    (change,) = summary["hosts_changed"]
    assert (change["node"], change["replaced"], change["by"], change["attempt"]) == (1, lost, spare, 2)
    assert change["why"].startswith(f"failed its health check: ssh to {lost} failed")
    assert f"attempt 2: node 1 moved from {lost} to spare host {spare}" in run.stdout
    assert f"ssh: node 1 started on {spare}" in run.stdout


@pytest.mark.xdist_group("ssh-spare-run")
def test_on_the_spare_node_1s_script_runs_with_the_spares_address_and_resumes(
    spare_run: tuple[RunEnded, SshHosts],
) -> None:
    run, hosts = spare_run
    spare = hosts.addresses[2]
    # node 1's launch script on the spare: HCCL_IF_IP (and gloo's address) is the spare's, the rank is node 1's
    assert f"node 1/2 ({spare})" in (run.run_dir / "logs" / "node-1.log").read_text()
    found = events_of(run.run_dir)
    started = kinds(found[1], "started")  # node 1's rank
    assert len(started) == 2 and started[1]["resumed_step"] > 0, started
    assert started[1]["resumed_step"] == kinds(found[0], "started")[1]["resumed_step"]
