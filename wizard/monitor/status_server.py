"""Node 0's end of the status stream: every rank of every node connects here.

One thread multiplexes all connections with `selectors`. A connection must
first prove it holds the run's token (NPU_WIZARD_STATUS_TOKEN, which only the
job's ranks have in their environment) without sending it: to the rank's nonce
the runner answers with its own and its proof, HMAC(token, "runner", both
nonces), and the rank must answer with HMAC(token, "rank", ...)
(runtime/status.py). A connection that fails is closed and counted. The
token line itself ({"token": ...}) is still taken, from the ranks of projects
rendered before the handshake.
Each later complete JSON line becomes an event, stamped with the time it
arrived (clocks of other nodes may differ, so hang detection uses this stamp).
A line too long, too deeply nested or not an event is dropped and counted,
never fatal: nothing a peer sends can end the serving loop. A connection must
authenticate within AUTH_DEADLINE_S; at most MAX_PENDING may be waiting to, the
oldest of the address holding the most giving way (a peer flooding the port
evicts its own connections, not the ranks starting from other hosts); and
the server never holds so many connections that the runner would run out of
file descriptors (FD_RESERVE stay free for it).

A rank's publisher reconnects when a send blocks (the runner paused, a busy
host): a connection that ends without `bye` yields a `lost` event for its rank
only when no connection for the same rank and pid comes back within
`loss_grace` seconds; the supervisor still checks the pid where it can see it.

The stream also carries the runner's asks the other way: `ask(request)` has
the serving thread write the request as one JSON line down every authenticated
connection of the ranks asked (runtime/status.py answers it); the answers come
back as events like any other (wizard/monitor/answers.py joins them).
"""

from __future__ import annotations

import hmac
import json
import queue
import resource
import secrets
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from runtime.status import (
    ASK_FIELD,
    BYE,
    LOST,
    NONCE_FIELD,
    PROOF_FIELD,
    RANK,
    RUNNER,
    TOKEN_FIELD,
    encode,
    is_nonce,
    proof,
)

RECEIVED = "received"
MAX_LINE_BYTES = 256 * 1024  # an error event with its traceback fits many times over
MAX_TOKEN_LINE_BYTES = 4096  # the token line is about 60 bytes: a stranger may not make the runner hold more
# the events nest two levels; json reads a line nested up to the recursion limit (about 1000), and its
# RecursionError covers only past that: an event nested, say, 900 deep would pass and meet that limit later, when
# the runner writes it again deeper in its stack (test_a_line_nested_past_the_events_but_within_what_json_reads_...)
MAX_DEPTH = 16
BACKLOG = 4096  # the kernel caps it at net.core.somaxconn
AUTH_DEADLINE_S = 10.0  # a connection that has not shown the token by then is closed
MAX_PENDING = 4096  # connections waiting to authenticate at once (a burst of ranks); the most crowded address gives way
FD_RESERVE = 128  # descriptors the runner keeps for its own files, logs and engine processes
LOSS_GRACE_S = 10.0  # how long a rank's dropped connection may take to come back before it is lost
MAX_OUTBOX_BYTES = 1024 * 1024  # asks waiting for a rank's socket to take them; one more is not sent


@dataclass
class _Peer:
    since: float = 0.0
    address: str = ""
    buffer: bytes = b""
    authenticated: bool = False
    nonces: tuple[str, str] | None = None  # the rank's and the runner's, once the runner has proved the token
    skipping: bool = False  # inside a line too long: drop up to its newline
    rank: int | None = None
    said_bye: bool = False
    pid: int | None = None
    outbox: bytearray = field(default_factory=bytearray)  # asks, whole lines, the first maybe begun, not yet sent


@dataclass
class StreamCounts:
    """What the stream refused: each is counted, none is fatal."""

    accepted: int = 0
    rejected_connections: int = 0
    dropped_lines: int = 0
    timed_out: int = 0  # closed for not authenticating in time
    turned_away: int = 0  # closed at once: too many connections pending, or descriptors running out
    reconnected: int = 0  # a rank's connection came back (after a paused runner, say)
    peer_errors: int = 0  # a connection whose input raised, closed
    asks_unsent: int = 0  # an ask not sent: a rank's connection had too many waiting (MAX_OUTBOX_BYTES)


