"""The test Slurm clusters (tests/slurm_cluster.py) started at once keep their jobs' ports apart.

Two clusters that both start at job id 1 give their first jobs the same master port
(29500 + job id % 1000) on this one host: under `pytest -n 2` the second job's
rank 0 then found its port taken and the job never trained.
"""

from __future__ import annotations

from pathlib import Path

from tests.slurm_cluster import JOB_ID_BLOCK, first_job_id, slurm_conf

MASTER_PORT, MASTER_SPAN = 29500, 1000


def master_ports(first_job: int) -> set[int]:
    """The master ports of a cluster's first JOB_ID_BLOCK jobs, as launch/entry.sh derives them."""
    return {MASTER_PORT + job % MASTER_SPAN for job in range(first_job, first_job + JOB_ID_BLOCK)}


def test_the_workers_of_one_run_give_their_jobs_different_master_ports() -> None:
    for run_pid in (4242, 4249, 99999):
        firsts = [first_job_id({"PYTEST_XDIST_WORKER": f"gw{index}"}, run_pid) for index in range(10)]
        for index, first in enumerate(firsts):
            for other in firsts[index + 1 :]:
                assert not master_ports(first) & master_ports(other), (first, other)


def test_a_cluster_starts_at_its_own_first_job_id(tmp_path: Path) -> None:
    first = first_job_id({"PYTEST_XDIST_WORKER": "gw1"}, 4242)
    conf = slurm_conf(tmp_path, 6817, {"n1": 6818, "n2": 6819}, cpus=2, first_job=first)
    assert f"FirstJobId={first}\n" in conf
    assert first != 1
