"""The test Slurm clusters (tests/slurm_cluster.py) started at once keep their jobs' ports apart.

Two clusters that give the same job ids give their jobs the same master port
(29500 + job id % 1000) on this one host: the second job's node 0 then finds its
port taken and the job fails. Under `pytest -n 2` the workers' clusters collided
when both started at job id 1; two test runs side by side collided when their
pids, which chose the block of ids, were equal modulo 10 (both runs' Slurm tests
failed: "preflight FAIL: master port: 30201 is taken"). Each cluster now holds a
block of ids through a lock on this host.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.slurm_cluster import JOB_ID_BLOCK, JOB_ID_BLOCKS, reserve_job_ids, slurm_conf

MASTER_PORT, MASTER_SPAN = 29500, 1000
ROOT = Path(__file__).resolve().parent.parent


def master_ports(first_job: int) -> set[int]:
    """The master ports of a cluster's first JOB_ID_BLOCK jobs, as launch/entry.sh derives them."""
    return {MASTER_PORT + job % MASTER_SPAN for job in range(first_job, first_job + JOB_ID_BLOCK)}


def test_clusters_holding_blocks_at_once_never_share_a_master_port(tmp_path: Path) -> None:
    held = [reserve_job_ids(tmp_path, timeout=5) for _ in range(JOB_ID_BLOCKS)]
    firsts = [first for first, _ in held]
    for index, first in enumerate(firsts):
        for other in firsts[index + 1 :]:
            assert not master_ports(first) & master_ports(other), (first, other)
    with pytest.raises(AssertionError, match="a free block of Slurm job ids"):
        reserve_job_ids(tmp_path, timeout=0.5)
    freed_first, freed_fd = held.pop(3)
    os.close(freed_fd)  # what SlurmCluster.stop does, or the kernel for a test that died
    again, fd = reserve_job_ids(tmp_path, timeout=5)
    assert again == freed_first
    for _, other_fd in [*held, (again, fd)]:
        os.close(other_fd)


def test_a_block_another_test_run_holds_is_not_given_again(tmp_path: Path) -> None:
    # another test run: a separate process holding its block until told to let go
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys
                sys.path.insert(0, {str(ROOT)!r})
                from pathlib import Path
                from tests.slurm_cluster import reserve_job_ids
                first, fd = reserve_job_ids(Path({str(tmp_path)!r}), timeout=5)
                print(first, flush=True)
                sys.stdin.read()
                """
            ),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        theirs = int(holder.stdout.readline())
        ours, fd = reserve_job_ids(tmp_path, timeout=5)
        assert not master_ports(ours) & master_ports(theirs), (ours, theirs)
        holder.communicate("", timeout=30)
        # the other run has ended: its block is free again, while ours is still held
        again, fd_again = reserve_job_ids(tmp_path, timeout=5)
        assert again == theirs
        os.close(fd_again)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    os.close(fd)


def test_a_lock_folder_others_can_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "locks"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(AssertionError, match="only it can write"):
        reserve_job_ids(shared, timeout=1)


def test_a_cluster_starts_at_its_own_first_job_id(tmp_path: Path) -> None:
    first, fd = reserve_job_ids(tmp_path / "locks", timeout=5)
    try:
        conf = slurm_conf(tmp_path, 6817, {"n1": 6818, "n2": 6819}, cpus=2, first_job=first)
        assert f"FirstJobId={first}\n" in conf
    finally:
        os.close(fd)