@dataclass
class StatusServer:
    """Listens on (host, port) and queues the ranks' events for `drain()`; `token` is required first."""

    host: str
    port: int
    token: str
    clock: Callable[[], float] = time.time  # stamps: an event's arrival, a lost connection's end
    # durations (the auth deadline, the loss grace): a step of the system clock (NTP) moves neither
    ticker: Callable[[], float] = time.monotonic
    loss_grace: float = LOSS_GRACE_S
    auth_deadline: float = AUTH_DEADLINE_S
    max_pending: int = MAX_PENDING
    receive_buffer: int | None = None  # tests shrink it to make a paused runner's sockets fill
    send_buffer: int | None = None  # tests shrink it to make an ask go out in parts
    counts: StreamCounts = field(default_factory=StreamCounts)
    _events: queue.SimpleQueue[dict] = field(default_factory=queue.SimpleQueue)

    def __post_init__(self) -> None:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        self._token = self.token.encode()
        self._max_connections = _connection_budget()
        self._pending: dict[socket.socket, _Peer] = {}  # accepted, not yet authenticated, oldest first
        self._pending_from: dict[str, dict[socket.socket, None]] = {}  # the same, by peer address, oldest first
        self._open = 0
        self._live: dict[tuple[int, int | None], int] = {}  # (rank, pid) -> its open connections
        self._seen: set[tuple[int, int | None]] = set()
        # (rank, pid) -> when its last connection ended: (the clock's stamp, the ticker's reading)
        self._losses: dict[tuple[int, int | None], tuple[float, float]] = {}
        self._losses_lock = threading.Condition()  # settle_losses() runs on the supervisor's thread
        self._rounds = 0  # serving rounds completed, so that settle_losses() can wait for one
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if self.receive_buffer is not None:  # accepted connections inherit it
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.receive_buffer)
        if self.send_buffer is not None:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.send_buffer)
        self._listener.bind((self.host, self.port))
        self._listener.listen(BACKLOG)
        self._listener.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._asks: queue.SimpleQueue[tuple[bytes, frozenset[int] | None]] = queue.SimpleQueue()
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

    def ask(self, request: dict, ranks: set[int] | None = None) -> None:
        """Send `request` ({"ask": name, "id": ..., ...}) to every connected rank, or to `ranks`.

        The serving thread writes it within one serving round (0.2 s); a rank
        not connected now is not asked, and its answer is simply missing.
        """
        if not isinstance(request.get(ASK_FIELD), str):
            raise ValueError(f"an ask needs a string {ASK_FIELD!r}: {request!r}")
        line = (json.dumps(request) + "\n").encode()
        self._asks.put((line, None if ranks is None else frozenset(ranks)))

    def connected_ranks(self) -> set[int]:
        """The ranks with a connection open now."""
        return {rank for rank, _pid in list(self._live)}

    def settle_losses(self) -> None:
        """Report now every rank whose connection dropped and has not come back.

        For when the job is failing anyway: a rank that went silent before
        another rank's error is more likely its cause than a paused runner's
        casualty, and the job ends sooner than its grace period would.
        The `lost` events keep the time the connection ended.
        """
        with self._losses_lock:
            # what reached the socket before this call is read first: wait for a whole serving round
            target = self._rounds + 2
            self._losses_lock.wait_for(lambda: self._rounds >= target or not self._thread.is_alive(), timeout=2.0)
            for (rank, pid), (ended, _ticked) in self._losses.items():
                self._events.put({"event": LOST, "rank": rank, "time": ended, "pid": pid, RECEIVED: ended})
            self._losses.clear()

    def ended(self) -> dict[tuple[int, int | None], float]:
        """When each (rank, pid) connection that ended without `bye` and has not come back ended.

        Read after a whole serving round, so that a connection closed by now is counted: among
        ranks found dead in one look, this tells the first to die from those a launcher
        stopped because of it.
        """
        with self._losses_lock:
            target = self._rounds + 2
            self._losses_lock.wait_for(lambda: self._rounds >= target or not self._thread.is_alive(), timeout=2.0)
            return {key: ended for key, (ended, _ticked) in self._losses.items()}

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
                        continue
                    try:
                        self._read(key.fileobj, key.data)  # type: ignore[arg-type]
                    except Exception:  # whatever a peer sends, the loop goes on without that peer
                        self.counts.peer_errors += 1
                        self._close_peer(key.fileobj, key.data)  # type: ignore[arg-type]
                self._expire(self.ticker())
                self._send_asks()
                with self._losses_lock:
                    self._rounds += 1
                    self._losses_lock.notify_all()
        finally:
            for key in list(self._selector.get_map().values()):
                key.fileobj.close()  # type: ignore[union-attr]
            self._selector.close()

    def _accept(self) -> None:
        """Take every connection waiting (a burst of thousands must not wait one select round each)."""
        while True:
            try:
                connection, remote = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of file descriptors, or the peer gave up: the rest stay queued
                return
            full = self._open >= self._max_connections  # the runner's own descriptors come first
            if (full or len(self._pending) >= self.max_pending) and self._pending:
                self.counts.turned_away += 1
                self._drop(self._most_crowded_oldest())
            elif full:
                self.counts.turned_away += 1
                connection.close()
                continue
            connection.setblocking(False)
            peer = _Peer(since=self.ticker(), address=str(remote[0]))
            self._selector.register(connection, selectors.EVENT_READ, peer)
            self._pending[connection] = peer
            self._pending_from.setdefault(peer.address, {})[connection] = None
            self._open += 1
            self.counts.accepted += 1

    def _most_crowded_oldest(self) -> socket.socket:
        """The oldest connection still silent of the address with the most of them."""
        crowded = max(self._pending_from.values(), key=len)
        return next(iter(crowded))

    def _settled(self, connection: socket.socket) -> None:
        """Take `connection` off the pending lists: it authenticated, or it is closed."""
        peer = self._pending.pop(connection, None)
        if peer is None:
            return
        same_address = self._pending_from.get(peer.address, {})
        same_address.pop(connection, None)
        if not same_address:
            self._pending_from.pop(peer.address, None)

    def _send_asks(self) -> None:
        """Queue each ask for the connections of the ranks it is for; send what each connection takes now.

        A line the socket takes in part goes on from where it stopped in the next rounds, whole, before any
        later ask: a torn line would garble the next one.
        """
        while True:
            try:
                line, ranks = self._asks.get_nowait()
            except queue.Empty:
                break
            for key in list(self._selector.get_map().values()):
                peer = key.data
                if peer is None or not peer.authenticated or peer.rank is None:
                    continue
                if ranks is not None and peer.rank not in ranks:
                    continue
                if peer.outbox and len(peer.outbox) + len(line) > MAX_OUTBOX_BYTES:
                    self.counts.asks_unsent += 1  # a rank that reads no asks: this one is not queued
                    continue
                peer.outbox += line
        for key in list(self._selector.get_map().values()):
            peer = key.data
            if peer is not None and peer.outbox:
                self._flush(key.fileobj, peer)  # type: ignore[arg-type]

    def _flush(self, connection: socket.socket, peer: _Peer) -> None:
        """Send as much of the peer's waiting asks as its socket takes now."""
        try:
            sent = connection.send(peer.outbox)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # its end is gone: reading it will say so
            peer.outbox.clear()
            return
        del peer.outbox[:sent]

    def _expire(self, now: float) -> None:
        """Close connections too slow to authenticate; report ranks whose connection did not come back.

        `now` is the ticker's reading (monotonic): the deadlines are durations.
        """
        for connection, peer in list(self._pending.items()):
            if now - peer.since < self.auth_deadline:
                break  # oldest first: the rest are younger
            self.counts.timed_out += 1  # counted before the close a peer may already be waiting on
            self._drop(connection)
        with self._losses_lock:
            for key, (ended, ticked) in list(self._losses.items()):
                if now - ticked >= self.loss_grace:
                    del self._losses[key]
                    rank, pid = key
                    self._events.put({"event": LOST, "rank": rank, "time": ended, "pid": pid, RECEIVED: ended})

    def _read(self, connection: socket.socket, peer: _Peer) -> None:
        try:
            chunk = connection.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        now = self.clock()
        if not chunk:
            if not peer.authenticated and peer.nonces is not None:
                self.counts.rejected_connections += 1  # it found the runner's proof wrong: a wrong token
            self._close_peer(connection, peer, now)
            return
        *lines, peer.buffer = (peer.buffer + chunk).split(b"\n")
        for line in lines:
            if peer.skipping:  # the tail of a line too long
                peer.skipping = False
                continue
            if not peer.authenticated:
                verdict = self._authenticate(connection, peer, line)
                if verdict is None:
                    continue  # challenged: its proof comes next
                if not verdict:
                    self.counts.rejected_connections += 1
                    self._drop(connection)
                    return
                peer.authenticated = True
                self._settled(connection)
                continue
            self._take(line, peer, now)
        if len(peer.buffer) > (MAX_LINE_BYTES if peer.authenticated else MAX_TOKEN_LINE_BYTES):
            self.counts.dropped_lines += 1
            peer.buffer, peer.skipping = b"", True
            if not peer.authenticated:
                self.counts.rejected_connections += 1
                self._drop(connection)

    def _authenticate(self, connection: socket.socket, peer: _Peer, line: bytes) -> bool | None:
        """One line of the handshake: True when the peer proved the token, False when not, None: challenged."""
        record = _parse(line) or {}
        if peer.nonces is None and TOKEN_FIELD in record:  # a rank of a project rendered before the handshake
            return self._matches(record[TOKEN_FIELD], self._token)
        if peer.nonces is None:
            theirs = record.get(NONCE_FIELD)
            if not is_nonce(theirs):
                return False
            ours = secrets.token_hex(16)
            peer.nonces = (theirs, ours)
            peer.outbox += encode({NONCE_FIELD: ours, PROOF_FIELD: proof(self.token, RUNNER, theirs, ours)})
            self._flush(connection, peer)
            return None
        theirs, ours = peer.nonces
        return self._matches(record.get(PROOF_FIELD), proof(self.token, RANK, ours, theirs).encode())

    @staticmethod
    def _matches(given: object, expected: bytes) -> bool:
        if not isinstance(given, str):
            return False
        # a lone surrogate ("\\ud800") parses but has no UTF-8 form: no match, never an error
        return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected)

    def _take(self, line: bytes, peer: _Peer, now: float) -> None:
        event = _parse(line)
        if event is None or not isinstance(event.get("rank"), int) or not isinstance(event.get("event"), str):
            self.counts.dropped_lines += 1
            return
        if peer.rank is not None and event["rank"] != peer.rank:
            self.counts.dropped_lines += 1  # one connection speaks for one rank
            return
        pid = event.get("pid", peer.pid)
        if peer.rank is None or (peer.pid is None and isinstance(pid, int)):
            self._identify(peer, event["rank"], pid if isinstance(pid, int) else None)
        peer.said_bye = event["event"] == BYE
        event[RECEIVED] = now
        self._events.put(event)

    def _identify(self, peer: _Peer, rank: int, pid: int | None) -> None:
        """The connection speaks for (rank, pid): one that comes back cancels the loss of the old one."""
        if peer.rank is not None:
            self._forget(peer)
        peer.rank, peer.pid = rank, pid
        key = (rank, pid)
        self._live[key] = self._live.get(key, 0) + 1
        if key in self._seen:
            self.counts.reconnected += 1
        self._seen.add(key)
        with self._losses_lock:
            self._losses.pop(key, None)

    def _forget(self, peer: _Peer) -> int:
        """Take the peer's connection off its rank's count; return how many the rank still has open."""
        key = (peer.rank, peer.pid)
        left = self._live.get(key, 1) - 1  # type: ignore[arg-type]
        if left > 0:
            self._live[key] = left  # type: ignore[index]
        else:
            self._live.pop(key, None)  # type: ignore[arg-type]
        return left

    def _close_peer(self, connection: socket.socket, peer: _Peer, now: float | None = None) -> None:
        """Close a connection; one that ended without `bye` starts its rank's grace period."""
        self._drop(connection)
        if peer.rank is None:
            return
        if self._forget(peer) == 0 and not peer.said_bye:
            with self._losses_lock:
                self._losses[(peer.rank, peer.pid)] = (self.clock() if now is None else now, self.ticker())

    def _drop(self, connection: socket.socket) -> None:
        try:
            self._selector.unregister(connection)
        except (KeyError, ValueError):
            return  # closed already
        self._settled(connection)
        self._open -= 1
        connection.close()


def _connection_budget() -> int:
    """How many connections the server may hold: the descriptor limit (raised to the hard one) less a reserve."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        wanted = 1 << 20 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass
    return max(16, soft - FD_RESERVE - 64)  # 64: what the runner already holds at start, generously


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
