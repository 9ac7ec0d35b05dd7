"""Each rank's events, streamed to the run's monitor on the master node.

The monitor on node 0 must see the ranks of every node without a shared
filesystem. When `npu-wizard run` starts the job it sets
NPU_WIZARD_STATUS_ADDR=<master address>:<port>, where node 0's runner listens,
and NPU_WIZARD_STATUS_TOKEN, the run's secret; each rank connects and both ends
prove they hold the token without sending it: the rank sends a nonce, the
runner answers with its own nonce and HMAC(token, "runner", both nonces), and
only when that proof holds does the rank send its HMAC(token, "rank", ...) and
a `hello` (rank and pid), then every event it writes as one JSON line. Whatever
listens at the address without the token (a local user who bound the port
after the runner died) learns neither the token nor who the rank is, and its
asks are never read. A send that blocks for RETRY_S
(the monitor paused, a busy host, a network blip) drops the connection and
opens a new one, which says `hello` again: the monitor takes a connection that
comes back for the same rank and pid as the same process. A rank that ends
cleanly says `bye` first, so a connection that drops without it, and does not
come back, tells the monitor that the rank's process died. Sending happens on a
daemon thread from a bounded queue: a slow or absent monitor never stalls
training, and events it misses are only missed.

The runner may also ask a rank something down the same connection: one JSON
line {"ask": NAME, "id": ID, ...}. A reader thread hands it to the handler the
runtime registered with `on_ask(NAME, fn)` (runtime/stacks.py registers
"stacks"), on a thread of its own, and publishes what the handler returns as
the event {"event": NAME, "id": ID, "rank": R, **answer}. An answer longer
than ANSWER_PART_CHARS is sent in parts {"event": NAME, "id": ID, "part": i,
"parts": n, "text": ...} that the runner joins (wizard/monitor/answers.py); one
over MAX_ANSWER_CHARS is refused with {"event": NAME, "id": ID, "error": ...}.
An ask with no handler is answered with an error, so the runner need not wait.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import json
import os
import secrets
import selectors
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

ENV_STATUS_ADDR = "NPU_WIZARD_STATUS_ADDR"
ENV_STATUS_TOKEN = "NPU_WIZARD_STATUS_TOKEN"
TOKEN_FIELD = "token"  # the token itself: what ranks of projects rendered before the handshake send
NONCE_FIELD, PROOF_FIELD = "nonce", "proof"
RUNNER, RANK = "runner", "rank"  # who proves: one end's proof is never the other's
MAX_HANDSHAKE_BYTES = 4096  # the runner's challenge is about 130 bytes
HELLO, BYE, LOST = "hello", "bye", "lost"
QUEUE_LIMIT = 1000
RETRY_S = 2.0
CLOSE_WAIT_S = 2.0
ASK_FIELD = "ask"
MAX_ASK_BYTES = 4096  # an ask is a short line; more is not one
MAX_ASKS_AT_ONCE = 4  # asks of different kinds answered at the same time
# the status server takes lines of at most 256 KiB; json.dumps writes a character as at most 6
ANSWER_PART_CHARS = 32 * 1024
MAX_ANSWER_CHARS = 8 << 20
Handler = Callable[[Mapping[str, Any]], "Mapping[str, Any] | None"]
_handlers: dict[str, Handler] = {}


def on_ask(name: str, handler: Handler) -> None:
    """Answer the runner's {"ask": name} with handler(ask): its dict is published, None sends nothing."""
    _handlers[name] = handler


