"""The root cause a failing job is judged by, when the last look came just before a rank was killed.

A rank killed with SIGKILL says nothing; its peer's next collective fails with
"connection reset by peer", an error that names no cause of its own. On a
loaded host the peer's launcher can exit before the runner looks for gone
processes again, and before the status stream reads the killed rank's
connection end: the runner must still name the killed rank, not its peer.
Real processes and a real status stream on loopback: the killed rank is a
child of this test that has ended; its connection stays open.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.runs import wait_for
from wizard.monitor.state import JobState
from wizard.monitor.status_server import StatusServer
from wizard.run.intake import Intake

RESET = (
    "[gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:10165: Connection reset by peer. "
    "This is typically caused by a remote worker hanging or bugs in the application."
)


TOKEN = "0123456789abcdef0123456789abcdef"


def wire(rank: int, kind: str, **fields: object) -> bytes:
    """One event of a rank as a line of the status stream."""
    return (json.dumps({"event": kind, "time": time.time(), "rank": rank, **fields}) + "\n").encode()


def ended_process() -> int:
    """The pid of a process of this host that has ended (and was reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=60)
    return child.pid


Job = tuple[Intake, StatusServer, list[socket.socket]]


@pytest.fixture
def job(tmp_path: Path) -> Iterator[Job]:
    """A runner's intake of a 2-rank job, both ranks on this host, with its status stream (the runner's own)."""
    server = StatusServer("127.0.0.1", 0, TOKEN, loss_grace=600.0)
    intake = Intake(JobState(2), tmp_path)
    intake.server, intake.local_ranks = server, {0, 1}
    clients: list[socket.socket] = []
    yield intake, server, clients
    for client in clients:
        client.close()
    server.close()


def connect(server: StatusServer, clients: list[socket.socket], *lines: bytes) -> None:
    """A rank's connection to the stream, its token and `lines` sent; kept open in `clients`."""
    host, port = server.address.rsplit(":", 1)
    client = socket.create_connection((host, int(port)), timeout=30)
    client.sendall((json.dumps({"token": TOKEN}) + "\n").encode() + b"".join(lines))
    clients.append(client)


def heard(intake: Intake, rank: int, outcome_or_pid: str) -> bool:
    """Whether the intake has heard rank `rank`'s pid (`pid`) or how it ended (`outcome`)."""
    intake.ingest()
    view = intake.state.ranks.get(rank)
    return view is not None and (view.pid is not None if outcome_or_pid == "pid" else view.outcome is not None)


def start_both(job: Job, rank_1_pid: int) -> None:
    """Rank 0 (this process) and rank 1 (`rank_1_pid`) connect and start; returns once the intake heard both."""
    intake, server, clients = job
    connect(server, clients, wire(0, "started", pid=os.getpid(), node=0, local_rank=0))
    connect(server, clients, wire(1, "started", pid=rank_1_pid, node=1, local_rank=0))
    wait_for(lambda: heard(intake, 0, "pid") and heard(intake, 1, "pid"), 60, "both ranks started")


def test_a_rank_gone_since_the_last_look_is_the_root_cause_not_its_peers_reset(job: Job) -> None:
    intake, _, clients = job
    killed = ended_process()
    start_both(job, killed)  # rank 1's connection stays open: the stream has not read its end (a loaded host)
    clients[0].sendall(wire(0, "error", pid=os.getpid(), type="RuntimeError", message=RESET, traceback=""))
    wait_for(lambda: heard(intake, 0, "outcome"), 60, "rank 0's error")  # the last look: rank 1 not yet gone

    cause = intake.settled_root_cause(time.time())

    assert cause is not None
    assert (cause.rank, cause.kind) == (1, "vanished"), cause
    assert cause.summary.startswith(f"its process {killed} vanished without an error")
    peer = [failure for failure in intake.state.failures() if failure.rank == 0]
    assert peer and peer[0].secondary, "the peer's reset is still reported, as caused by another rank"


def test_a_rank_that_said_it_finished_and_ended_is_no_failure(job: Job) -> None:
    intake, _, clients = job
    done = ended_process()
    start_both(job, done)
    clients[1].sendall(wire(1, "finished", pid=done, step=8, exit_code=0))
    clients[0].sendall(wire(0, "error", pid=os.getpid(), type="ValueError", message="bad batch", traceback=""))
    wait_for(lambda: heard(intake, 0, "outcome") and heard(intake, 1, "outcome"), 60, "both ranks' last word")

    cause = intake.settled_root_cause(time.time())

    assert cause is not None and (cause.rank, cause.kind) == (0, "error"), cause
    assert [failure.rank for failure in intake.state.failures()] == [0]


def test_a_silent_rank_whose_launcher_exited_0_is_no_failure(job: Job) -> None:
    """A script that ends with os._exit(0) says nothing; its node's launcher exiting 0 is believed."""
    intake, _, clients = job
    quiet = ended_process()
    start_both(job, quiet)
    clients[0].sendall(wire(0, "error", pid=os.getpid(), type="ValueError", message="bad batch", traceback=""))
    wait_for(lambda: heard(intake, 0, "outcome"), 60, "rank 0's error")

    cause = intake.settled_root_cause(time.time(), ended_well=[1])

    assert cause is not None and (cause.rank, cause.kind) == (0, "error"), cause
    assert [failure.rank for failure in intake.state.failures()] == [0]


def test_without_the_status_stream_a_local_rank_gone_now_is_left_to_the_next_look(tmp_path: Path) -> None:
    """Without the stream this runner hears no other node: the rank may have been stopped by its launcher."""
    killed = ended_process()
    events = tmp_path / "events"
    events.mkdir()
    for rank, pid in ((0, os.getpid()), (1, killed)):
        (events / f"rank-{rank}.jsonl").write_bytes(wire(rank, "started", pid=pid, node=rank, local_rank=0))
    intake = Intake(JobState(2), tmp_path)
    intake.local_ranks = {0, 1}
    intake.ingest()
    with (events / "rank-0.jsonl").open("ab") as handle:
        handle.write(wire(0, "error", pid=os.getpid(), type="RuntimeError", message=RESET, traceback=""))

    cause = intake.settled_root_cause(time.time())

    assert cause is not None and (cause.rank, cause.kind) == (0, "error"), cause
    intake.look(time.time())  # a look still finds it gone, as before
    assert [failure.rank for failure in intake.state.failures()] == [0, 1]
