"""Why the job is stuck: every rank's stack and collectives at a hang, grouped, with the odd ones out named.

`judge` takes the records of hang/ (hang_records.py) and says, in one paragraph and as data:

    hang at 14:02:11 UTC: ranks 0-2, 4-7 wait in all_reduce #412 (gloo, 4.0 MB float32) called from
    train.py:201 (loss.backward()); rank 3 never entered #412: its last collective is #411 and it is at
    train.py:118 in load_batch

Ranks are grouped by where they wait: the collective they are in (sequence number, operation, sizes, dtypes)
and the innermost frame of the user's own code in their main thread (not torch's, a library's, Python's or
npu-wizard's runtime). The largest group of those that entered the newest collective any rank entered comes
first, whatever the ranks' numbers; every other group is said against it: a rank whose last collective is older
than that one never entered it, a collective that differs at the same sequence number, a rank elsewhere. Ranks that
did not answer are named with their process state. Without a flight recorder the stacks alone are judged, and
the verdict says so.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from wizard.monitor.hang_records import HANG_FOLDER, Entry, Frame, RankRecord, clean_record, read_hang_folder

__all__ = ["HangVerdict", "Group", "hang_summary", "judge", "read_hang_folder", "ranks_text"]

IN, OUTSIDE, NO_ANSWER = "in_collective", "outside", "did_not_answer"
COMPLETED = "completed"
# the recorder's dtype names (torch's C++ ScalarType) as Python spells them
DTYPES = {
    "Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16", "Long": "int64",
    "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8", "Bool": "bool",
}  # fmt: skip
# where a collective waits in torch's Python: the function is the operation
COLLECTIVE_FILES = re.compile(r"[/\\]torch(_npu)?[/\\]distributed[/\\]")
NOT_USERS = re.compile(
    r"[/\\](site|dist)-packages[/\\]|[/\\]lib[/\\]python\d+(\.\d+)?t?[/\\]|[/\\]torch(_npu)?[/\\]|^<|^$"
)
RUNTIME_FILES = {path.stem for path in (Path(__file__).parents[2] / "runtime").glob("*.py")}
CODE_SHOWN = 60  # characters of the line of code a group is called from


@dataclass(frozen=True)
class Place:
    """A frame of the user's code: file, line, function and its code."""

    file: str
    line: int
    function: str
    code: str

    def at(self) -> str:
        """`train.py:118`."""
        return f"{Path(self.file).name}:{self.line}"


@dataclass(frozen=True)
class Collective:
    """The collective a rank waits in (from its flight recorder; `seq` None: from its stack alone)."""

    op: str
    seq: int | None = None
    group: str = "0"
    backend: str | None = None
    sizes: list[list[int]] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    bytes: int | None = None

    def payload(self) -> str:
        """`4.0 MB float32`: the size and the dtypes ("" where the recorder said none)."""
        if self.bytes is None or not self.sizes:
            return ""
        return f"{human_bytes(self.bytes)} {'/'.join(dict.fromkeys(dtype_name(d) for d in self.dtypes))}".strip()

    def shape(self) -> str:
        """`gloo, 4.0 MB float32`: the backend, the size and the dtypes."""
        return ", ".join(s for s in (self.backend or "", self.payload()) if s)

    def named(self) -> str:
        """`all_reduce #412 (gloo, 4.0 MB float32)`."""
        seq = f" #{self.seq}" if self.seq is not None else ""
        group = f" of group {self.group}" if self.group != "0" else ""
        shape = self.shape()
        return f"{self.op}{seq}{group}" + (f" ({shape})" if shape else "")


@dataclass
class Group:
    """Ranks that are in the same place; `kind` says how it stands against the largest group."""

    ranks: list[int]
    kind: str  # waiting, outside, never_entered, differs, elsewhere, did_not_answer
    words: str
    collective: Collective | None = None
    last_collective: int | None = None
    place: Place | None = None
    state: str | None = None  # a rank that did not answer: its process state


@dataclass
class HangVerdict:
    """The verdict: groups of ranks (the largest first), the odd ones out, the ranks that did not answer."""

    time: float | None
    groups: list[Group]
    odd_ones_out: list[int]
    did_not_answer: list[int]
    recorder: str  # all, some or none: which ranks had a flight recorder
    text: str

    def as_dict(self) -> dict[str, Any]:
        """For summary.json."""
        return asdict(self)


