"""`npu-wizard update`: render a project again from changed answers and keep the user's edits.

The base is the project as generated (its pristine copy), "yours" is the
project as it is now, "theirs" is a fresh render of the new answers. Every
file is merged three ways (wizard.render.merge); `plan_update` works it all out
without writing, `apply_update` writes it (wizard.render.journal makes that atomic).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from wizard.answers.model import Answers, dump, load_text
from wizard.errors import Problem, TargetError, WizardError, shown
from wizard.render import journal, pristine
from wizard.render.into import MARKER_TEXT, clashes, is_into, refuse_clashes, rendered_files
from wizard.render.merge import Conflict, merge, merge_two_way
from wizard.render.project import walk_files

ANSWERS_FILE = "answers.yaml"


@dataclass(frozen=True)
class FileChange:
    """What an update does to one file, and why."""

    path: str
    action: str  # added, updated, merged, removed, kept, conflict
    detail: str = ""
    conflicts: tuple[Conflict, ...] = ()

    def describe(self) -> str:
        """One line for the user."""
        where = ", ".join(c.describe() for c in self.conflicts)
        text = f"{self.action:<8} {shown(self.path)}"
        if where:
            text += f": {where}"
        return f"{text} ({self.detail})" if self.detail else text


@dataclass(frozen=True)
class UpdatePlan:
    """Everything an update would change, worked out without writing."""

    project: Path
    changes: tuple[FileChange, ...]
    writes: dict[str, str | bytes] = field(repr=False)
    removes: tuple[str, ...]
    executable: frozenset[str]
    new_pristine: bytes = field(repr=False)
    old_pristine: bytes = field(repr=False, default=b"")
    warnings: tuple[Problem, ...] = ()

    @property
    def conflicts(self) -> tuple[FileChange, ...]:
        """The files that did not merge cleanly."""
        return tuple(change for change in self.changes if change.action == "conflict")


def plan_update(project: Path, answers: Answers, *, keep_answers_file: bool, rebase: bool = False) -> UpdatePlan:
    """Merge a render of `answers` into `project`; `keep_answers_file` leaves its answers.yaml as the user wrote it.

    `rebase` merges without the pristine copy (missing or damaged): see `_no_base`.
    """
    into = is_into(project)
    base, generated = _no_base(project, into) if rebase else (_load_base(project), set())
    theirs = rendered_files(answers, into=into, repository_folder=pristine.repository_folder(project))
    if into:  # the user's folder: only npu-wizard's files are looked at, and a new one may not land on one of theirs
        ours = {*base.files, *generated, ANSWERS_FILE}
        refuse_clashes(project, clashes(project, set(theirs.files) - ours, ours), "add")
        wanted = {*base.files, *theirs.files, ANSWERS_FILE}
        yours_names = {name for name in wanted if os.path.lexists(project / name)}
    else:
        yours_names = set(walk_files(project))
    # Read never through a link, anywhere in the path: every file to read that is one is named at once.
    journal.check_targets(project, yours_names & (set(base.files) | set(theirs.files) | {ANSWERS_FILE}), ())
    if keep_answers_file:
        theirs.files[ANSWERS_FILE] = read_yours(project, ANSWERS_FILE)
    else:
        theirs.files[ANSWERS_FILE] = dump(answers)
    changes: list[FileChange] = []
    writes: dict[str, str | bytes] = {}
    removes: list[str] = []
    for name in sorted(set(base.files) | set(theirs.files)):
        old, new = base.files.get(name), theirs.files.get(name)
        mine = read_yours(project, name) if name in yours_names else None
        change, text = _merge_file(name, old, mine, new)
        if change is None:
            continue
        changes.append(change)
        if change.action == "removed":
            removes.append(name)
        elif text is not None and text != mine:
            writes[name] = _as_written(text)
    if into and not os.path.lexists(project / pristine.INTO_MARKER):  # lost with .npu-wizard: --rebase puts it back
        writes[pristine.INTO_MARKER] = MARKER_TEXT
    return UpdatePlan(
        project=project,
        changes=tuple(changes),
        writes=writes,
        removes=tuple(removes),
        executable=theirs.executable,
        new_pristine=pristine.encode(theirs),
        old_pristine=b"" if rebase else pristine.read_stored(project),
        warnings=answers.warnings,
    )


def _merge_file(name: str, old: str | None, mine: str | None, new: str | None) -> tuple[FileChange | None, str | None]:
    """One file's outcome and its text afterwards (None: no file)."""
    if new is None:  # the new render no longer has it
        if mine is None or old is None:
            return None, mine
        if mine == old:
            return FileChange(name, "removed", "no longer generated"), None
        return FileChange(name, "kept", "no longer generated, but edited here: left as it is"), mine
    if mine is None:
        if old is None:
            return FileChange(name, "added"), new
        if old == new:
            return None, None  # deleted here and unchanged by the update: stays deleted
        return FileChange(name, "conflict", "deleted here, changed by the update"), new
    result = merge(old, mine, new) if old is not None else merge_two_way(mine, new)
    if result.text == mine:
        return None, mine
    if not result.clean:
        return FileChange(name, "conflict", "", result.conflicts), result.text
    if mine == old:
        return FileChange(name, "updated"), result.text
    return FileChange(name, "merged", "your edits kept"), result.text


