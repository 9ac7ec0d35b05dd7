"""A run folder read for the report: a bounded sample of every rank's step events and all of its rare events.

Each rank's events file is read a chunk at a time. Step events, the bulk of a file, are sampled: the first step
line at each of `samples` evenly spaced byte offsets (and the last one) is parsed, the rest never are, so a
rank costs the same whatever its run's length. Every other event (started, checkpoint, error, finished, lost,
warning) is found with one regular expression over the chunk and parsed; heartbeats are skipped unread. The
rare events and each rank's last step are folded into the monitor's `JobState`, so the report names the same
root cause the monitor does; a language model's tokens/s and MFU are taken from the sampled steps as well.
"""

from __future__ import annotations

import json
import math
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from runtime.events import RANK_FILE
from wizard.errors import TargetError
from wizard.monitor.attach import MAX_WORLD_SIZE, REMOTE_DIR, RUN_FILE
from wizard.monitor.run_files import events_files, open_regular, read_head, read_json_object
from wizard.monitor.state import JobState
from wizard.monitor.summary_text import SUMMARY_FILE
from wizard.monitor.values import is_step, is_time, number

CHUNK = 1024 * 1024  # bytes of an events file read at a time
BATCH_BYTES = 8 * CHUNK  # lines of many files sorted by kind at once (numpy's cost per call is in the microseconds)
LONGEST_LINE = 8 * CHUNK  # a line longer than this (no newline in sight) is skipped, not held
SAMPLED_POINTS = 131_072  # step events parsed in all: per rank, this over the rank count (within the bounds below)
MIN_SAMPLES, MAX_SAMPLES = 32, 4096
NEWLINE = ord("\n")
LINE_START = b'{"schema": 1, "event": "'  # how EventWriter starts every line; the kind follows
KIND_AT = len(LINE_START)
LINE_START_MARKS = [(i, LINE_START[i]) for i in (0, 3, 11, 16, KIND_AT - 1)]
NAN = float("nan")


@dataclass
class RankRecord:
    """One rank as the report draws it: sampled step values, its starts, checkpoints and end."""

    rank: int
    times: array = field(default_factory=lambda: array("d"))
    loss: array = field(default_factory=lambda: array("f"))
    rate: array = field(default_factory=lambda: array("f"))  # this rank's own samples per second
    forward_s: array = field(default_factory=lambda: array("f"))
    data_s: array = field(default_factory=lambda: array("f"))
    memory: array = field(default_factory=lambda: array("f"))  # the window's peak memory, GiB
    starts: list[float] = field(default_factory=list)
    last_step: dict[str, Any] | None = None

    def add_step(self, event: dict[str, Any], world_size: int) -> None:
        """Keep one sampled step event (a repeat of the newest is dropped)."""
        at = event.get("time")
        if not _time(at) or (self.times and at <= self.times[-1]):
            return
        rate, loss, forward, data = (event.get(k) for k in ("samples_per_s", "loss", "forward_s", "data_s"))
        rate = _figure(rate)
        self.times.append(at)
        self.loss.append(_figure(loss))
        self.rate.append(rate / world_size if world_size else rate)  # the event gives the job's rate
        self.forward_s.append(_figure(forward))
        self.data_s.append(_figure(data))
        self.memory.append(_figure(event.get("memory_peak_bytes")) / 2**30)


@dataclass
class RunRecord:
    """Everything the report shows of one run folder."""

    run_dir: Path
    info: dict[str, Any]  # run.json ({} when the ranks ran without npu-wizard run)
    summary: dict[str, Any] | None  # summary.json, once the runner wrote it
    state: JobState  # the rare events and each rank's last step, folded as the monitor folds them
    ranks: dict[int, RankRecord]
    checkpoints: list[dict[str, Any]]
    skipped_lines: int = 0
    files: dict[int, list[Path]] = field(default_factory=dict)  # each rank's events files

    @property
    def world_size(self) -> int:
        """The ranks of the job."""
        return self.state.world_size

    @property
    def started_at(self) -> float:
        """When the run started: run.json's time, else the first event's."""
        first = [r.starts[0] for r in self.ranks.values() if r.starts] + [
            r.times[0] for r in self.ranks.values() if r.times
        ]
        said = [self.info.get("started_at"), (self.summary or {}).get("started_at")]
        return next((t for t in said if _time(t)), min(first, default=0.0))

    @property
    def has_steps(self) -> bool:
        """Whether any rank logged a step."""
        return any(len(r.times) for r in self.ranks.values())

    def node_of(self, rank: int) -> int | None:
        """The node of `rank`, as it said or from the layout."""
        return self.state.node_of(rank)


