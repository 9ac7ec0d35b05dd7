"""Structured progress events: one JSON line per event, one file per rank.

Each rank appends to `<run dir>/events/rank-<R>.jsonl`; the monitor reads them
with `read_events` (or follows them live with `EventFollower`), both in
runtime/event_reading.py. Every event carries `schema`, `event`, `time` (unix
seconds, for people: clocks step), `rank`, `pid` and `seq`, its number among
the events of its process (1, 2, ...): the runner tells a repeat (the same
event in the file and on the status stream) by pid and seq, never by time.
Writing costs a small file write and flush, never a host-device synchronisation.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from . import provenance, status

# the readers live in runtime/event_reading.py; their names stay importable from here
from .event_reading import (
    FOLLOW_CHUNK,
    RANK_FILE,
    Event,
    EventFollower,
    read_events,
    read_rank_events,
)
from .secret_shapes import scrub

__all__ = [
    "FOLLOW_CHUNK",
    "RANK_FILE",
    "Event",
    "EventFollower",
    "EventWriter",
    "clip",
    "current_writer",
    "events_path",
    "heartbeat_interval",
    "read_events",
    "read_rank_events",
    "resolve_run_dir",
    "tee_output",
    "warn",
]

SCHEMA_VERSION = 1
ENV_RUN_DIR = "NPU_WIZARD_RUN_DIR"
ENV_HEARTBEAT = "NPU_WIZARD_HEARTBEAT_S"
ENV_TEE = "NPU_WIZARD_TEE_LOGS"
DEFAULT_HEARTBEAT_S = 5.0
# characters of an error's message, and of its traceback's end, that an event keeps
TEXT_LIMIT = 16 * 1024


def resolve_run_dir(
    flag: str | None,
    project_dir: Path,
    env: Mapping[str, str] = os.environ,
) -> Path:
    """The run folder: --run-dir, else NPU_WIZARD_RUN_DIR, else <project>/runs/latest."""
    chosen = flag or env.get(ENV_RUN_DIR)
    return Path(chosen) if chosen else project_dir / "runs" / "latest"


def heartbeat_interval(env: Mapping[str, str] = os.environ) -> float:
    """Seconds between heartbeats: NPU_WIZARD_HEARTBEAT_S, default 5 (0 turns them off)."""
    value = env.get(ENV_HEARTBEAT)
    return float(value) if value else DEFAULT_HEARTBEAT_S


def events_path(run_dir: Path, rank: int) -> Path:
    """The events file of `rank` in `run_dir`."""
    return Path(run_dir) / "events" / f"rank-{rank}.jsonl"


_recording: EventWriter | None = None  # this process's open writer, for warn()


def current_writer() -> EventWriter | None:
    """This process's open EventWriter, or None when it records no events."""
    return _recording


def warn(message: str, kind: str) -> None:
    """Print `message` on stderr and, while this rank records events, send it as a warning.

    `kind` says what it is about (checkpoint, resume, amp), so the runner can
    show it in its output and summary instead of only in the rank's log.
    """
    print(message, file=sys.stderr, flush=True)
    writer = _recording
    if writer is not None:
        writer.warning(message, kind)


