"""The hang/ folder of a run, read safely: each rank's record (runtime/stacks.py's shape) as typed values.

The runner writes hang/rank-N.json for each rank it asked at a hang (the rank's snapshot and "answered":
true, or "answered": false with the process state it saw) and hang/collected.json. A run folder is anyone's
to write into: every file goes through run_files (regular files only, bounded), and every value of a record is
taken only as the kind it should be, so a torn or hostile file is one line in `problems`, never a traceback.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wizard.monitor.run_files import RunFileError, read_json_object
from wizard.monitor.values import is_step, is_time

HANG_FOLDER = "hang"
COLLECTED_FILE = "collected.json"
RANK_RECORD = re.compile(r"rank-(\d{1,7})\.json")
RECORD_LIMIT = 8 * 2**20  # a record: bounded stacks and collectives, and the recorder's dump (1 MiB at most)
MAX_RECORDS = 65_536  # ranks read from one folder
MAX_THREADS, MAX_FRAMES, MAX_ENTRIES = 64, 128, 256  # of one record, past runtime/stacks.py's own bounds
TEXT = 400  # characters of one file name, function or line of code kept


@dataclass(frozen=True)
class Frame:
    """One frame of a stack: where, in which function, and its line of code."""

    file: str
    line: int
    function: str
    code: str = ""


@dataclass(frozen=True)
class Entry:
    """One collective of a rank's flight recorder."""

    seq: int
    op: str
    group: str
    sizes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    bytes: int | None
    state: str


@dataclass
class RankRecord:
    """What one rank answered at the hang (or, `answered` false, what the runner saw of it)."""

    rank: int
    answered: bool
    time: float | None = None
    pid: int | None = None
    host: str | None = None
    main: list[Frame] = field(default_factory=list)  # the main thread's frames, outermost first
    recorded: bool = False  # whether a flight recorder said what the rank's collectives were
    backend: str | None = None
    entries: list[Entry] = field(default_factory=list)
    last_entered: int | None = None
    last_completed: int | None = None
    why: str | None = None  # why there is no recorder, or why the rank did not answer
    state: str | None = None  # the process state of a rank that did not answer: "T (stopped)"
    faulthandler: str | None = None


@dataclass
class HangFolder:
    """Every record of a run's hang/ folder, and a line for each file that could not be read."""

    folder: Path
    records: dict[int, RankRecord]
    problems: list[str]
    time: float | None  # when the runner collected them (collected.json), else None
    reason: str | None  # "hang" or "asked"


def read_hang_folder(run_dir: Path) -> HangFolder | None:
    """The records in `run_dir`/hang; None where there is no such folder."""
    folder = run_dir / HANG_FOLDER
    if not folder.is_dir() or folder.is_symlink():
        return None
    records: dict[int, RankRecord] = {}
    problems: list[str] = []
    names = []
    try:
        for count, path in enumerate(folder.iterdir()):
            if count >= 4 * MAX_RECORDS:
                problems.append(f"{folder} holds over {4 * MAX_RECORDS:,} files: the rest were not read")
                break
            if (match := RANK_RECORD.fullmatch(path.name)) and len(names) < MAX_RECORDS:
                names.append((int(match.group(1)), path))
    except OSError as error:
        problems.append(f"cannot read the folder {folder}: {error.strerror or error}")
    for rank, path in sorted(names):
        try:
            found = read_json_object(path, RECORD_LIMIT)
        except RunFileError as refused:
            problems.append(str(refused))
            found = None
        else:
            if found is None:
                problems.append(f"{path} is no JSON object (torn, or written by something else): not read")
        records[rank] = clean_record(rank, found) if found is not None else unreadable(rank, path)
    try:
        collected = read_json_object(folder / COLLECTED_FILE) or {}
    except RunFileError as refused:
        problems.append(str(refused))
        collected = {}
    at, reason = collected.get("time"), collected.get("reason")
    return HangFolder(
        folder, records, problems, at if is_time(at) else None, reason[:20] if isinstance(reason, str) else None
    )


