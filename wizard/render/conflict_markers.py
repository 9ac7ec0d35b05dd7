"""Conflict markers that `npu-wizard update --write-conflicts` (or --rebase) left in a project, still unresolved.

A file holds unresolved markers when a line starting `<<<<<<< ` is followed by
a line starting `>>>>>>> `. Only the files npu-wizard generated (the pristine
copy's names) and those an update wrote conflicts into (kept in
.npu-wizard/conflicts.json, in case the pristine copy is lost) are read, never
the user's data. `update` and `run` refuse such a project; `doctor` fails a check.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from wizard.errors import ConflictError, TargetError, shown
from wizard.render import journal, pristine

CONFLICTS = f"{pristine.STATE_DIR}/conflicts.json"
START, END = b"<<<<<<< ", b">>>>>>> "
READ_AT_MOST = 16 * 2**20  # a generated file is kilobytes; a marker past this is not npu-wizard's


@dataclass(frozen=True)
class Unresolved:
    """A file still holding conflict markers, and the line of its first `<<<<<<<`."""

    path: str
    line: int

    def __str__(self) -> str:
        return f"{shown(self.path)} (line {self.line})"


def unresolved(project: Path) -> list[Unresolved]:
    """The files of `project` that still hold conflict markers, by name."""
    found = []
    for name in sorted(_candidates(project)):
        if journal.target_problem(project, name):  # a link anywhere in the path: never read (update names it)
            continue
        line = first_marker(project / name)
        if line is not None:
            found.append(Unresolved(name, line))
    return found


def describe(found: list[Unresolved]) -> str:
    """What is wrong, for a message: the files and the first marker line of each."""
    holds = "holds" if len(found) == 1 else "hold"
    return f"{', '.join(map(str, found))} still {holds} <<<<<<< conflict markers from npu-wizard update"


def fix() -> str:
    """What to do about them."""
    return "in each, keep what you want between <<<<<<< and >>>>>>>, and delete the marker lines"


def refuse_unresolved(project: Path, then: str) -> None:
    """Raise ConflictError naming the files of `project` that still hold markers; `then` says what comes next."""
    found = unresolved(project)
    if found:
        raise ConflictError(f"{describe(found)}: {fix()}, then {then}")


def record_conflicts(project: Path, names: list[str]) -> None:
    """Keep the names of the files an update is about to write conflicts into (none: drop the record).

    Written before the update commits: a record of files that got no markers is harmless, as only markers count.
    Never through a link: a state folder that is not a plain folder of the project gets no record; a record
    that is not a regular file (a link, a folder) is refused (TargetError), changing nothing.
    """
    state, target = project / pristine.STATE_DIR, project / CONFLICTS
    if state.is_symlink() or not state.is_dir():
        return
    try:
        mode = os.lstat(target).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        kind = "a symbolic link" if stat.S_ISLNK(mode) else "a folder" if stat.S_ISDIR(mode) else "not a regular file"
        raise TargetError(
            f"{target} is {kind}; npu-wizard keeps there, as a plain file, the names of the files an update wrote "
            "conflict markers into, so nothing was changed: remove it, then run update again"
        )
    if not names:
        target.unlink(missing_ok=True)
        return
    staged = state / f".conflicts.{os.getpid()}.new"
    staged.unlink(missing_ok=True)
    descriptor = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        file.write(json.dumps(sorted(names)) + "\n")
    os.replace(staged, target)


def first_marker(path: Path) -> int | None:
    """The line of the first `<<<<<<< ` followed later by a `>>>>>>> ` in the regular file `path` (not a link)."""
    try:
        if not stat.S_ISREG(path.lstat().st_mode):
            return None
        with path.open("rb") as file:
            data = file.read(READ_AT_MOST)
    except OSError:
        return None
    opened = None
    for number, line in enumerate(data.split(b"\n"), start=1):
        if line.startswith(START) and opened is None:
            opened = number
        elif line.startswith(END) and opened is not None:
            return opened
    return None


def _candidates(project: Path) -> set[str]:
    """The generated files of `project` and those an update wrote conflicts into."""
    try:
        generated = set(pristine.load(project).files)
    except (OSError, ValueError):  # no copy, or a damaged one (update names it): the record alone counts
        generated = set()
    return generated | set(_recorded(project))


def _recorded(project: Path) -> list[str]:
    """The names in CONFLICTS, the ones inside the project only; none when it is absent or not such a list."""
    path = project / CONFLICTS
    if journal.target_problem(project, CONFLICTS):  # .npu-wizard or the record a link: not read
        return []
    try:
        if not stat.S_ISREG(path.lstat().st_mode) or path.lstat().st_size > 2**20:
            return []
        names = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    if not isinstance(names, list):
        return []
    return [name for name in names if isinstance(name, str) and pristine.is_project_name(name)]