@dataclass
class _Rank:
    """One answered rank, read: where it is and what it waits in."""

    record: RankRecord
    status: str  # IN or OUTSIDE
    collective: Collective | None
    place: Place | None

    def key(self) -> tuple[Any, ...]:
        where = (self.place.file, self.place.line) if self.place else None
        found = self.collective
        return (self.status, found and (found.op, found.seq, found.group, str(found.sizes), str(found.dtypes)), where)


def judge(
    records: Mapping[int, RankRecord | dict[str, Any]] | Iterable[RankRecord],
    time_at: float | None = None,
    asked: bool = False,
) -> HangVerdict:
    """The verdict on the ranks' records (`time_at`: when they were collected; else the newest record's).

    `asked`: the stacks were asked for (`monitor --stacks`), not collected at a hang; the text says so.

    A record is a RankRecord (read_hang_folder), or a rank's record as JSON gives it, keyed by its rank.
    """
    if isinstance(records, Mapping):
        found = [r if isinstance(r, RankRecord) else clean_record(rank, r) for rank, r in records.items()]
    else:
        found = list(records)
    found.sort(key=lambda record: record.rank)
    done = completed_anywhere(record for record in found if record.answered)
    answered = [_read(record, done) for record in found if record.answered]
    silent = [record for record in found if not record.answered]
    at = time_at if time_at is not None else max((r.time for r in found if r.time is not None), default=None)
    newest = max((r.record.last_entered for r in answered if r.record.last_entered is not None), default=None)
    groups = _group(answered, newest)
    head = "stacks asked" if asked else "hang"
    head += f" at {time.strftime('%H:%M:%S', time.gmtime(at))} UTC" if at is not None else ""
    said: list[Group] = []
    if groups:
        said.append(_main_group(groups[0], answered, done))
        said += [_against(group, groups[0], newest) for group in groups[1:]]
    said += [_silent(record) for record in silent]
    recorded = [r.record.rank for r in answered if r.record.recorded]
    recorder = "all" if len(recorded) == len(answered) and answered else "some" if recorded else "none"
    clauses = [group.words for group in said] or ["no rank's record was found"]
    text = f"{head}: " + "; ".join(clauses)
    if recorder != "all" and answered:
        text += _no_recorder([r for r in answered if not r.record.recorded], recorder)
    main = set(said[0].ranks) if groups else set()
    return HangVerdict(
        time=at,
        groups=said,
        odd_ones_out=sorted(record.rank for record in found if record.rank not in main),
        did_not_answer=[record.rank for record in silent],
        recorder=recorder,
        text=text,
    )


P2P = ("send", "recv", "isend", "irecv")


def completed_anywhere(records: Iterable[RankRecord]) -> set[tuple[str, int]]:
    """The (group, seq) of every collective some rank's recorder saw complete.

    A collective that completed on one rank was entered by every rank of its group, and none of them waits in it
    for a peer: a rank whose own recorder has not yet marked it completed (gloo retires its entries a moment after
    the call returns) is not stuck there. Point-to-point operations are left out: they involve two ranks only.
    """
    return {
        (entry.group, entry.seq)
        for record in records
        for entry in record.entries
        if entry.state == COMPLETED and entry.op not in P2P
    }


def _read(record: RankRecord, done: set[tuple[str, int]]) -> _Rank:
    place = users_frame(record.main)
    if record.recorded:
        pending = _pending(record, done)
        if pending is not None:
            return _Rank(record, IN, _collective(pending, record.backend), place)
        return _Rank(record, OUTSIDE, None, place)
    op = stack_collective(record.main)
    return _Rank(record, IN if op else OUTSIDE, Collective(op) if op else None, place)


def _pending(record: RankRecord, done: set[tuple[str, int]]) -> Entry | None:
    """The collective the rank waits in: its newest one not completed (on any rank), the default group's first."""
    waiting = [entry for entry in record.entries if entry.state != COMPLETED and (entry.group, entry.seq) not in done]
    newest = [entry for entry in waiting if entry.group == "0" and entry.seq == record.last_entered]
    return (newest or waiting[-1:] or [None])[0]


