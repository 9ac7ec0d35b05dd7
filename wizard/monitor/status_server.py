"""Node 0's end of the status stream: every rank of every node connects here.

One thread multiplexes all connections with `selectors`. Each complete JSON
line becomes an event, stamped with the time it arrived (clocks of other
nodes may differ, so hang detection uses this stamp). A connection that ends
without `bye` yields a `lost` event for its rank: the process died.
"""

from __future__ import annotations

import json
import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from runtime.status import BYE, LOST

RECEIVED = "received"


@dataclass
class _Peer:
    buffer: bytes = b""
    rank: int | None = None
    said_bye: bool = False
    pid: int | None = None


@dataclass
class StatusServer:
    """Listens on (host, port) and queues the ranks' events for `drain()`."""

    host: str
    port: int
    clock: Callable[[], float] = time.time
    _events: queue.SimpleQueue[dict] = field(default_factory=queue.SimpleQueue)

    def __post_init__(self) -> None:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((self.host, self.port))
        self._listener.listen(256)
        self._listener.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="status-server", daemon=True)
        self._thread.start()

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
        """Stop listening and drop every connection."""
        self._stop.set()
        self._thread.join(timeout=2)
        for key in list(self._selector.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        self._selector.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            for key, _mask in self._selector.select(timeout=0.2):
                if key.data is None:
                    self._accept()
                else:
                    self._read(key.fileobj, key.data)  # type: ignore[arg-type]

    def _accept(self) -> None:
        try:
            connection, _ = self._listener.accept()
        except OSError:
            return
        connection.setblocking(False)
        self._selector.register(connection, selectors.EVENT_READ, _Peer())

    def _read(self, connection: socket.socket, peer: _Peer) -> None:
        try:
            chunk = connection.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        now = self.clock()
        if not chunk:
            self._selector.unregister(connection)
            connection.close()
            if peer.rank is not None and not peer.said_bye:
                self._events.put({"event": LOST, "rank": peer.rank, "time": now, "pid": peer.pid, RECEIVED: now})
            return
        *lines, peer.buffer = (peer.buffer + chunk).split(b"\n")
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if not isinstance(event, dict) or not isinstance(event.get("rank"), int):
                continue
            peer.rank = event["rank"]
            peer.pid = event.get("pid", peer.pid)
            peer.said_bye = event.get("event") == BYE
            event[RECEIVED] = now
            self._events.put(event)
