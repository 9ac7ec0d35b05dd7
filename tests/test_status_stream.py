"""Node 0's status stream under hostile or heavy input: tokens, bad lines, bursts, bounded memory.

A real server on 127.0.0.1 and real sockets; the monitor's model fed directly.
"""

from __future__ import annotations

import json
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.status import ENV_STATUS_ADDR, ENV_STATUS_TOKEN, publisher_from_env
from tests.runs import wait_for
from wizard.monitor.ranks import LOSS_HISTORY
from wizard.monitor.state import JobState
from wizard.monitor.status_server import MAX_LINE_BYTES, StatusServer
from wizard.run.intake import Intake

# Mostly waiting (on a deadline, a socket, another process), little CPU: run early (tests/conftest.py)
pytestmark = pytest.mark.waits

TOKEN = "0123456789abcdef0123456789abcdef"


@pytest.fixture
def server() -> Iterator[StatusServer]:
    """A status server on a free loopback port, closed after the test."""
    listening = StatusServer("127.0.0.1", 0, TOKEN)
    yield listening
    listening.close()


def connect(server: StatusServer, *lines: bytes) -> socket.socket:
    """A client connection that sends `lines` at once."""
    host, port = server.address.rsplit(":", 1)
    client = socket.create_connection((host, int(port)), timeout=30)
    client.sendall(b"".join(lines))
    return client


def wire(record: dict) -> bytes:
    """One line of the wire format."""
    return (json.dumps(record) + "\n").encode()


def event(rank: int, kind: str = "heartbeat", **fields: object) -> bytes:
    """A rank's event as a line."""
    return wire({"event": kind, "time": time.time(), "rank": rank, **fields})


AUTH = wire({"token": TOKEN})


def drained(server: StatusServer, count: int, what: str) -> list[dict]:
    """Drain until `count` events arrived (a loaded machine may take a while)."""
    seen: list[dict] = []
    wait_for(lambda: seen.extend(server.drain()) or len(seen) >= count, 60, what)
    return seen


def closed_by_server(client: socket.socket) -> bool:
    """Whether the server closed this connection (recv sees the end)."""
    client.settimeout(30)
    try:
        return client.recv(1) == b""
    except ConnectionResetError:
        return True


# ---- bad lines are dropped and counted, never fatal ------------------------------------


def test_a_deeply_nested_line_is_dropped_and_counted_and_the_stream_goes_on(server: StatusServer) -> None:
    bomb = b"[" * 200_000 + b"]" * 200_000 + b"\n"
    client = connect(server, AUTH, event(0), bomb, event(0, "step", step=1))
    events = drained(server, 2, "the events around the nested line")
    assert [e["event"] for e in events] == ["heartbeat", "step"]
    assert server.counts.dropped_lines == 1
    other = connect(server, AUTH, event(1))  # the server thread is alive: a new rank is heard
    assert drained(server, 1, "a later rank")[0]["rank"] == 1
    client.close(), other.close()


def test_a_line_nested_past_the_events_but_within_what_json_reads_is_dropped_too(server: StatusServer) -> None:
    """json's RecursionError covers only a line nested past the interpreter's recursion limit (the bomb above):
    json reads a line nested 900 deep, whose event would reach the runner, which writes a remote rank's events
    again (json.dumps, deeper in its own stack) and there would meet the RecursionError the server escaped. The
    server's own depth bound (MAX_DEPTH) drops it (issue 36 item 32: the bound stays)."""
    deep = b'{"event": "step", "rank": 0, "step": 1, "x": ' + b"[" * 900 + b"]" * 900 + b"}\n"
    json.loads(deep)  # within what json reads
    client = connect(server, AUTH, event(0), deep, event(0, "step", step=2))
    assert [e.get("step") for e in drained(server, 2, "the events around the nested line")] == [None, 2]
    assert server.counts.dropped_lines == 1
    client.close()


def test_nesting_inside_strings_does_not_count(server: StatusServer) -> None:
    client = connect(server, AUTH, event(0, "error", message="[" * 100 + "{" * 100))
    assert drained(server, 1, "the error event")[0]["message"].startswith("[[[")
    assert server.counts.dropped_lines == 0
    client.close()


def test_an_overlong_line_is_dropped_and_counted(server: StatusServer) -> None:
    huge = b'{"event": "step", "rank": 0, "pad": "' + b"x" * (MAX_LINE_BYTES + 10) + b'"}\n'
    client = connect(server, AUTH, huge, event(0, "step", step=2))
    assert [e.get("step") for e in drained(server, 1, "the event after the long line")] == [2]
    assert server.counts.dropped_lines == 1
    client.close()