def _collective(entry: Entry, backend: str | None) -> Collective:
    sizes = [list(shape) for shape in entry.sizes]
    return Collective(entry.op, entry.seq, entry.group, backend, sizes, list(entry.dtypes), entry.bytes)


def users_frame(frames: list[Frame]) -> Place | None:
    """The innermost frame of the user's own code: not torch's, a library's, Python's or npu-wizard's runtime."""
    for frame in reversed(frames):
        path = frame.file.replace("\\", "/")
        if NOT_USERS.search(path):
            continue
        parts = path.rsplit("/", 2)
        if len(parts) == 3 and parts[1] == "runtime" and Path(parts[2]).stem in RUNTIME_FILES:
            continue
        return Place(frame.file, frame.line, frame.function, frame.code.strip())
    return None


def stack_collective(frames: list[Frame]) -> str | None:
    """The collective a main thread waits in, read from its stack alone (torch.distributed's function)."""
    for frame in reversed(frames):
        if COLLECTIVE_FILES.search(frame.file) and frame.function not in ("wrapper", "wait", "_wait"):
            return frame.function
    return None


def _group(answered: list[_Rank], newest: int | None) -> list[list[_Rank]]:
    """Ranks grouped by where they are: the largest group of those that entered the `newest` collective any rank
    entered first (then the lowest rank); a group that never entered it is never the one the others are said against.
    """
    groups: dict[tuple[Any, ...], list[_Rank]] = {}
    for rank in answered:
        groups.setdefault(rank.key(), []).append(rank)
    return sorted(groups.values(), key=lambda ranks: (_behind(ranks, newest), -len(ranks), ranks[0].record.rank))


def _behind(ranks: list[_Rank], newest: int | None) -> bool:
    """Whether these ranks' last collective entered is older than the `newest` any rank entered."""
    last = ranks[0].record.last_entered
    return newest is not None and last is not None and last < newest


def _main_group(ranks: list[_Rank], answered: list[_Rank], done: set[tuple[str, int]]) -> Group:
    first = ranks[0]
    who = ranks_text([r.record.rank for r in ranks])
    if first.status == IN and first.collective is not None:
        words = f"{who} wait{_s(ranks)} in {first.collective.named()}{_called_from(first.place)}"
        return Group(_numbers(ranks), "waiting", words, first.collective, None, first.place)
    last = first.record.last_entered
    everyone = len(ranks) == len(answered)
    words = f"{'no rank is in a collective: ' if everyone else ''}{who} {_is(ranks)} {_at(first.place)}"
    words += "" if everyone else ", outside any collective"
    if first.record.recorded:
        words += f" ({_last_collective(first.record, 'their' if len(ranks) > 1 else 'its', done)})"
    return Group(_numbers(ranks), "outside", words, None, last, first.place)


def _last_collective(record: RankRecord, its: str, done: set[tuple[str, int]]) -> str:
    """`its last collective, #439, completed`: called completed only where a recorder said so."""
    last, completed = record.last_entered, record.last_completed
    if last is None:
        return "no collective yet"
    if completed == last or ("0", last) in done:
        return f"{its} last collective, #{last}, completed"
    done = f"the last completed #{completed}" if completed is not None else "none completed"
    return f"{its} last collective entered is #{last}, {done}"


def _against(ranks: list[_Rank], main: list[_Rank], newest: int | None) -> Group:
    """A group other than the main one, said against it (`newest`: the newest collective any rank entered)."""
    first, lead = ranks[0], main[0]
    who = ranks_text([r.record.rank for r in ranks])
    mine, theirs = first.collective, lead.collective
    last = first.record.last_entered
    before_newest = newest is not None and (last < newest if last is not None else first.record.recorded)
    if first.status == OUTSIDE and before_newest:
        its, it = ("their", "they") if len(ranks) > 1 else ("its", "it")
        previous = f"{its} last collective is #{last}" if last is not None else f"{it} entered no collective yet"
        words = f"{who} never entered #{newest}: {previous} and {it} {_is(ranks)} {_at(first.place)}"
        return Group(_numbers(ranks), "never_entered", words, None, last, first.place)
    if first.status == OUTSIDE:
        words = f"{who} {_is(ranks)} {_at(first.place)}, outside any collective"
        if first.record.recorded:
            words += f" (last #{last})" if last is not None else ""
        return Group(_numbers(ranks), "elsewhere", words, None, last, first.place)
    assert mine is not None
    if theirs is not None and mine.seq is not None and mine.seq == theirs.seq and mine.group == theirs.group:
        if mine.op != theirs.op:
            words = f"{who} wait{_s(ranks)} in {mine.named()}{_called_from(first.place)}, not in {theirs.op}"
        else:
            words = (
                f"{who} wait{_s(ranks)} in {mine.op} #{mine.seq} with {mine.payload() or 'other sizes'}, "
                f"not {theirs.payload() or 'the same'},{_called_from(first.place)}"
            )
        words += f": the collectives differ at #{mine.seq}"
        return Group(_numbers(ranks), "differs", words, mine, None, first.place)
    words = f"{who} wait{_s(ranks)} in {mine.named()}{_called_from(first.place)}"
    return Group(_numbers(ranks), "waiting", words, mine, None, first.place)


