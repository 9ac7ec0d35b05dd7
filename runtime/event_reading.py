"""Reading the ranks' event files: whole (`read_events`) or followed live (`EventFollower`).

runtime/events.py writes them, one JSON line per event and one file per rank
(`<run dir>/events/rank-<R>.jsonl`); these readers skip what a killed rank
leaves behind (a torn last line) and never hold more of a file than they are
asked to. Their names are importable from runtime.events as well.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

Event = dict[str, Any]
# bytes of one events file an EventFollower reads per poll: 1 MiB keeps a 200 MB run folder under 40 MB resident
FOLLOW_CHUNK = 1024 * 1024
RANK_FILE = re.compile(r"rank-(\d+)\.jsonl")


def read_rank_events(path: Path, *, strict: bool = False) -> list[Event]:
    """The events in one rank's file; a torn last line (still being written) is skipped.

    A complete line that is not JSON is skipped too, unless `strict`.
    """
    lines = Path(path).read_bytes().split(b"\n")
    events: list[Event] = []
    for number, line in enumerate(lines[:-1], start=1):
        if not line.strip():
            continue
        try:
            events.append(json.loads(line))
        except ValueError:
            if strict:
                raise ValueError(f"{path}:{number}: not a JSON event line") from None
    return events


def read_events(run_dir: Path, *, strict: bool = False) -> dict[int, list[Event]]:
    """Every rank's events in `run_dir`, keyed by rank, in file order."""
    found: dict[int, list[Event]] = {}
    for path in sorted((Path(run_dir) / "events").glob("rank-*.jsonl")):
        match = RANK_FILE.fullmatch(path.name)
        if match:
            found[int(match.group(1))] = read_rank_events(path, strict=strict)
    return dict(sorted(found.items()))


class EventFollower:
    """Reads the events appended since the last poll, for a live monitor.

    Each poll reads at most `chunk` bytes of each file, so memory stays bounded
    whatever a run folder holds; `behind` says whether more is waiting. A line
    longer than a chunk (a rank that printed a huge message into an event) is
    skipped to its end and counted in `skipped`, never read whole.
    """

    def __init__(self, run_dir: Path, chunk: int = FOLLOW_CHUNK) -> None:
        self.folder = Path(run_dir) / "events"
        self.chunk = chunk
        self.behind = False
        self.skipped = 0
        self._offsets: dict[Path, int] = {}
        self._skipping: set[Path] = set()

    def poll(self) -> dict[int, list[Event]]:
        """New complete events per rank since the previous poll (at most a chunk of each file)."""
        fresh: dict[int, list[Event]] = {}
        self.behind = False
        for path in sorted(self.folder.glob("rank-*.jsonl")):
            match = RANK_FILE.fullmatch(path.name)
            if not match:
                continue
            events = self._read(path)
            if events:
                fresh[int(match.group(1))] = events
        return fresh

    def _read(self, path: Path) -> list[Event]:
        offset = self._offsets.get(path, 0)
        with path.open("rb") as handle:
            handle.seek(offset)
            chunk = handle.read(self.chunk + 1)
        if len(chunk) > self.chunk:
            chunk, self.behind = chunk[: self.chunk], True
        end = chunk.rfind(b"\n") + 1
        if (
            path in self._skipping
        ):  # the rest of an overlong line: drop it up to its newline
            if end == 0:
                self._offsets[path] = offset + len(chunk)
                return []
            first = chunk.find(b"\n") + 1
            self._skipping.discard(path)
            chunk, offset = chunk[first:], offset + first
            end -= first
        if end == 0 and len(chunk) == self.chunk:  # one line longer than a whole chunk
            self._skipping.add(path)
            self.skipped += 1
            self._offsets[path] = offset + len(chunk)
            salvaged = _salvage(chunk[:SALVAGE_BYTES])
            return [salvaged] if salvaged is not None else []
        self._offsets[path] = offset + end
        events = []
        for line in chunk[:end].split(b"\n"):
            if not line.strip():
                continue
            try:
                events.append(json.loads(line))
            except ValueError:
                continue  # a line torn by a killed rank; the next one is whole
        return events


def _salvage(head: bytes) -> Event | None:
    """What the start of an event line too long to read says: its kind, time, rank and a clipped message."""
    text = head.decode("utf-8", errors="replace")
    fields = {
        name: re.search(rf'"{name}": ?{pattern}', text)
        for name, pattern in _SALVAGED.items()
    }
    if not (fields["event"] and fields["time"] and fields["rank"]):
        return None
    try:
        event: Event = {
            "event": fields["event"].group(1),
            "time": float(fields["time"].group(1)),
            "rank": int(fields["rank"].group(1)),
        }
    except (
        ValueError
    ):  # "time": 1.2.3 is no number: the line is skipped like any other bad one
        return None
    for name in ("type", "message"):
        found = fields[name]
        if found:
            event[name] = _json_string(found.group(1)) + (
                _CUT if name == "message" else ""
            )
    return event


_CUT = " [... the event line was too long to read whole; the rank's log has it ...]"


def _json_string(body: str) -> str:
    """A JSON string's body as text (cut mid-escape, its last characters dropped)."""
    for end in range(len(body), max(-1, len(body) - 6), -1):
        try:
            return json.loads(f'"{body[:end]}"')
        except ValueError:
            continue
    return body


_SALVAGED = {
    "event": r'"(\w+)"',
    "time": r"([0-9][0-9.e+-]*)",
    "rank": r"(\d+)",
    "type": r'"(\w{1,200})"',
    "message": r'"((?:[^"\\]|\\.){0,2000})',
}
SALVAGE_BYTES = 64 * 1024
