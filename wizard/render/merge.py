"""A line-level three-way merge (diff3), as `git merge-file` does it.

`merge(base, yours, theirs)` takes the generator's old output (`base`), the
user's copy (`yours`) and the generator's new output (`theirs`). Lines that
are unchanged on both sides anchor the merge; between two anchors a chunk
changed on one side only takes that side, a chunk changed alike on both sides
takes either, and a chunk changed differently on both sides is a conflict.
Two edits separated by at least one unchanged line are separate chunks, so
nearby edits on different lines merge cleanly.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

YOURS_MARKER = "<<<<<<< yours"
SEPARATOR = "======="
THEIRS_MARKER = ">>>>>>> npu-wizard update"


@dataclass(frozen=True)
class Conflict:
    """Lines both sides changed differently: where they are in the user's copy (1-based, inclusive)."""

    first: int
    last: int

    def describe(self) -> str:
        """'line 12', 'lines 12-15', or where an insertion sits."""
        if self.last < self.first:
            return f"after line {self.last}" if self.last else "at the start"
        return f"line {self.first}" if self.first == self.last else f"lines {self.first}-{self.last}"


@dataclass(frozen=True)
class MergeResult:
    """The merged text (with conflict markers where the sides disagree) and the conflicts."""

    text: str
    conflicts: tuple[Conflict, ...]

    @property
    def clean(self) -> bool:
        """Whether every chunk merged without a conflict."""
        return not self.conflicts


def merge(base: str, yours: str, theirs: str) -> MergeResult:
    """Three-way merge of whole texts, line by line."""
    if yours == theirs or theirs == base:
        return MergeResult(yours, ())
    if yours == base:
        return MergeResult(theirs, ())
    base_lines, your_lines, their_lines = (_lines(text) for text in (base, yours, theirs))
    out: list[str] = []
    conflicts: list[Conflict] = []
    for chunk in _chunks(base_lines, your_lines, their_lines):
        old, mine, new, mine_start = chunk
        if mine == new or new == old:
            out.extend(mine)
        elif mine == old:
            out.extend(new)
        else:
            conflicts.append(Conflict(mine_start + 1, mine_start + len(mine)))
            out.extend(_conflict_lines(mine, new))
    return MergeResult("".join(out), tuple(conflicts))


def merge_two_way(yours: str, theirs: str) -> MergeResult:
    """Without a base: lines both texts share are kept, and every run where they differ is a conflict.

    Nothing tells a line the user added from one the generator dropped, so no
    difference is settled silently, not even a one-sided insertion.
    """
    if yours == theirs:
        return MergeResult(yours, ())
    your_lines, their_lines = _lines(yours), _lines(theirs)
    out: list[str] = []
    conflicts: list[Conflict] = []
    y = t = 0
    for your_at, their_at, size in [*_matching(your_lines, their_lines), (len(your_lines), len(their_lines), 0)]:
        if (your_at, their_at) != (y, t):
            conflicts.append(Conflict(y + 1, your_at))
            out.extend(_conflict_lines(your_lines[y:your_at], their_lines[t:their_at]))
        out.extend(your_lines[your_at : your_at + size])
        y, t = your_at + size, their_at + size
    return MergeResult("".join(out), tuple(conflicts))


def _conflict_lines(mine: list[str], new: list[str]) -> list[str]:
    """Both sides of a conflict between markers, each marker on a line of its own."""
    return [YOURS_MARKER + "\n", *_terminated(mine), SEPARATOR + "\n", *_terminated(new), THEIRS_MARKER + "\n"]


Chunk = tuple[list[str], list[str], list[str], int]


def _chunks(base: list[str], yours: list[str], theirs: list[str]) -> Iterator[Chunk]:
    """Alternating stable and changed chunks: (base, yours, theirs, where yours starts)."""
    b = y = t = 0
    for base_at, your_at, their_at, size in _anchors(base, yours, theirs):
        if (base_at, your_at, their_at) != (b, y, t):
            yield base[b:base_at], yours[y:your_at], theirs[t:their_at], y
        if size:
            yield (
                base[base_at : base_at + size],
                yours[your_at : your_at + size],
                theirs[their_at : their_at + size],
                your_at,
            )
        b, y, t = base_at + size, your_at + size, their_at + size


def _anchors(base: list[str], yours: list[str], theirs: list[str]) -> Iterator[tuple[int, int, int, int]]:
    """Runs of base lines both sides kept, as (base, yours, theirs, length), then an end marker."""
    mine = _matching(base, yours)
    new = _matching(base, theirs)
    i = j = 0
    while i < len(mine) and j < len(new):
        base_a, your_at, size_a = mine[i]
        base_b, their_at, size_b = new[j]
        start = max(base_a, base_b)
        end = min(base_a + size_a, base_b + size_b)
        if start < end:
            yield start, your_at + start - base_a, their_at + start - base_b, end - start
        if base_a + size_a < base_b + size_b:
            i += 1
        else:
            j += 1
    yield len(base), len(yours), len(theirs), 0


def _matching(a: Sequence[str], b: Sequence[str]) -> list[tuple[int, int, int]]:
    """difflib's matching blocks without its junk heuristic (it would skip common lines of long files)."""
    blocks = difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks()
    return [(block.a, block.b, block.size) for block in blocks if block.size]


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _terminated(lines: list[str]) -> list[str]:
    """Lines with a final newline, so that a marker after them starts its own line."""
    if lines and not lines[-1].endswith("\n"):
        return [*lines[:-1], lines[-1] + "\n"]
    return lines