def test_lines_that_are_no_event_are_dropped_and_counted(server: StatusServer) -> None:
    junk = [b"not json\n", b"[1, 2]\n", wire({"event": "step"}), wire({"rank": "0", "event": "x"})]
    client = connect(server, AUTH, *junk, event(0))
    assert len(drained(server, 1, "the good event")) == 1
    assert server.counts.dropped_lines == len(junk)
    client.close()


# ---- only the job's ranks may speak ---------------------------------------------------


@pytest.mark.parametrize(
    "first_line",
    [event(0, "error", type="RuntimeError", message="forged"), wire({"token": "guess"}), wire({"token": 1}), b"\n"],
    ids=["no-token", "wrong-token", "not-a-string", "empty-line"],
)
def test_a_client_without_the_run_token_is_closed_and_counted(server: StatusServer, first_line: bytes) -> None:
    client = connect(server, first_line, event(0, "error", type="RuntimeError", message="forged"))
    assert closed_by_server(client)
    assert server.drain() == []
    assert server.counts.rejected_connections == 1
    client.close()


def test_the_rank_publisher_presents_the_token_from_its_environment(server: StatusServer) -> None:
    env = {ENV_STATUS_ADDR: server.address, ENV_STATUS_TOKEN: TOKEN}
    publisher = publisher_from_env(3, env)
    assert publisher is not None
    publisher.publish({"event": "step", "time": time.time(), "rank": 3, "step": 7})
    publisher.close()
    events = drained(server, 3, "hello, step and bye")
    assert [(e["event"], e["rank"]) for e in events] == [("hello", 3), ("step", 3), ("bye", 3)]

    intruder = publisher_from_env(4, {**env, ENV_STATUS_TOKEN: "f" * 32})
    assert intruder is not None
    intruder.close()
    # refused, it tries again every RETRY_S until its process ends: a test held up past that sees 2 or more
    wait_for(lambda: server.counts.rejected_connections >= 1, 30, "the wrong token to be refused")
    assert server.drain() == []


# ---- a burst of connections is accepted in full ----------------------------------------


