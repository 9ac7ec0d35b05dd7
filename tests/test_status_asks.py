"""The status stream carries the runner's asks to the ranks and their answers back (issue 28).

The runner writes {"ask": NAME, "id": ...} down a rank's authenticated
connection; the rank's publisher hands it to the handler the runtime registered
for NAME and publishes the answer, in parts when it is longer than a line of
the stream may be; the runner's Intake joins the parts and keeps the answers
apart from the events the job's state folds in.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime import status
from runtime.status import ANSWER_PART_CHARS, StatusPublisher, on_ask
from tests.runs import wait_for
from wizard.monitor.state import JobState
from wizard.monitor.status_server import MAX_LINE_BYTES, StatusServer
from wizard.run.intake import Intake

# Mostly waiting (on a deadline, a socket, another process), little CPU: run early (tests/conftest.py)
pytestmark = pytest.mark.waits

TOKEN = "0123456789abcdef0123456789abcdef"


@pytest.fixture
def stream(tmp_path: Path) -> Iterator[tuple[Intake, list[StatusPublisher]]]:
    """A status server in an Intake and two ranks' publishers connected to it, with no ask handler registered yet.

    The handlers are the process's: a test run before in the same worker may have left one (runtime.profile_window
    registers "profile" when it is imported with a straggler plan in the environment)."""
    status._handlers.clear()
    intake = Intake(JobState(2), tmp_path)
    intake.server = StatusServer("127.0.0.1", 0, TOKEN)
    publishers = [StatusPublisher(("127.0.0.1", intake.server.bound_port), rank, TOKEN) for rank in (0, 1)]
    for publisher in publishers:
        publisher.publish({"event": "heartbeat", "time": 1.0, "rank": publisher.rank, "pid": os.getpid()})
    wait_for(lambda: intake.server.connected_ranks() == {0, 1}, 60, "both ranks to connect")
    yield intake, publishers
    for publisher in publishers:
        publisher.close()
    intake.close()
    status._handlers.clear()


def answers(intake: Intake, ask_id: str, count: int) -> dict[int, dict]:
    """What the ranks answered to `ask_id`, once `count` of them did."""

    def arrived() -> dict[int, dict] | None:
        intake.ingest()
        got = intake.answers.received(ask_id)
        return got if len(got) >= count else None

    return wait_for(arrived, 60, f"{count} answers to {ask_id}")


def test_every_rank_answers_an_ask_with_what_its_handler_returns(stream: tuple[Intake, list]) -> None:
    intake, _ = stream
    on_ask("echo", lambda ask: {"said": ask["word"], "who": ask["rank"]})
    ask_id = intake.ask("echo", word="hello")
    got = answers(intake, ask_id, 2)
    assert {rank: (a["said"], a["who"], a["event"], a["id"]) for rank, a in got.items()} == {
        0: ("hello", 0, "echo", ask_id),
        1: ("hello", 1, "echo", ask_id),
    }
    # answers are not events of the job: the state never saw them
    assert all("echo" not in view.newest for view in intake.state.ranks.values())


def test_an_answer_longer_than_a_line_of_the_stream_arrives_whole_in_parts(stream: tuple[Intake, list]) -> None:
    intake, _ = stream
    big = "\u00e9\n" * (MAX_LINE_BYTES // 2)  # 6 bytes a character once written as JSON: parts are a must
    on_ask("big", lambda ask: {"text": big})
    ask_id = intake.ask("big")
    got = answers(intake, ask_id, 2)
    assert [got[rank]["text"] == big for rank in (0, 1)] == [True, True]
    assert len(big) > ANSWER_PART_CHARS
    assert intake.server.counts.dropped_lines == 0


def test_an_ask_no_handler_takes_is_answered_with_an_error_not_silence(stream: tuple[Intake, list]) -> None:
    intake, _ = stream
    ask_id = intake.ask("profile", steps=3)
    got = answers(intake, ask_id, 2)
    assert got[0]["error"] == "this rank answers no 'profile'"


def test_a_handler_that_raises_is_reported_and_the_rank_goes_on(stream: tuple[Intake, list]) -> None:
    intake, publishers = stream

    def broken(ask: dict) -> dict:
        raise RuntimeError("no recorder here")

    on_ask("stacks", broken)
    ask_id = intake.ask("stacks")
    assert answers(intake, ask_id, 2)[1]["error"] == "RuntimeError: no recorder here"
    on_ask("stacks", lambda ask: {"fine": True})
    assert answers(intake, intake.ask("stacks"), 2)[1]["fine"] is True


def test_only_the_ranks_asked_answer(stream: tuple[Intake, list]) -> None:
    intake, _ = stream
    on_ask("echo", lambda ask: {"ok": 1})
    request = intake.answers.open("echo")
    intake.server.ask(request, ranks={1})
    assert set(answers(intake, request["id"], 1)) == {1}
    intake.ingest()
    assert set(intake.answers.received(request["id"])) == {1}


def test_an_ask_without_a_name_is_refused_at_once(stream: tuple[Intake, list]) -> None:
    intake, _ = stream
    with pytest.raises(ValueError, match="an ask needs a string 'ask'"):
        intake.server.ask({"id": "x"})


def test_a_flood_of_asks_is_answered_one_at_a_time_not_by_a_thread_each(stream: tuple[Intake, list]) -> None:
    # A peer at the status address may send asks as fast as it likes: each kind is answered once at a time.
    intake, publishers = stream
    release = threading.Event()
    on_ask("slow", lambda ask: {"done": release.wait(60)})
    threads_before = threading.active_count()
    first = intake.ask("slow", ranks={0})
    flood = [intake.ask("slow", ranks={0}) for _ in range(200)]
    busy = answers(intake, flood[-1], 1)[0]
    assert busy["error"] == "this rank is still answering 'slow'"
    assert threading.active_count() - threads_before <= 2  # the one answering, not one per ask
    release.set()
    assert answers(intake, first, 1)[0]["done"] is True


def test_parts_nested_past_what_json_reads_are_no_answer_and_no_crash(stream: tuple[Intake, list]) -> None:
    # The server checks a line's depth outside strings; an answer's parts are strings, joined by the runner.
    intake, _ = stream
    ask_id = intake.ask("deep", ranks={0})
    text = "[" * 200_000 + "]" * 200_000
    parts = [text[i : i + ANSWER_PART_CHARS] for i in range(0, len(text), ANSWER_PART_CHARS)]
    for index, part in enumerate(parts):
        event = {"event": "deep", "id": ask_id, "rank": 0, "parts": len(parts), "part": index, "text": part}
        assert intake.answers.take(event)
    assert intake.answers.received(ask_id)[0]["error"] == "its answer's parts did not join"


def test_asks_are_read_from_a_descriptor_past_1024(tmp_path: Path) -> None:
    # select.select refuses descriptors past FD_SETSIZE: a rank late in a run holds many (loaders, sockets).
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"this machine allows {hard} descriptors")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    intake = Intake(JobState(1), tmp_path)
    intake.server = StatusServer("127.0.0.1", 0, TOKEN)
    publisher = StatusPublisher(("127.0.0.1", intake.server.bound_port), 0, TOKEN)
    try:
        publisher.publish({"event": "heartbeat", "time": 1.0, "rank": 0, "pid": os.getpid()})
        wait_for(lambda: intake.server.connected_ranks() == {0}, 60, "the rank to connect")
        assert publisher._socket is not None and publisher._socket.fileno() >= 1024
        on_ask("echo", lambda ask: {"said": "past 1024"})
        assert answers(intake, intake.ask("echo"), 1)[0]["said"] == "past 1024"
    finally:
        publisher.close()
        intake.close()
        status._handlers.clear()
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


PAD = 64 * 1024


def waiting_for_rank_0(server: StatusServer) -> int:
    """The bytes of asks the server holds for rank 0, not yet taken by its socket (read from the test's thread)."""
    peers = [key.data for key in list(server._selector.get_map().values()) if key.data is not None]
    return sum(len(peer.outbox) for peer in peers if peer.rank == 0)


def test_an_ask_the_socket_takes_in_part_goes_on_whole_and_the_next_ask_arrives_intact() -> None:
    """A send that takes part of an ask line keeps the rest for the next round: no torn line garbles the next ask."""
    server = StatusServer("127.0.0.1", 0, TOKEN, send_buffer=4096)
    rank = socket.socket()
    rank.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        rank.connect(("127.0.0.1", server.bound_port))
        rank.sendall(json.dumps({"token": TOKEN}).encode() + b"\n")
        rank.sendall(json.dumps({"event": "heartbeat", "rank": 0, "time": 1.0, "pid": os.getpid()}).encode() + b"\n")
        wait_for(lambda: server.connected_ranks() == {0}, 60, "the rank to connect")
        server.ask({"ask": "big", "id": "first", "pad": "x" * PAD})  # more than both buffers hold
        wait_for(lambda: 0 < waiting_for_rank_0(server) < PAD, 60, "the first ask to be under way, in part")
        server.ask({"ask": "small", "id": "second"})
        received = b""
        rank.settimeout(60.0)  # a deadline only: a server that never sends the rest fails here
        while received.count(b"\n") < 2:
            try:
                chunk = rank.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            received += chunk
        lines = received.split(b"\n")
        whole = received.count(b"\n")
        assert whole == 2, f"{whole} whole line(s) in {len(received)} bytes"
        assert [json.loads(line)["id"] for line in lines[:2]] == ["first", "second"]
    finally:
        rank.close()
        server.close()
