"""Each rank's events, streamed to the run's monitor on the master node.

The monitor on node 0 must see the ranks of every node without a shared
filesystem. When `npu-wizard run` starts the job it sets
NPU_WIZARD_STATUS_ADDR=<master address>:<port>, where node 0's runner listens,
and NPU_WIZARD_STATUS_TOKEN, the run's secret; each rank connects, presents
the token on the first line, then sends every event it writes as one JSON line. A rank that ends cleanly says `bye` first, so a connection that
drops without it tells the monitor, at that moment, that the rank's process
died. Sending happens on a daemon thread from a bounded queue: a slow or absent
monitor never stalls training, and events it misses are only missed.
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
        self._queue.append(
            encode(
                {
                    "event": HELLO,
                    "time": time.time(),
                    "rank": rank,
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                }
            )
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
                self._socket = socket.create_connection(self.address, timeout=RETRY_S)
                self._socket.sendall(self._token_line)  # first, on every connection
            while self._queue:
                self._socket.sendall(self._queue[0])
                self._queue.popleft()
            return True
        except OSError:
            if self._socket is not None:
                self._socket.close()
            self._socket = None
            return False


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