def test_a_burst_of_2048_connections_is_accepted_in_full(server: StatusServer) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    ranks = 2048
    if hard != resource.RLIM_INFINITY and hard < 2 * ranks + 64:
        pytest.skip(f"needs {2 * ranks + 64} open files; the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2 * ranks + 64), hard))
    host, port = server.address.rsplit(":", 1)
    clients = []
    try:
        for _ in range(ranks):  # connect them all before the server reads a byte of any
            client = socket.socket()
            client.connect((host, int(port)))
            clients.append(client)
        for rank, client in enumerate(clients):
            client.sendall(AUTH + event(rank, "hello"))
        heard = {e["rank"] for e in drained(server, ranks, f"{ranks} hellos")}
        assert heard == set(range(ranks))
        assert server.counts.accepted == ranks
    finally:
        for client in clients:
            client.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# ---- the monitor's memory is bounded; missing ranks are named --------------------------


def test_a_ranks_history_is_bounded_and_its_overall_rate_exact() -> None:
    state = JobState(1)
    state.ingest({"event": "started", "time": 0.5, "rank": 0, "world_size": 1, "pid": 9})
    for step in range(1, 20_001):
        state.ingest(
            {
                "event": "step",
                "time": float(step),
                "rank": 0,
                "step": step,
                "loss": 1 / step,
                "samples_per_s": 100.0 if step % 2 else 300.0,
            }
        )
        state.ingest({"event": "heartbeat", "time": step + 0.5, "rank": 0, "step": step})
    view = state.ranks[0]
    assert len(view.losses) == LOSS_HISTORY and list(view.losses)[-2:] == [1 / 19_999, 1 / 20_000]
    assert view.overall_rate == pytest.approx(150.0)  # harmonic mean: equal samples at 100 and 300 samples/s
    assert len(view.newest) == 3  # one timestamp per event kind, not one per event
    state.ingest({"event": "step", "time": 20_000.0, "rank": 0, "step": 20_000, "loss": 9.0})
    assert view.loss == 1 / 20_000  # the same event again (from the file after the stream) counts once


def layout(now: list[float]) -> JobState:
    """Two nodes of two ranks each, a 180 s start-up deadline, a settable clock."""
    return JobState(4, nodes=2, start_deadline=180.0, clock=lambda: now[0])


def test_ranks_still_starting_at_the_deadline_are_named_with_their_node() -> None:
    now = [1000.0]
    state = layout(now)
    state.ingest({"event": "hello", "time": 1001.0, "rank": 0, "pid": 11})
    state.ingest({"event": "started", "time": 1002.0, "rank": 1, "pid": 12, "node": 0, "world_size": 4})
    now[0] = 1180.0
    assert state.late() == [] and state.late_report() == ""
    now[0] = 1181.0
    assert state.late() == [0, 2, 3]
    assert state.late_report().splitlines() == [
        "node 1 never joined: no status from its ranks 2, 3 within 180s",
        "rank 0 (node 0) is still starting after 180s (process 11: waiting for the other ranks at init?)",
    ]


def test_a_rank_partly_missing_from_a_node_is_named_alone() -> None:
    now = [0.0]
    state = layout(now)
    for rank in (0, 1, 2):
        state.ingest({"event": "started", "time": 1.0, "rank": rank, "node": rank // 2, "world_size": 4})
    now[0] = 200.0
    assert state.late_report() == "rank 3 (node 1): no status within 180s"


def test_a_runner_that_hears_only_its_own_node_counts_only_its_ranks_at_the_deadline() -> None:
    now = [0.0]
    state = layout(now)
    state.expected = {2, 3}  # node 1's runner: node 0's ranks report to node 0 only
    state.ingest({"event": "started", "time": 1.0, "rank": 2, "node": 1, "world_size": 4})
    now[0] = 200.0
    assert state.late() == [3]


# ---- nothing a peer sends or withholds can stop the serving loop -----------------------


def test_a_token_with_a_lone_surrogate_is_refused_and_the_stream_goes_on(server: StatusServer) -> None:
    hostile = connect(server, b'{"token": "\\ud800"}\n')
    assert closed_by_server(hostile)
    rank = connect(server, AUTH, event(1))  # the serving thread is alive: a later rank is heard
    assert drained(server, 1, "the rank after the hostile token")[0]["rank"] == 1
    assert server.counts.rejected_connections == 1
    hostile.close(), rank.close()


def test_silent_connections_are_closed_at_the_authentication_deadline() -> None:
    listening = StatusServer("127.0.0.1", 0, TOKEN, auth_deadline=0.5)
    try:
        silent = [connect(listening) for _ in range(20)]
        assert all(closed_by_server(client) for client in silent)
        assert listening.counts.timed_out == 20
        rank = connect(listening, AUTH, event(2))
        assert drained(listening, 1, "a rank after the silent ones")[0]["rank"] == 2
        for client in (*silent, rank):
            client.close()
    finally:
        listening.close()


def test_past_the_pending_cap_the_oldest_silent_connection_gives_way() -> None:
    listening = StatusServer("127.0.0.1", 0, TOKEN, max_pending=8)
    try:
        silent = [connect(listening) for _ in range(12)]
        assert all(closed_by_server(client) for client in silent[:4])  # the four oldest
        rank = connect(listening, AUTH, event(5))
        assert drained(listening, 1, "a rank past the cap")[0]["rank"] == 5
        assert listening.counts.turned_away >= 5
        for client in (*silent, rank):
            client.close()
    finally:
        listening.close()


def hello(rank: int, pid: int) -> bytes:
    return event(rank, "hello", pid=pid)


def test_a_rank_whose_connection_comes_back_within_the_grace_is_not_lost() -> None:
    listening = StatusServer("127.0.0.1", 0, TOKEN, loss_grace=3.0)
    try:
        first = connect(listening, AUTH, hello(3, 4242))
        drained(listening, 1, "the first hello")
        first.close()  # a send timed out: the publisher drops the connection...
        second = connect(listening, AUTH, hello(3, 4242), event(3, "step", step=9))  # ...and opens a new one
        events = drained(listening, 2, "the second connection's events")
        wait_for(lambda: listening.counts.reconnected == 1, 30, "the reconnect to be counted")
        # a rank that drops later and never comes back: once its loss is reported, rank 3's grace is over too
        sentinel = connect(listening, AUTH, hello(7, 4343))
        events += drained(listening, 1, "the sentinel's hello")
        sentinel.close()
        events += drained(listening, 1, "the sentinel's loss")
        assert [(e["event"], e["rank"]) for e in events] == [("hello", 3), ("step", 3), ("hello", 7), ("lost", 7)]
        second.close()
    finally:
        listening.close()


def test_a_rank_whose_connection_does_not_come_back_is_lost_after_the_grace() -> None:
    listening = StatusServer("127.0.0.1", 0, TOKEN, loss_grace=1.0)
    try:
        client = connect(listening, AUTH, hello(6, 4343))
        drained(listening, 1, "the hello")
        client.close()
        ended = time.time()
        (lost,) = drained(listening, 1, "the lost event")
        assert (lost["event"], lost["rank"], lost["pid"]) == ("lost", 6, 4343)
        assert time.time() - ended >= 0.9  # not before the grace
        assert lost["time"] <= ended + 1  # stamped when the connection ended, not when the grace ran out
    finally:
        listening.close()


def test_a_new_process_of_the_rank_does_not_cancel_the_loss_of_the_old_one() -> None:
    listening = StatusServer("127.0.0.1", 0, TOKEN, loss_grace=1.0)
    try:
        old = connect(listening, AUTH, hello(1, 100))
        drained(listening, 1, "the old process's hello")
        old.close()
        new = connect(listening, AUTH, hello(1, 200))  # a restarted worker is another process
        events = drained(listening, 2, "the new hello and the old process's loss")
        assert sorted((e["event"], e["pid"]) for e in events) == [("hello", 200), ("lost", 100)]
        new.close()
        # the monitor keeps watching the new process: the old one's loss does not fail the rank
        state = JobState(2)
        state.ingest_all(sorted(events, key=lambda e: e["event"] == "lost"))
        assert state.ranks[1].outcome is None and state.ranks[1].pid == 200
        assert state.root_cause() is None
    finally:
        listening.close()


def test_a_stranger_cannot_make_the_runner_hold_more_than_a_token_line(server: StatusServer) -> None:
    # many such connections held 256 KiB each: before authentication a connection may send 4 KiB at most
    stranger = connect(server, b"{" + b" " * (16 * 1024))
    assert closed_by_server(stranger)
    assert server.counts.rejected_connections == 1
    stranger.close()
    rank = connect(server, AUTH, event(0, "started"))
    assert [e["event"] for e in drained(server, 1, "a rank's event after the stranger")] == ["started"]
    rank.close()


def test_of_ranks_found_gone_in_one_look_the_first_to_die_is_the_root_cause(tmp_path: Path) -> None:
    # torchrun stops rank 2 after rank 3 was killed; the runner may see both gone in the same look
    listening = StatusServer("127.0.0.1", 0, TOKEN, loss_grace=600.0)
    processes = {rank: subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) for rank in (2, 3)}
    try:
        state = JobState(4)
        intake = Intake(state, tmp_path)
        intake.server, intake.local_ranks = listening, {2, 3}
        pids = {rank: processes[rank].pid for rank in (2, 3)}
        started = {rank: event(rank, "started", pid=pids[rank], node=1, local_rank=rank - 2) for rank in (2, 3)}
        clients = {rank: connect(listening, AUTH, started[rank]) for rank in (2, 3)}
        wait_for(lambda: intake.ingest() or all(state.view(rank).pid for rank in (2, 3)), 60, "both ranks started")
        for rank in (3, 2):  # rank 3 dies first, then rank 2
            processes[rank].kill()
            processes[rank].wait()
            clients[rank].close()
            wait_for(lambda rank=rank: (rank, processes[rank].pid) in listening.ended(), 60, f"rank {rank}'s end")
        intake.look(time.time())
        assert [failure.rank for failure in state.failures()] == [3, 2]
        assert state.root_cause().rank == 3
    finally:
        for process in processes.values():
            process.kill()
            process.wait()
        listening.close()


def connect_from(server: StatusServer, source: str, *lines: bytes) -> socket.socket:
    """A client connection from the loopback address `source` (127.0.0.0/8 is all this host's)."""
    host, port = server.address.rsplit(":", 1)
    client = socket.create_connection((host, int(port)), timeout=30, source_address=(source, 0))
    client.sendall(b"".join(lines))
    return client


def test_a_flood_from_one_address_evicts_its_own_connections_not_a_starting_rank() -> None:
    listening = StatusServer("127.0.0.1", 0, TOKEN, max_pending=8)
    try:
        starting = connect_from(listening, "127.0.0.2")  # a rank that has not shown the token yet
        wait_for(lambda: listening.counts.accepted == 1, 30, "the rank's connection accepted")
        flood = [connect_from(listening, "127.0.0.3") for _ in range(20)]
        assert all(closed_by_server(client) for client in flood[:12])  # the flood's oldest gave way
        starting.sendall(AUTH + event(4))
        assert drained(listening, 1, "the starting rank after the flood")[0]["rank"] == 4
        for client in (*flood, starting):
            client.close()
    finally:
        listening.close()