class EventWriter:
    """Appends one rank's events to its JSON-lines file, flushing each line."""

    def __init__(self, run_dir: Path, rank: int) -> None:
        global _recording
        self.rank = rank
        self.path = events_path(run_dir, rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self._beat_fields: Callable[[], dict[str, Any]] | None = None
        self.step = 0
        self.epoch = 0
        self._seq = 0  # the number of the last event made (a forked child goes on from its parent's, as its pid)
        self._publisher = status.publisher_from_env(rank)
        # a rank killed mid-line leaves a torn line; start ours on a fresh one
        if self._file.tell() > 0 and not self.path.read_bytes().endswith(b"\n"):
            self._file.write("\n")
        _recording = self

    def emit(self, event: str, **fields: Any) -> Event:
        """Write one event line now and return it."""
        failed: OSError | None = None
        # numbered, written and sent in one order, whichever thread emits
        with self._lock:
            record = self._record(event)
            record.update(fields)
            line = json.dumps(record, default=str) + "\n"
            if not self._file.closed:
                try:
                    self._file.write(line)
                    self._file.flush()
                except OSError as error:
                    failed = error
                    self._drop_file()
            if self._publisher is not None:
                self._publisher.publish(record)
        if failed is not None:
            self._stopped_writing(failed)
        return record

    def _record(self, event: str) -> dict[str, Any]:
        """The fields every event starts with, numbered next (the caller holds the lock)."""
        self._seq += 1
        return {
            "schema": SCHEMA_VERSION,
            "event": event,
            "time": time.time(),
            "rank": self.rank,
            "pid": os.getpid(),
            "seq": self._seq,
        }

    def _drop_file(self) -> None:
        """Close the events file, dropping what its buffer still holds (it could not be written)."""
        with contextlib.suppress(OSError):
            self._file.close()  # the flush in close fails again on a full disk: the file is closed all the same

    def _stopped_writing(self, error: OSError) -> None:
        """Say once, on stderr and the status stream, that this rank's events file takes no more events."""
        why = (
            f"no space left on {self.path.parent}"
            if error.errno in (errno.ENOSPC, errno.EDQUOT)
            else f"cannot write {self.path} ({error.strerror or error})"
        )
        message = (
            f"events: {why}: this rank's events stop here, training goes on "
            "(free space on that disk for the next run)"
        )
        print(message, file=sys.stderr, flush=True)
        with self._lock:
            if self._publisher is not None:
                warning = self._record("warning")
                warning.update(kind="events", message=message, step=self.step)
                self._publisher.publish(warning)

    def started(
        self,
        *,
        local_rank: int,
        node: int,
        device: str,
        world_size: int,
        **extra: Any,
    ) -> Event:
        """The rank is set up: where it runs and on what, its versions and HCCL/ASCEND/NPU_WIZARD variables."""
        return self.emit(
            "started",
            local_rank=local_rank,
            node=node,
            host=socket.gethostname(),
            device=device,
            pid=os.getpid(),
            world_size=world_size,
            versions=provenance.versions(),
            environment=provenance.environment(),
            **extra,
        )

    def progress(self, step: int, epoch: int) -> None:
        """Note the current step for heartbeats (no write, no synchronisation)."""
        self.step = step
        self.epoch = epoch

    def step_done(
        self,
        *,
        step: int,
        epoch: int,
        loss: float,
        samples_per_s: float,
        lr: float,
        data_s: float | None = None,
        forward_s: float | None = None,
        **extra: float,
    ) -> Event:
        """A logging-interval step: loss, throughput and learning rate.

        `data_s` and `forward_s`, when given: the mean seconds per step of this
        window spent waiting for data and in the forward pass (runtime/timing.py);
        `extra`: a language model's tokens_per_s and, where the peak is known, mfu.
        """
        self.progress(step, epoch)
        times = {
            name: value
            for name, value in (("data_s", data_s), ("forward_s", forward_s))
            if value is not None
        }
        return self.emit(
            "step",
            step=step,
            epoch=epoch,
            loss=loss,
            samples_per_s=samples_per_s,
            lr=lr,
            **times,
            **extra,
        )

    def evaluated(self, *, step: int, val_loss: float) -> Event:
        """The validation loss, averaged over every rank, after `step` optimizer steps."""
        return self.emit("eval", step=step, epoch=self.epoch, val_loss=val_loss)

    def checkpoint(self, *, step: int, path: Path) -> Event:
        """A checkpoint was written."""
        return self.emit("checkpoint", step=step, path=str(path))

    def finished(self, **extra: Any) -> Event:
        """The rank finished training."""
        return self.emit("finished", step=self.step, epoch=self.epoch, **extra)

    def preempted(self, *, step: int, signal: str | None, **extra: Any) -> Event:
        """The rank saved a checkpoint of `step` on a stop signal and exits (runtime/preemption.py)."""
        self.progress(step, self.epoch)
        return self.emit(
            "preempted", step=step, epoch=self.epoch, signal=signal, **extra
        )

    def error(self, error: BaseException, **extra: Any) -> Event:
        """The rank failed: exception type, message and traceback."""
        # bounded, so the event stays one readable line on the status stream; the log has it all
        return self.emit(
            "error",
            type=type(error).__name__,
            message=clip(scrub(str(error)), keep="start"),
            traceback=clip(
                scrub("".join(traceback.format_exception(error))), keep="end"
            ),
            step=self.step,
            **extra,
        )

    def warning(self, message: str, kind: str) -> Event:
        """Something the user should see in the runner's output, not only in this rank's log."""
        return self.emit(
            "warning",
            kind=kind,
            message=clip(scrub(message), keep="start", limit=2000),
            step=self.step,
        )

    def start_heartbeat(
        self,
        interval_s: float,
        fields: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        """Write a heartbeat every `interval_s` seconds from a daemon thread.

        `fields`, when given, is called for each heartbeat and adds what it returns.
        """
        if interval_s <= 0 or self._heartbeat is not None:
            return
        self._beat_fields = fields
        self._heartbeat = threading.Thread(
            target=self._beat,
            args=(interval_s,),
            name="heartbeat",
            daemon=True,
        )
        self._heartbeat.start()

    def _beat(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            extra = self._beat_fields() if self._beat_fields is not None else {}
            self.emit("heartbeat", step=self.step, epoch=self.epoch, **extra)

    @contextmanager
    def recording(self) -> Iterator[EventWriter]:
        """Record any exception escaping the block as an error event, then re-raise."""
        try:
            yield self
        except BaseException as error:
            if not isinstance(error, SystemExit) or error.code not in (0, None):
                self.error(error)
            raise
        finally:
            self.close()

    def close(self) -> None:
        """Stop the heartbeat and close the file."""
        global _recording
        if _recording is self:
            _recording = None
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=5)
        with self._lock:
            self._drop_file()
        if self._publisher is not None:
            self._publisher.close()
            self._publisher = None


def clip(text: str, keep: str, limit: int = TEXT_LIMIT) -> str:
    """`text` cut to `limit` characters, keeping its start or its end, and saying so."""
    if len(text) <= limit:
        return text
    cut = f"[... {len(text) - limit} characters cut; the rank's log has them ...]"
    return text[:limit] + cut if keep == "start" else cut + text[-limit:]


def tee_output(
    run_dir: Path,
    rank: int,
    env: Mapping[str, str] = os.environ,
) -> Path | None:
    """Copy this process's stdout and stderr into <run dir>/logs/rank-<R>.log.

    A `tee -a` child reads a pipe that replaces file descriptors 1 and 2, so
    output from Python and from native libraries alike still reaches the
    console. Off when NPU_WIZARD_TEE_LOGS=0 or where `tee` is missing.
    """
    tee = shutil.which("tee")
    if env.get(ENV_TEE, "1") == "0" or tee is None:
        return None
    log = Path(run_dir) / "logs" / f"rank-{rank}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.touch()  # there at once, and its time is now: when the rank last printed counts from here
    sys.stdout.flush()
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    # its own session: Ctrl-C must not kill tee before the rank's last words; nor may the
    # signals that ask the rank to save and stop (a scheduler sends them to every process)
    with _signals_ignored(signal.SIGTERM, signal.SIGUSR1):
        child = subprocess.Popen(
            [tee, "-a", str(log)],
            stdin=read_end,
            start_new_session=True,
        )
    os.close(read_end)
    os.dup2(write_end, 1)
    os.dup2(write_end, 2)
    os.close(write_end)
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(line_buffering=True)
    # the log itself, for what the process says after tee has ended (opened now: at exit the
    # path may no longer lead to it)
    late = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    atexit.register(_drain_tee, child, late)
    return log


@contextmanager
def _signals_ignored(*signums: int) -> Iterator[None]:
    """Within the block, `signums` are ignored: a child started there inherits that (the main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, signal.SIG_IGN) for signum in signums}
    try:
        yield
    finally:
        for signum, action in previous.items():
            signal.signal(signum, action)


def _drain_tee(child: subprocess.Popen[bytes], late: int) -> None:
    """At exit: let tee write its last lines, then point descriptors 1 and 2 at the log itself (`late`).

    This runs among the last atexit handlers; the interpreter's own teardown comes after it. What a
    native library writes to descriptor 2 from then on (libstdc++'s "terminate called ...", CPython's
    "Fatal Python error") reaches the rank's log instead of nothing. faulthandler's stacks reach it
    too, for a crash while the interpreter still runs; late in its teardown CPython turns them off.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    # close our ends of the pipe so tee sees EOF
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.close(devnull)
    try:
        child.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass  # a child process still holds the pipe; tee ends when it does
    os.dup2(late, 1)
    os.dup2(late, 2)
    os.close(late)