def read_yours(project: Path, name: str) -> str:
    """The user's copy of a file as text: bytes that are not UTF-8 (a comment saved in GBK) kept as they are."""
    path, where = project / name, shown(str(project / name))
    if problem := journal.target_problem(project, name):  # never read through a link, anywhere in the path
        raise TargetError(f"{problem}; nothing was changed")
    try:
        if not stat.S_ISREG(path.lstat().st_mode):
            raise TargetError(f"{where} is not a regular file; put the file npu-wizard generated back, then update")
        data = path.read_bytes()
    except OSError as error:
        raise TargetError(f"cannot read {where}: {error.strerror or error}; nothing was changed") from None
    if b"\0" in data:
        raise TargetError(
            f"{where} holds NUL bytes (a binary file, or text saved as UTF-16): update merges text line by line, "
            "so nothing was changed; save it as UTF-8 (iconv -f UTF-16 -t UTF-8) or put the generated file back, "
            "then update again"
        )
    # Every other byte merges as it is, line by line (as git merge-file does): surrogateescape round-trips it.
    return data.decode("utf-8", "surrogateescape")


def _as_written(text: str) -> str | bytes:
    """A merged text as the journal writes it: bytes where it holds the user's bytes that are not UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape")
    return text


def _load_base(project: Path) -> pristine.Pristine:
    _require_answers_file(project)
    try:
        return pristine.load(project)
    except FileNotFoundError:
        problem = f"{project} has no {pristine.PRISTINE} (rendered by an older npu-wizard, or deleted)"
    except ValueError as error:
        problem = f"{project}: {error}"
    except OSError as error:
        problem = f"{project}: cannot read {pristine.PRISTINE} ({error.strerror or error})"
    raise TargetError(
        f"{problem}, so your edits cannot be told from the generator's. To keep them: npu-wizard update {project} "
        "--rebase puts <<<<<<< markers around every difference between your files and the new render, for you to "
        "resolve, and records a new pristine copy (--force would discard your edits)"
    )


def _no_base(project: Path, into: bool) -> tuple[pristine.Pristine, set[str]]:
    """The base of `update --rebase`, for a project whose pristine copy is lost (almost no file has one), and
    the names a render of its answers.yaml writes (npu-wizard's files, in a folder rendered --into).

    A file without a base merges two ways with the new render. answers.yaml is
    its own base (it takes the new answers outright), and a file byte for byte
    as a render of that answers.yaml writes it is unedited: that render is its base.
    """
    _require_answers_file(project)
    recorded = read_yours(project, ANSWERS_FILE)
    files = {ANSWERS_FILE: recorded}
    try:
        rendered = rendered_files(
            load_text(recorded, project.absolute()), into=into, repository_folder=pristine.repository_folder(project)
        )
    except (WizardError, UnicodeError):  # answers that no longer load: every file merges two ways
        rendered = pristine.Pristine("", {}, frozenset())
    for name, text in rendered.files.items():
        plain = os.path.lexists(project / name) and not journal.target_problem(project, name)
        if name != ANSWERS_FILE and plain and read_yours(project, name) == text:
            files[name] = text
    return pristine.Pristine("", files, frozenset()), set(rendered.files)


def _require_answers_file(project: Path) -> None:
    if not (project / ANSWERS_FILE).is_file():
        raise TargetError(f"{project} is not an npu-wizard project (no {ANSWERS_FILE}); name the project folder")
