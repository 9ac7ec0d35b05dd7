"""Node 0's end of the status stream: every rank of every node connects here.

One thread multiplexes all connections with `selectors`. A connection must
first present the run's token (NPU_WIZARD_STATUS_TOKEN, which only the job's
ranks have in their environment); one that does not is closed and counted.
Each later complete JSON line becomes an event, stamped with the time it
arrived (clocks of other nodes may differ, so hang detection uses this stamp).
A line too long, too deeply nested or not an event is dropped and counted,
never fatal. A connection that ends without `bye` yields a `lost` event for
its rank: the process died.
"""

from __future__ import annotations

import hmac
import json
import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from runtime.status import BYE, LOST, TOKEN_FIELD

RECEIVED = "received"
MAX_LINE_BYTES = 256 * 1024  # an error event with its traceback fits many times over
MAX_DEPTH = 16  # the events nest two levels; json's recursion limit must never be reached
BACKLOG = 4096  # the kernel caps it at net.core.somaxconn


@dataclass
class _Peer:
    buffer: bytes = b""
    authenticated: bool = False
    skipping: bool = False  # inside a line too long: drop up to its newline
    rank: int | None = None
    said_bye: bool = False
    pid: int | None = None


@dataclass
class StreamCounts:
    """What the stream refused: each is counted, none is fatal."""

    accepted: int = 0
    rejected_connections: int = 0
    dropped_lines: int = 0


@dataclass
class StatusServer:
    """Listens on (host, port) and queues the ranks' events for `drain()`; `token` is required first."""

    host: str
    port: int
    token: str
    clock: Callable[[], float] = time.time
    counts: StreamCounts = field(default_factory=StreamCounts)
    _events: queue.SimpleQueue[dict] = field(default_factory=queue.SimpleQueue)

    def __post_init__(self) -> None:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        self._token = self.token.encode()
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((self.host, self.port))
        self._listener.listen(BACKLOG)
        self._listener.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="status-server", daemon=True)
        self._thread.start()

    @property
    def bound_port(self) -> int:
        """The port it listens on (the one the system chose, when asked for 0)."""
        return int(self._listener.getsockname()[1])

    @property
    def address(self) -> str:
        """`host:port` for NPU_WIZARD_STATUS_ADDR."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self._listener.getsockname()[1]}"

    def drain(self) -> list[dict]:
        """Every event received since the last drain, in arrival order."""
        events = []
        while True:
            try:
                events.append(self._events.get_nowait())
            except queue.Empty:
                return events

    def close(self) -> None:
        """Stop listening and drop every connection (the serving thread closes them as it ends)."""
        self._stop.set()
        self._thread.join()

    def _serve(self) -> None:
        try:
            while not self._stop.is_set():
                for key, _mask in self._selector.select(timeout=0.2):
                    if key.data is None:
                        self._accept()
                    else:
                        self._read(key.fileobj, key.data)  # type: ignore[arg-type]
        finally:
            for key in list(self._selector.get_map().values()):
                key.fileobj.close()  # type: ignore[union-attr]
            self._selector.close()

    def _accept(self) -> None:
        """Take every connection waiting (a burst of thousands must not wait one select round each)."""
        while True:
            try:
                connection, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of file descriptors, or the peer gave up: the rest stay queued
                return
            connection.setblocking(False)
            self._selector.register(connection, selectors.EVENT_READ, _Peer())
            self.counts.accepted += 1

    def _read(self, connection: socket.socket, peer: _Peer) -> None:
        try:
            chunk = connection.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        now = self.clock()
        if not chunk:
            self._drop(connection)
            if peer.rank is not None and not peer.said_bye:
                self._events.put({"event": LOST, "rank": peer.rank, "time": now, "pid": peer.pid, RECEIVED: now})
            return
        *lines, peer.buffer = (peer.buffer + chunk).split(b"\n")
        for line in lines:
            if peer.skipping:  # the tail of a line too long
                peer.skipping = False
                continue
            if not peer.authenticated:
                if not self._authentic(line):
                    self.counts.rejected_connections += 1
                    self._drop(connection)
                    return
                peer.authenticated = True
                continue
            self._take(line, peer, now)
        if len(peer.buffer) > MAX_LINE_BYTES:
            self.counts.dropped_lines += 1
            peer.buffer, peer.skipping = b"", True
            if not peer.authenticated:
                self.counts.rejected_connections += 1
                self._drop(connection)

    def _authentic(self, line: bytes) -> bool:
        record = _parse(line)
        given = record.get(TOKEN_FIELD) if record is not None else None
        return isinstance(given, str) and hmac.compare_digest(given.encode(), self._token)

    def _take(self, line: bytes, peer: _Peer, now: float) -> None:
        event = _parse(line)
        if event is None or not isinstance(event.get("rank"), int) or not isinstance(event.get("event"), str):
            self.counts.dropped_lines += 1
            return
        if peer.rank is not None and event["rank"] != peer.rank:
            self.counts.dropped_lines += 1  # one connection speaks for one rank
            return
        peer.rank = event["rank"]
        peer.pid = event.get("pid", peer.pid)
        peer.said_bye = event["event"] == BYE
        event[RECEIVED] = now
        self._events.put(event)

    def _drop(self, connection: socket.socket) -> None:
        self._selector.unregister(connection)
        connection.close()


def _parse(line: bytes) -> dict | None:
    """One JSON object of bounded size and nesting, else None."""
    if len(line) > MAX_LINE_BYTES or _depth_over(line, MAX_DEPTH):
        return None
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


def _depth_over(line: bytes, limit: int) -> bool:
    """Whether brackets nest deeper than `limit` (cheap when the line has few brackets, as events do)."""
    if line.count(b"[") + line.count(b"{") <= limit:
        return False
    depth, in_string, escaped = 0, False, False
    for byte in line:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            if depth > limit:
                return True
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return False
