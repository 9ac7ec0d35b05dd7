"""Each rank's events, streamed to the run's monitor on the master node.

The monitor on node 0 must see the ranks of every node without a shared
filesystem. When `npu-wizard run` starts the job it sets
NPU_WIZARD_STATUS_ADDR=<master address>:<port>, where node 0's runner listens,
and NPU_WIZARD_STATUS_TOKEN, the run's secret; each rank connects, presents
the token on the first line and a `hello` (rank and pid) on the second, then
sends every event it writes as one JSON line. A send that blocks for RETRY_S
(the monitor paused, a busy host, a network blip) drops the connection and
opens a new one, which says `hello` again: the monitor takes a connection that
comes back for the same rank and pid as the same process. A rank that ends
cleanly says `bye` first, so a connection that drops without it, and does not
come back, tells the monitor that the rank's process died. Sending happens on a
daemon thread from a bounded queue: a slow or absent monitor never stalls
training, and events it misses are only missed.
"""

from __future__ import annotations

import collections
import json
import os
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any

ENV_STATUS_ADDR = "NPU_WIZARD_STATUS_ADDR"
ENV_STATUS_TOKEN = "NPU_WIZARD_STATUS_TOKEN"
TOKEN_FIELD = "token"
HELLO, BYE, LOST = "hello", "bye", "lost"
QUEUE_LIMIT = 1000
RETRY_S = 2.0
CLOSE_WAIT_S = 2.0
# test-only: shrink each status socket's buffers to this many bytes, so that a
# paused monitor fills them in seconds (tests/test_status_reconnect.py)
ENV_TEST_BUFFER = "NPU_WIZARD_TEST_STATUS_BUFFER"


def test_buffer_size(env: Mapping[str, str] = os.environ) -> int | None:
    """The socket buffer size a test asked for with NPU_WIZARD_TEST_STATUS_BUFFER, else None."""
    value = env.get(ENV_TEST_BUFFER, "")
    return int(value) if value.isdigit() and value.isascii() else None


def parse_address(value: str) -> tuple[str, int]:
    """`host:port` (or `[v6]:port`) as a (host, port) pair."""
    host, _, port = value.rpartition(":")
    return host.strip("[]"), int(port)


def encode(record: Mapping[str, Any]) -> bytes:
    """One event as a line of the wire format."""
    return (json.dumps(record, default=str) + "\n").encode()


class StatusPublisher:
    """Sends one rank's events to the monitor from a daemon thread."""

    def __init__(self, address: tuple[str, int], rank: int, token: str = "") -> None:
        self.address = address
        self.rank = rank
        self._token_line = encode({TOKEN_FIELD: token})
        self._queue: collections.deque[bytes] = collections.deque(maxlen=QUEUE_LIMIT)
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._socket: socket.socket | None = None
        self._buffer = test_buffer_size()
        self.connections = (
            0  # how many times it connected: more than once is a reconnect
        )
        self._thread = threading.Thread(
            target=self._run, name="status-publisher", daemon=True
        )
        self._thread.start()

    def publish(self, record: Mapping[str, Any]) -> None:
        """Queue one event for sending (never blocks)."""
        self._queue.append(encode(record))
        self._wake.set()

    def close(self) -> None:
        """Send what is queued and `bye`, waiting at most a few seconds."""
        self._queue.append(
            encode({"event": BYE, "time": time.time(), "rank": self.rank})
        )
        self._closing.set()
        self._wake.set()
        self._thread.join(timeout=CLOSE_WAIT_S)

    def _run(self) -> None:
        while True:
            self._wake.wait(timeout=RETRY_S)
            self._wake.clear()
            if self._send_queued() and self._closing.is_set():
                break
            if self._closing.is_set() and not self._queue:
                break
        if self._socket is not None:
            self._socket.close()

    def _send_queued(self) -> bool:
        """Send the queue in order; False when the monitor cannot be reached now."""
        try:
            if self._socket is None:
                self._socket = self._connect()
                # first, on every connection: the token, then who speaks
                self._socket.sendall(self._token_line + self._hello())
                self.connections += 1
            while self._queue:
                self._socket.sendall(self._queue[0])
                self._queue.popleft()
            return True
        except OSError:
            if self._socket is not None:
                self._socket.close()
            self._socket = None
            return False

    def _connect(self) -> socket.socket:
        if self._buffer is None:
            return socket.create_connection(self.address, timeout=RETRY_S)
        host, port = self.address
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        connection = socket.socket(family, socket.SOCK_STREAM)
        try:
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._buffer)
            connection.settimeout(RETRY_S)
            connection.connect((host, port))
        except OSError:
            connection.close()
            raise
        return connection

    def _hello(self) -> bytes:
        return encode(
            {
                "event": HELLO,
                "time": time.time(),
                "rank": self.rank,
                "pid": os.getpid(),
                "host": socket.gethostname(),
            }
        )


def publisher_from_env(
    rank: int, env: Mapping[str, str] = os.environ
) -> StatusPublisher | None:
    """A publisher to NPU_WIZARD_STATUS_ADDR, or None when no monitor asked for one."""
    value = env.get(ENV_STATUS_ADDR)
    if not value:
        return None
    try:
        return StatusPublisher(
            parse_address(value), rank, env.get(ENV_STATUS_TOKEN, "")
        )
    except ValueError:
        return None