def unreadable(rank: int, path: Path) -> RankRecord:
    """A rank whose record file could not be read: as one that did not answer, saying why."""
    return RankRecord(rank, answered=False, why=f"its record {path.parent.name}/{path.name} could not be read")


def clean_record(rank: int, found: dict[str, Any]) -> RankRecord:
    """One rank's record, each value taken only where it is of the kind the record's shape says."""
    pid, at = found.get("pid"), found.get("time")
    record = RankRecord(
        rank,
        answered=found.get("answered") is not False and isinstance(found.get("threads"), list),
        time=at if is_time(at) else None,
        pid=pid if is_step(pid) else None,
        host=_text(found.get("host")),
        why=_text(found.get("why")),
        state=_text(found.get("state")),
        faulthandler=_text(found.get("faulthandler"), 16 * 1024),
    )
    if not record.answered and record.faulthandler:
        record.main = faulthandler_frames(record.faulthandler)
        return record
    threads = [t for t in _list(found.get("threads"), MAX_THREADS) if isinstance(t, dict)]
    main = next((t for t in threads if t.get("main") is True), threads[0] if threads else {})
    record.main = [f for f in map(_frame, _list(main.get("frames"), MAX_FRAMES)) if f is not None]
    collectives = found.get("collectives")
    if record.answered and isinstance(collectives, dict):
        if collectives.get("source"):
            record.recorded = True
            record.backend = _text(collectives.get("backend"))
            record.entries = [e for e in map(_entry, _list(collectives.get("entries"), MAX_ENTRIES)) if e]
            record.last_entered = _whole(collectives.get("last_entered"))
            record.last_completed = _whole(collectives.get("last_completed"))
        else:
            record.why = _text(collectives.get("why")) or "the rank recorded no collectives"
    return record


FAULT_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+.*\(most recent call first\):$", re.M)
FAULT_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (\S+)$', re.M)


def faulthandler_frames(text: str) -> list[Frame]:
    """The frames of the thread the signal interrupted (its main thread), outermost first, from faulthandler's dump.

    faulthandler writes each thread's frames innermost first, the interrupted one headed `Current thread`;
    of several dumps, the last is read.
    """
    heads = list(FAULT_THREAD.finditer(text))
    current = [head for head in heads if head.group(1) == "Current thread"]
    if not heads:
        return []
    head = (current or heads)[-1]
    after = heads[heads.index(head) + 1].start() if head is not heads[-1] else len(text)
    frames = [
        Frame(file[:TEXT], int(line), function[:TEXT])
        for file, line, function in FAULT_FRAME.findall(text[head.end() : after])
        if len(line) < 10
    ]
    return frames[::-1][-MAX_FRAMES:]


def _frame(value: object) -> Frame | None:
    if not isinstance(value, dict) or not isinstance(value.get("file"), str) or not is_step(value.get("line")):
        return None
    return Frame(
        value["file"][:TEXT], value["line"], _text(value.get("function")) or "?", _text(value.get("code")) or ""
    )


def _entry(value: object) -> Entry | None:
    if not isinstance(value, dict) or not is_step(value.get("seq")):
        return None
    sizes = tuple(
        tuple(n for n in shape if is_step(n))[:16] for shape in _list(value.get("sizes"), 16) if isinstance(shape, list)
    )
    dtypes = tuple(str(d)[:40] for d in _list(value.get("dtypes"), 16) if isinstance(d, str))
    return Entry(
        value["seq"],
        _text(value.get("op"), 80) or "?",
        _text(value.get("group"), 80) or "0",
        sizes,
        dtypes,
        _whole(value.get("bytes")),
        _text(value.get("state"), 20) or "scheduled",
    )


def _whole(value: object) -> int | None:
    return value if is_step(value) else None


def _text(value: object, limit: int = TEXT) -> str | None:
    return value[:limit] if isinstance(value, str) else None


def _list(value: object, limit: int) -> list[Any]:
    return value[:limit] if isinstance(value, list) else []