def _silent(record: RankRecord) -> Group:
    process = " ".join(
        s for s in (f"pid {record.pid}" if record.pid else "", f"on {record.host}" if record.host else "") if s
    )
    detail = ", ".join(s for s in (process, f"state {record.state}" if record.state else "") if s)
    words = f"rank {record.rank} did not answer" + (f" ({detail})" if detail else "")
    if record.why:
        words += f": {record.why}"
    place = users_frame(record.main)  # from its faulthandler dump, where a signal reached it
    if place is not None:
        words += f"; its faulthandler dump has it at {place.at()} in {place.function}"
    return Group([record.rank], NO_ANSWER, words, place=place, state=record.state)


def _no_recorder(ranks: list[_Rank], recorder: str) -> str:
    whys = list(dict.fromkeys(r.record.why or "no recorder" for r in ranks))
    who = "" if recorder == "none" else f" on {ranks_text([r.record.rank for r in ranks])}"
    return f" (no collective recorder{who}: {'; '.join(whys)}; judged from the stacks alone)"


def _called_from(place: Place | None) -> str:
    if place is None:
        return ""
    code = place.code.split("  #", 1)[0].strip()  # an inline comment is no part of the call
    code = code if len(code) <= CODE_SHOWN else code[: CODE_SHOWN - 3] + "..."
    return f" called from {place.at()}" + (f" ({code})" if code else f" in {place.function}")


def _at(place: Place | None) -> str:
    return f"at {place.at()} in {place.function}" if place else "in no frame of the user's code"


def _numbers(ranks: list[_Rank]) -> list[int]:
    return [rank.record.rank for rank in ranks]


def _s(ranks: list[Any]) -> str:
    return "" if len(ranks) > 1 else "s"


def _is(ranks: list[Any]) -> str:
    return "are" if len(ranks) > 1 else "is"


def ranks_text(ranks: Iterable[int]) -> str:
    """`rank 3` or `ranks 0-2, 4-7`."""
    found = sorted(set(ranks))
    spans: list[list[int]] = []
    for rank in found:
        if spans and rank == spans[-1][1] + 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    words = ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in spans)
    return f"rank{'s' if len(found) > 1 else ''} {words}"


def human_bytes(count: int) -> str:
    """`4.0 MB`: decimal units, one decimal."""
    units = ("B", "KB", "MB", "GB", "TB")
    size, index = float(count), 0
    while size >= 1000 and index < len(units) - 1:
        size, index = size / 1000, index + 1
    return f"{count} B" if index == 0 else f"{size:.1f} {units[index]}"


def dtype_name(name: str) -> str:
    """The recorder's dtype as Python names it, lowercase: `Float` is float32."""
    return DTYPES.get(name, name.lower())


def hang_summary(run_dir: Path) -> dict[str, Any] | None:
    """summary.json's "hang": the verdict on `run_dir`/hang, its text, and where the files are; None without hang/."""
    folder = read_hang_folder(run_dir)
    if folder is None:
        return None
    verdict = judge(folder.records, folder.time, asked=folder.reason == "asked")
    return {
        **verdict.as_dict(),
        "reason": folder.reason,
        "folder": str(folder.folder),
        "files": [f"{HANG_FOLDER}/rank-{rank}.json" for rank in sorted(folder.records)],
        "problems": folder.problems,
    }
