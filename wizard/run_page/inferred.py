"""The runner's figures of a run without summary.json (still running, its runner killed, or started from the
launch scripts), worked out from the events as the monitor works them out live.

The stragglers need every step event of every rank in time order: the record keeps a sample of them, so they
are replayed here from the events files through a JobState of their own, up to REPLAY_BYTES of files. A run
whose stragglers cannot be judged that way says why; it is never said to have none.

A summary.json, where there is one, is read through `summary_file.checked`: the run folder is anyone's to write into.
"""

from __future__ import annotations

import io
import math
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from wizard.monitor import procs
from wizard.monitor.run_files import open_regular
from wizard.monitor.state import JobState
from wizard.monitor.summary_file import checked
from wizard.monitor.summary_text import stragglers_not_judged, summarize
from wizard.monitor.values import is_step, is_time, number
from wizard.run_page.record import KIND_AT, LINE_START, RunRecord, parse_lines

REPLAY_BYTES = 64 * 2**20  # events files read to judge the stragglers: some 200,000 steps, a few seconds
REPLAYED = ("started", "step", "finished", "error", "lost")  # what moves the straggler detector
REPLAYED_STARTS = {kind.encode()[:3] for kind in REPLAYED}  # the first letters of those kinds: ste, sta, ...
PARSED_AT_ONCE = 4096  # lines handed to one json call


def effective_summary(record: RunRecord) -> dict[str, Any]:
    """summary.json as the runner wrote it; without one, the same figures from the events, outcome inferred."""
    if record.summary is not None:
        return checked(record.summary)
    state = record.state
    pid = record.info.get("runner_pid")
    if isinstance(pid, int) and procs.is_alive(pid):
        outcome = "running"
    elif state.finished():
        outcome = "finished"
    elif state.root_cause() is not None:
        outcome = "failed"
    else:
        outcome = "unknown"
    ended = max((v.last_said for v in state.ranks.values() if v.last_said), default=record.started_at)
    made = summarize(state, started_at=record.started_at, ended_at=ended, outcome=outcome, failure=state.root_cause())
    made["inferred"] = True
    found = replayed_stragglers(record, made["wall_s"])
    if isinstance(found, str):
        made["stragglers"], made["stragglers_not_judged"] = None, found
    else:
        made["stragglers"], made["stragglers_not_judged"] = found, None
    return made


def replayed_stragglers(record: RunRecord, wall_s: float) -> list[dict[str, object]] | str:
    """The stragglers the monitor would have named, from every step event in time order; or why none were judged."""
    files = [(rank, path) for rank in sorted(record.files) for path in record.files[rank]]
    size = sum(_size(path) for _, path in files)
    if size > REPLAY_BYTES:
        return (
            f"the events files hold {size / 2**20:,.0f} MiB, more than the {REPLAY_BYTES // 2**20} MiB read to "
            "replay every step (npu-wizard run writes summary.json with the stragglers it saw live)"
        )
    steps, others = _Steps(), []  # others: (the order read in, the event)
    for rank, path in files:
        for event in _events(path, rank):
            if event["event"] == "step":
                steps.add(event, len(steps) + len(others))
            else:
                others.append((len(steps) + len(others), event))
    if not steps.timed:
        return "no step event carries forward_s or data_s"
    state = JobState(record.world_size, nodes=record.state.nodes, hang_after=math.inf)
    for event in steps.merged(others):
        state.ingest(event)
    return stragglers_not_judged(state) or state.stragglers.as_dicts(wall_s)


class _Steps:
    """Step events as columns (a few numbers each, not a dict), with the order they were read in."""

    def __init__(self) -> None:
        self.time, self.data, self.forward = array("d"), array("d"), array("d")
        self.rank, self.step, self.order = array("q"), array("q"), array("q")
        self.timed = False

    def __len__(self) -> int:
        return len(self.time)

    def add(self, event: dict[str, Any], order: int) -> None:
        """Keep what the straggler detector reads of one step event."""
        step = event.get("step")
        if not is_step(step):  # the detector passes over it
            return
        data, forward = (_finite(event.get(key)) for key in ("data_s", "forward_s"))
        self.timed = self.timed or not (math.isnan(data) and math.isnan(forward))
        self.time.append(event["time"])
        self.rank.append(event["rank"])
        self.step.append(step)
        self.data.append(data)
        self.forward.append(forward)
        self.order.append(order)

    def merged(self, others: list[tuple[int, dict[str, Any]]]) -> Iterator[dict[str, Any]]:
        """The steps and the `(order, event)` of `others`, by time, then in the order they were read."""
        times = np.concatenate(
            [np.frombuffer(self.time, dtype=np.float64), np.array([e["time"] for _, e in others], dtype=np.float64)]
        )
        orders = np.concatenate(
            [np.frombuffer(self.order, dtype=np.int64), np.array([order for order, _ in others], dtype=np.int64)]
        )
        count = len(self)
        for index in np.lexsort((orders, times)).tolist():
            if index >= count:
                yield others[index - count][1]
                continue
            event = {"event": "step", "rank": self.rank[index], "time": self.time[index], "step": self.step[index]}
            for key, column in (("data_s", self.data), ("forward_s", self.forward)):
                if not math.isnan(column[index]):
                    event[key] = column[index]
            yield event


def _events(path: Path, rank: int) -> Iterator[dict[str, Any]]:
    """The events of `rank` in one file that move the straggler detector, in file order; other lines unparsed."""
    lines: list[bytes] = []
    try:
        handle = open_regular(path)
        with handle or io.BytesIO() as handle:  # none: gone since it was listed
            for line in handle:
                if line.startswith(LINE_START) and line[KIND_AT : KIND_AT + 3] not in REPLAYED_STARTS:
                    continue  # a heartbeat, warning or checkpoint, told by its first letters
                lines.append(line)
                if len(lines) >= PARSED_AT_ONCE:
                    yield from _wanted(lines, rank)
                    lines = []
    except OSError:  # a file that went away or cannot be read: what was read counts
        pass
    yield from _wanted(lines, rank)


def _wanted(lines: list[bytes], rank: int) -> Iterator[dict[str, Any]]:
    for event in parse_lines([line.rstrip(b"\n") for line in lines if line.endswith(b"\n")]):
        if event is None or event.get("rank") != rank or event.get("event") not in REPLAYED:
            continue
        if is_time(event.get("time")):
            yield event


def _finite(value: object) -> float:
    figure = number(value)
    return math.nan if figure is None else figure


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