def read_run(run_dir: Path) -> RunRecord:
    """Read the run folder `run_dir` (events/, remote/events/, run.json, summary.json)."""
    info = read_json_object(run_dir / RUN_FILE) or {}
    summary = read_json_object(run_dir / SUMMARY_FILE)
    files: dict[int, list[Path]] = {}
    for folder in (run_dir, run_dir / REMOTE_DIR):
        for path in events_files(folder):  # a FIFO or a device among them is refused, by name
            match = RANK_FILE.fullmatch(path.name)
            if match:
                files.setdefault(int(match.group(1)), []).append(path)
    world_size = _world_size(info, summary, files)
    if world_size > MAX_WORLD_SIZE:
        raise TargetError(
            f"{run_dir} holds ranks up to {world_size - 1}: npu-wizard runs 1 to {MAX_WORLD_SIZE} ranks, "
            "so this is no run folder of its own"
        )
    state = JobState(world_size, nodes=info.get("node_count"), hang_after=math.inf)  # a node_count not a count: None
    record = RunRecord(run_dir, info, summary, state, {}, [], files=files)
    samples = max(MIN_SAMPLES, min(MAX_SAMPLES, SAMPLED_POINTS // max(1, len(files))))
    batch = Batch(record)
    for rank in sorted(files):
        ranked = record.ranks.setdefault(rank, RankRecord(rank))
        sizes = [path.stat().st_size for path in files[rank]]
        for path, size in zip(files[rank], sizes, strict=True):
            share = max(2, samples * size // max(1, sum(sizes)))
            record.skipped_lines += _scan(path, size, share, ranked, batch)
    batch.flush()
    for ranked in record.ranks.values():
        if ranked.last_step is not None:
            state.ingest(ranked.last_step)
            ranked.add_step(ranked.last_step, world_size)
    return record


def _scan(path: Path, size: int, samples: int, ranked: RankRecord, batch: Batch) -> int:
    """Hand one events file's complete lines to the batch a chunk at a time; return the overlong lines skipped."""
    targets = sorted({size * k // samples for k in range(samples)})
    skipped, skipping, carry, offset = 0, False, b"", 0
    handle = open_regular(path)
    if handle is None:  # gone since it was listed
        return 0
    with handle:  # read up to the size it had when listed: a file still growing is not followed
        while offset < size and (chunk := handle.read(min(CHUNK, size - offset))):
            data = carry + chunk
            base = offset - len(carry)
            offset += len(chunk)
            if skipping:  # the rest of an overlong line
                cut = data.find(b"\n")
                if cut < 0:
                    carry = b""
                    continue
                data, base, skipping = data[cut + 1 :], base + cut + 1, False
            end = data.rfind(b"\n") + 1
            body, carry = data[:end], data[end:]
            if len(carry) > LONGEST_LINE:
                carry, skipping, skipped = b"", True, skipped + 1
            if body:
                batch.add(ranked, body, [t - base for t in targets if base <= t < base + len(body)])
    return skipped


class Batch:
    """Complete lines of many files, sorted by kind in one pass of numpy and parsed in one call of json.

    A line that starts as EventWriter starts every line is told a step or a heartbeat by the letters after
    that start, unparsed; any other line (another kind, or written some other way) is parsed whole. Of the
    steps, the first at or after each target offset of its piece is parsed, and the piece's last.
    """

    def __init__(self, record: RunRecord) -> None:
        self.record = record
        self.pieces: list[tuple[RankRecord, bytes, list[int]]] = []
        self.size = 0

    def add(self, ranked: RankRecord, body: bytes, targets: list[int]) -> None:
        """Queue complete lines of `ranked`'s file, with the offsets (within `body`) of the steps to sample."""
        self.pieces.append((ranked, body, targets))
        self.size += len(body)
        if self.size >= BATCH_BYTES:
            self.flush()

    def flush(self) -> None:
        """Sort, sample and parse every queued line; fold the results into the record."""
        if not self.pieces:
            return
        pieces, self.pieces, self.size = self.pieces, [], 0
        body = b"".join(piece[1] for piece in pieces)
        bounds = np.cumsum([0] + [len(piece[1]) for piece in pieces])
        starts, ends, steps, routine = _sort_lines(body)
        piece_of_line = np.searchsorted(bounds, starts, side="right") - 1
        targets = np.array([t + int(bounds[i]) for i, piece in enumerate(pieces) for t in piece[2]], dtype=np.int64)
        owner = np.searchsorted(bounds, targets, side="right") - 1
        chosen = np.searchsorted(starts[steps], targets)
        keep = chosen < len(steps)
        chosen, owner = chosen[keep], owner[keep]
        sampled = steps[chosen[piece_of_line[steps[chosen]] == owner]]
        last_of_piece = np.searchsorted(piece_of_line[steps], np.arange(len(pieces)), side="right") - 1
        lasts = steps[last_of_piece[last_of_piece >= 0]]
        rare = np.flatnonzero(~routine & (ends > starts))
        wanted = np.unique(np.concatenate([sampled, lasts, rare]))
        is_sampled, is_last = np.isin(wanted, sampled).tolist(), np.isin(wanted, lasts).tolist()
        owners = piece_of_line[wanted].tolist()
        lines = [body[a:b] for a, b in zip(starts[wanted].tolist(), ends[wanted].tolist(), strict=True)]
        for event, piece, rare_line, sample, last in zip(
            parse_lines(lines), owners, (~routine[wanted]).tolist(), is_sampled, is_last, strict=True
        ):
            ranked = pieces[piece][0]
            if event is None or event.get("rank") != ranked.rank:
                continue
            if rare_line:
                _rare_event(event, ranked, self.record)
            elif event.get("event") == "step":
                if sample:
                    ranked.add_step(event, self.record.world_size)
                    self.record.state.lm_figures.step_done(event)  # a language model's tokens/s and MFU
                if last:
                    ranked.last_step = event


def _sort_lines(body: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each line's start and end in `body`, the lines that are EventWriter's steps, and those that are routine."""
    raw = np.frombuffer(body, dtype=np.uint8)
    ends = np.flatnonzero(raw == NEWLINE)
    starts = np.concatenate(([0], ends[:-1] + 1))
    wide = np.flatnonzero(ends - starts > KIND_AT + 3)
    at = starts[wide]
    standard = np.ones(len(wide), dtype=bool)
    for offset, byte in LINE_START_MARKS:  # a few bytes of the start tell it (comparing all costs 5x)
        standard &= raw[at + offset] == byte
    first, second, third = raw[at + KIND_AT], raw[at + KIND_AT + 1], raw[at + KIND_AT + 2]
    steps = wide[standard & (first == ord("s")) & (second == ord("t")) & (third == ord("e"))]
    routine = np.zeros(len(starts), dtype=bool)
    routine[steps] = True
    routine[wide[standard & (first == ord("h")) & (second == ord("e")) & (third == ord("a"))]] = True
    return starts, ends, steps, routine


def parse_lines(lines: list[bytes]) -> list[dict[str, Any] | None]:
    """Each line as its JSON object (None for a line that is none): one parse for all, line by line if one is bad."""
    try:
        events = json.loads(b"[" + b",".join(lines) + b"]")
    except (ValueError, RecursionError):  # RecursionError: a line nested deeper than the parser goes
        events = []
        for line in lines:
            try:
                events.append(json.loads(line))
            except (ValueError, RecursionError):
                events.append(None)
    return [event if isinstance(event, dict) else None for event in events]


def _rare_event(event: dict[str, Any] | None, ranked: RankRecord, record: RunRecord) -> None:
    if event is None or event.get("rank") != ranked.rank:
        return
    kind = event.get("event")
    if kind in ("step", "heartbeat"):  # a line written some other way than EventWriter's
        if kind == "step":
            ranked.last_step = event
        return
    record.state.ingest(event)
    at, step = event.get("time"), event.get("step")
    if kind == "started" and _time(at):
        ranked.starts.append(float(at))
    elif kind == "checkpoint" and _time(at):
        step = step if is_step(step) else None  # the page groups by it
        record.checkpoints.append({"rank": ranked.rank, "time": at, "step": step, "path": str(event.get("path"))})


def _time(value: object) -> bool:
    """Whether `value` is a time: a finite number of seconds within reach of a date, not 0 (a file may say anything)."""
    return is_time(value) and value != 0


def _figure(value: object) -> float:
    """`value` as a column holds it: a float as it is (NaN and Infinity too), else NaN where it is no number."""
    if type(value) is float:
        return value
    figure = number(value)
    return NAN if figure is None else figure


def _world_size(info: dict[str, Any], summary: dict[str, Any] | None, files: dict[int, list[Path]]) -> int:
    said = info.get("world_size") or (summary or {}).get("world_size")
    if is_step(said) and said > 0:
        return max(said, max(files, default=-1) + 1)
    for paths in files.values():  # a run without npu-wizard run: the `started` events say
        for path in paths:
            for line in (read_head(path) or b"").split(b"\n")[:-1]:
                try:
                    size = json.loads(line).get("world_size")
                except (ValueError, AttributeError, RecursionError):
                    continue
                if is_step(size) and size > 0:
                    return max(size, max(files) + 1)
    return max(files, default=0) + 1
