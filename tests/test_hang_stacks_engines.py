"""Case (a) of issue 28's proof on the other engines: one rank late for a collective, every rank's place collected.

Across the two ssh namespace hosts (tests/ssh_hosts.py) and on the real
two-node Slurm cluster (tests/slurm_cluster.py): the ranks answer on the
status stream from wherever they run, and the runner on node 0 writes hang/.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hang_runs import check_late, run_late
from tests.slurm_cluster import SlurmCluster, have_slurm, slurm_cluster
from tests.ssh_hosts import SshHosts, have_ssh_hosts, ssh_hosts
from tests.test_slurm_engine import render_slurm
from tests.test_slurm_engine import runner_env as slurm_env
from tests.test_ssh_engine import render_ssh
from tests.test_ssh_engine import runner_env as ssh_env

pytestmark = pytest.mark.slow
JOB = {"training.samples": 4096, "training.epochs": 1, "training.log_every": 2}


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshHosts]:
    if not have_ssh_hosts():
        pytest.skip("needs root, sshd, ssh, rsync and ip")
    with ssh_hosts(tmp_path_factory.mktemp("ssh")) as started:
        yield started


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    if not have_slurm():
        pytest.skip("needs slurm-wlm and munge (.ci/run installs them)")
    with slurm_cluster(tmp_path_factory.mktemp("slurm")) as running:
        yield running


def test_a_late_rank_across_two_ssh_hosts_is_named_with_every_rank_in_place(tmp_path: Path, hosts: SshHosts) -> None:
    project = render_ssh(tmp_path, hosts.addresses, **JOB)
    run = run_late(project, ssh_env(hosts, project))
    check_late(run, project / "train.py", range(4))


def test_a_late_rank_on_the_slurm_cluster_is_named_with_every_rank_in_place(
    tmp_path: Path, cluster: SlurmCluster
) -> None:
    project = render_slurm(tmp_path, **JOB)
    run = run_late(project, slurm_env(cluster, project))
    check_late(run, project / "train.py", range(4))