def answer_events(
    name: str, ask_id: object, rank: int, answer: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The events that carry `answer`: one, or its JSON text in parts small enough for the stream."""
    head = {"event": name, "id": ask_id, "rank": rank, "time": time.time()}
    text = json.dumps(answer, default=str)
    if len(text) > MAX_ANSWER_CHARS:
        return [
            {
                **head,
                "error": f"the answer is {len(text)} characters, over {MAX_ANSWER_CHARS}",
            }
        ]
    if len(text) <= ANSWER_PART_CHARS:
        return [{**dict(answer), **head}]
    parts = [
        text[i : i + ANSWER_PART_CHARS] for i in range(0, len(text), ANSWER_PART_CHARS)
    ]
    return [
        {**head, "part": i, "parts": len(parts), "text": part}
        for i, part in enumerate(parts)
    ]


def proof(token: str, role: str, first: str, second: str) -> str:
    """HMAC-SHA256 under the run's token of `role` and two nonces: shows the token without giving it."""
    message = f"{role}\n{first}\n{second}".encode()
    return hmac.new(
        token.encode("utf-8", "surrogatepass"), message, hashlib.sha256
    ).hexdigest()


def is_nonce(value: object) -> bool:
    """Whether `value` is a nonce as both ends make them: 16 to 128 hex digits."""
    return (
        isinstance(value, str)
        and 16 <= len(value) <= 128
        and all(c in "0123456789abcdef" for c in value)
    )


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
        self._token = token
        self.runners_refused = 0  # connections whose far end did not prove the token
        self._queue: collections.deque[bytes] = collections.deque(maxlen=QUEUE_LIMIT)
        self._wake = threading.Event()
        self._asks_lock = threading.Lock()
        self._answering: set[str] = set()  # the kinds of ask being answered now
        self._closing = threading.Event()
        self._socket: socket.socket | None = None
        self.connections = (
            0  # how many times it connected: more than once is a reconnect
        )
        self._thread = threading.Thread(
            target=self._run, name="status-publisher", daemon=True
        )
        self._thread.start()
        self._reader = threading.Thread(
            target=self._read_asks, name="status-asks", daemon=True
        )
        self._reader.start()

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
                connection = self._connect()
                try:
                    self._handshake(connection)
                except OSError:
                    connection.close()
                    raise
                self._socket = connection  # only now does the reader take asks from it
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

    def _handshake(self, connection: socket.socket) -> None:
        """Prove the token to the runner and have it proved back; then say who speaks. OSError when it fails."""
        ours = secrets.token_hex(16)
        connection.sendall(encode({NONCE_FIELD: ours}))
        line = b""
        while b"\n" not in line and len(line) <= MAX_HANDSHAKE_BYTES:
            chunk = connection.recv(MAX_HANDSHAKE_BYTES)
            if not chunk:
                raise ConnectionResetError(
                    "the status address closed during the handshake"
                )
            line += chunk
        try:
            challenge = json.loads(line.split(b"\n", 1)[0])
        except (ValueError, RecursionError):
            challenge = None
        theirs = challenge.get(NONCE_FIELD) if isinstance(challenge, dict) else None
        given = challenge.get(PROOF_FIELD) if isinstance(challenge, dict) else None
        if not (is_nonce(theirs) and isinstance(given, str)) or not hmac.compare_digest(
            given.encode("utf-8", "surrogatepass"),
            proof(self._token, RUNNER, ours, theirs).encode(),
        ):
            self.runners_refused += 1
            raise ConnectionRefusedError(
                "the status address did not prove the run's token"
            )
        connection.sendall(
            encode({PROOF_FIELD: proof(self._token, RANK, theirs, ours)})
            + self._hello()
        )

    def _read_asks(self) -> None:
        """Read the runner's asks from whichever connection is open; answer each on a thread."""
        pending, reading = b"", None
        # a selector, not select.select: a rank late in a run may hold descriptors past 1024
        watch = selectors.DefaultSelector()
        while not self._closing.is_set():
            connection = self._socket
            if connection is None:
                self._closing.wait(0.2)
                continue
            if connection is not reading:
                pending = b""
                try:
                    if reading is not None:
                        watch.unregister(reading)
                    watch.register(connection, selectors.EVENT_READ)
                except (OSError, ValueError, KeyError):
                    self._closing.wait(0.2)  # closed by the sending thread meanwhile
                    reading = None
                    continue
                reading = connection
            try:
                ready = watch.select(0.5)
                chunk = connection.recv(MAX_ASK_BYTES) if ready else None
            except (OSError, ValueError):  # closed by the sending thread meanwhile
                self._closing.wait(0.2)
                continue
            if chunk is None:
                continue
            if not chunk:  # the runner closed it: the sending thread reconnects
                self._closing.wait(0.2)
                continue
            *lines, pending = (pending + chunk).split(b"\n")
            if len(pending) > MAX_ASK_BYTES:
                pending = b""
            for line in lines:
                self._take_ask(line)

    def _take_ask(self, line: bytes) -> None:
        try:
            ask = json.loads(line)
        except (ValueError, RecursionError):
            return
        if not isinstance(ask, dict) or not isinstance(ask.get(ASK_FIELD), str):
            return
        name = ask[ASK_FIELD]
        with self._asks_lock:
            # one answer of each kind at a time: a flood of asks never becomes a flood of threads
            if name in self._answering or len(self._answering) >= MAX_ASKS_AT_ONCE:
                busy = {"error": f"this rank is still answering {name!r}"}
                for event in answer_events(name, ask.get("id"), self.rank, busy):
                    self.publish(event)
                return
            self._answering.add(name)
        threading.Thread(
            target=self._answer,
            args=(ask,),
            name=f"status-ask-{name}",
            daemon=True,
        ).start()

    def _answer(self, ask: dict[str, Any]) -> None:
        try:
            self._answer_now(ask)
        finally:
            with self._asks_lock:
                self._answering.discard(ask[ASK_FIELD])

    def _answer_now(self, ask: dict[str, Any]) -> None:
        name, ask_id = ask[ASK_FIELD], ask.get("id")
        handler = _handlers.get(name)
        if handler is None:
            answer: Mapping[str, Any] | None = {
                "error": f"this rank answers no {name!r}"
            }
        else:
            try:
                answer = handler({**ask, "rank": self.rank})
            except Exception as error:  # noqa: BLE001 - the runner is told, training goes on
                answer = {"error": f"{type(error).__name__}: {error}"}
        if answer is None:
            return
        for event in answer_events(name, ask_id, self.rank, answer):
            self.publish(event)

    def _connect(self) -> socket.socket:
        return socket.create_connection(self.address, timeout=RETRY_S)

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
