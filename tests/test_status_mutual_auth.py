"""Issue 36, item 14: ranks and runner prove to each other that they hold the run's token, never sending it.

A local user who binds the status port after the runner died must learn
nothing from a rank that connects (not the token), and its asks must go
unanswered; the runner, in turn, lets in only a rank that proves the token.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

import pytest

from runtime import status
from runtime.status import StatusPublisher, on_ask
from tests.runs import wait_for
from wizard.monitor.status_server import StatusServer

# Mostly waiting (on a deadline, a socket, another process), little CPU: run early (tests/conftest.py)
pytestmark = pytest.mark.waits

TOKEN = "0123456789abcdef0123456789abcdef"


@pytest.fixture
def impostor() -> Iterator[socket.socket]:
    """A listener on a free loopback port, standing where the runner was."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(30)
    yield listener
    listener.close()
    status._handlers.clear()


def read_line(connection: socket.socket) -> bytes:
    """One line from `connection`, or what came before it closed."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = connection.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def read_to_end(connection: socket.socket) -> bytes:
    """Everything `connection` sends until it closes."""
    data = b""
    while chunk := connection.recv(4096):
        data += chunk
    return data


def test_a_rank_tells_an_impostor_at_the_status_address_nothing_and_obeys_no_ask(impostor: socket.socket) -> None:
    asked = threading.Event()
    on_ask("stacks", lambda ask: asked.set() or {"stacks": "secret"})
    publisher = StatusPublisher(impostor.getsockname(), 0, TOKEN)
    try:
        connection, _ = impostor.accept()
        connection.settimeout(30)
        with connection:
            first = read_line(connection)
            assert TOKEN.encode() not in first
            # a challenge it cannot prove, and an ask right behind it
            connection.sendall(b'{"nonce": "ab", "proof": "00"}\n{"ask": "stacks", "id": "x"}\n')
            rest = read_to_end(connection)  # the rank closes: the runner did not prove the token
        assert TOKEN.encode() not in rest
        assert b"hello" not in first + rest  # not even who it is
        assert not asked.is_set()
    finally:
        publisher.close()


def test_a_rank_and_the_runner_prove_the_token_to_each_other_and_events_flow() -> None:
    server = StatusServer("127.0.0.1", 0, TOKEN)
    publisher = StatusPublisher(("127.0.0.1", server.bound_port), 2, TOKEN)
    try:
        publisher.publish({"event": "heartbeat", "time": 1.0, "rank": 2})
        wait_for(lambda: server.connected_ranks() == {2}, 60, "the rank to get in")
    finally:
        publisher.close()
        server.close()


def test_a_client_that_answers_the_challenge_wrongly_is_refused() -> None:
    server = StatusServer("127.0.0.1", 0, TOKEN)
    try:
        client = socket.create_connection(("127.0.0.1", server.bound_port), timeout=30)
        with client:
            client.sendall(b'{"nonce": "' + b"c" * 32 + b'"}\n')
            challenge = json.loads(read_line(client))
            assert TOKEN not in json.dumps(challenge)
            assert challenge["proof"] == status.proof(TOKEN, "runner", "c" * 32, challenge["nonce"])
            client.sendall(b'{"proof": "' + b"0" * 64 + b'"}\n{"event": "hello", "rank": 0, "time": 1.0}\n')
            assert read_to_end(client) == b""
        wait_for(lambda: server.counts.rejected_connections == 1, 30, "the wrong proof to be refused")
        assert server.drain() == []
    finally:
        server.close()


def test_a_client_that_proves_the_token_by_hand_gets_in() -> None:
    server = StatusServer("127.0.0.1", 0, TOKEN)
    try:
        client = socket.create_connection(("127.0.0.1", server.bound_port), timeout=30)
        with client:
            client.sendall(b'{"nonce": "' + b"d" * 32 + b'"}\n')
            challenge = json.loads(read_line(client))
            answer = status.proof(TOKEN, "rank", challenge["nonce"], "d" * 32)
            client.sendall(json.dumps({"proof": answer}).encode() + b'\n{"event": "hello", "rank": 1, "time": 1.0}\n')
            wait_for(lambda: server.connected_ranks() == {1}, 30, "the rank to get in")
    finally:
        server.close()
