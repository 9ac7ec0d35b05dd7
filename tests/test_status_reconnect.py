"""A paused runner must not kill a healthy job: the ranks' status connections come back.

A real 2 x 2 CPU job with node 0's and node 1's runners started apart, so that
node 1's ranks reach node 0 only through the status stream. Node 0's runner is
stopped (SIGSTOP, as Ctrl-Z does) until every rank's send has blocked past the
publisher's timeout and the rank has opened a new connection; the socket
buffers are shrunk (tests/doubles/small_socket_buffers/ on the runners' and
ranks' PYTHONPATH, a test double) and heartbeats made frequent so that this
takes seconds.
"""

from __future__ import annotations

import json
import os
import re
import resource
import secrets
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runs import clean_up, leftover_processes, node_env, render_cpu, run_dirs, start_runner, started_pid, wait_for

pytestmark = pytest.mark.slow

START_S = 180
SMALL_BUFFERS = Path(__file__).resolve().parent / "doubles" / "small_socket_buffers"  # a sitecustomize


def status_port(run_dir: Path) -> int:
    """The port node 0's runner serves the status stream on (from its run.json)."""
    info = json.loads((run_dir / "run.json").read_text())
    return int(info["status_addr"].rsplit(":", 1)[1])


def client_ports(port: int) -> dict[int, set[int]]:
    """pid -> local ports of its established connections to the status port (from `ss`)."""
    listing = subprocess.run(
        ["ss", "-tnpH", "state", "established", f"dport = :{port}"], capture_output=True, text=True, check=True
    ).stdout
    found: dict[int, set[int]] = {}
    for line in listing.splitlines():
        local = line.split()[2]  # Recv-Q Send-Q Local Peer Process
        for pid in re.findall(r"pid=(\d+)", line):
            found.setdefault(int(pid), set()).add(int(local.rsplit(":", 1)[1]))
    return found


def test_a_runner_stopped_until_every_rank_reconnected_still_finishes_the_job(tmp_path: Path) -> None:
    project = render_cpu(tmp_path, "shell", nodes=2, samples=49152, epochs=1)
    env = node_env(
        tmp_path / "unused",
        NPU_WIZARD_STATUS_TOKEN=secrets.token_hex(16),
        NPU_WIZARD_HEARTBEAT_S="0.02",  # many small events: a shrunk buffer fills in a second
        PYTHONPATH=os.pathsep.join(filter(None, [str(SMALL_BUFFERS), os.environ.get("PYTHONPATH")])),
    )
    node0 = start_runner(project, "--node", "0", "--interval", "1", env=env)
    wait_for(lambda: run_dirs(project), 60, "node 0's run folder")
    node1 = start_runner(project, "--node", "1", "--interval", "1", env=env)
    try:
        node0_dir = run_dirs(project)[0]
        node1_dir = wait_for(lambda: run_dirs(project)[1:], 60, "node 1's run folder")[0]
        pids = {
            rank: wait_for(lambda r=rank, d=folder: started_pid(d, r), START_S, f"rank {rank} to train")
            for rank, folder in ((0, node0_dir), (1, node0_dir), (2, node1_dir), (3, node1_dir))
        }
        port = status_port(node0_dir)
        first = wait_for(
            lambda: (seen := client_ports(port)) and all(pid in seen for pid in pids.values()) and seen,
            60,
            "every rank's status connection",
        )
        os.kill(node0.pid, signal.SIGSTOP)
        try:
            # each rank's send blocks past the publisher's timeout, and it connects anew
            wait_for(
                lambda: (now := client_ports(port)) and all(now.get(pid, set()) - first[pid] for pid in pids.values()),
                120,
                "every rank to open a new status connection while the runner is stopped",
            )
        finally:
            os.kill(node0.pid, signal.SIGCONT)
        output, _ = node0.communicate(timeout=300)
        node1.communicate(timeout=120)
        assert not leftover_processes(project)
    finally:
        os.kill(node0.pid, signal.SIGCONT) if node0.poll() is None else None
        clean_up(project, node0, node1)
    assert node0.returncode == 0, output
    assert node1.returncode == 0
    summary = json.loads((node0_dir / "summary.json").read_text())
    assert summary["outcome"] == "finished"
    assert summary["status_stream"]["reconnected"] >= 4  # each rank came back at least once
    assert {info["state"] for info in summary["ranks"].values()} == {"finished"}


def test_1100_silent_connections_against_a_1024_descriptor_limit_do_not_stop_the_job(tmp_path: Path) -> None:
    project = render_cpu(tmp_path, "shell", samples=16384, epochs=1)

    def limited() -> None:  # the common default: 1024 descriptors, soft and hard
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))

    runner = subprocess.Popen(
        [sys.executable, "-m", "wizard", "run", str(project), "--plain", "--interval", "1"],
        env=node_env(tmp_path / "unused"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=limited,
    )
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 4096), max(hard, 4096)))
    silent: list[socket.socket] = []
    try:
        run_dir = wait_for(lambda: run_dirs(project), 60, "the run folder")[0]
        wait_for(lambda: started_pid(run_dir, 0), START_S, "rank 0 to train")
        port = wait_for(lambda: (run_dir / "run.json").is_file() and status_port(run_dir), 30, "the status port")
        for _ in range(1100):  # connect and never say a word
            try:
                silent.append(socket.create_connection(("127.0.0.1", port), timeout=10))
            except OSError:
                break  # the backlog is full: the runner is not accepting fast enough, which is its right
        output, _ = runner.communicate(timeout=300)
        assert not leftover_processes(project)
    finally:
        for client in silent:
            client.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        clean_up(project, runner)
    assert len(silent) >= 1100
    assert runner.returncode == 0, output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "finished"
    stream = summary["status_stream"]
    assert stream["timed_out"] + stream["turned_away"] > 0  # silent ones were closed to keep descriptors free


def test_a_runner_that_crashes_stops_its_job_first(tmp_path: Path) -> None:
    """`npu-wizard run P | head -3`: head exits, the runner's next line meets a broken pipe and it fails."""
    project = render_cpu(tmp_path, "shell", samples=65536, epochs=2)
    runner = subprocess.Popen(
        [sys.executable, "-m", "wizard", "run", str(project), "--plain", "--interval", "0.5"],
        env=node_env(tmp_path / "unused"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        run_dir = wait_for(lambda: run_dirs(project), 60, "the run folder")[0]
        wait_for(lambda: started_pid(run_dir, 1), START_S, "rank 1 to train")
        assert runner.stdout is not None
        runner.stdout.close()  # as `head` does once it has its lines
        _, errors = runner.communicate(timeout=120)
        assert runner.returncode != 0
        wait_for(lambda: not leftover_processes(project), 30, "every process of the job to be stopped")
    finally:
        clean_up(project, runner)
    assert "BrokenPipeError" in errors
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "failed"
    assert "npu-wizard run itself failed (BrokenPipeError" in summary["failure"]["summary"]
