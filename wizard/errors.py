"""The errors npu-wizard raises; each message says what is wrong and what to do."""

from __future__ import annotations

import errno
from dataclasses import dataclass
from pathlib import Path


def shown(name: str) -> str:
    """A name from a project's own files as printed: as it is, or escaped as repr does when it holds control
    characters (a crafted name must not drive the terminal)."""
    return name if name.isprintable() else repr(name)


def write_advice(error: OSError) -> str:
    """What to do about a write that failed with `error`: free space on a full disk, else make the folder
    writable."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return "free space on that disk (or raise your quota)"
    if error.errno == errno.ENOTDIR:
        return "move it away (npu-wizard never writes through a link, nor in place of a file)"
    if error.errno == errno.EROFS:
        return "that file system is mounted read-only: remount it read-write, or copy the folder to a writable disk"
    return "make the folder writable for you"


@dataclass(frozen=True)
class Problem:
    """One thing wrong (or worth a warning) with the answers."""

    field: str
    value: object
    message: str
    severity: str = "error"

    def __str__(self) -> str:
        if self.field == FILE:
            return self.message
        if self.value is NO_VALUE:
            return f"{self.field}: {self.message}"
        shown = "(missing)" if self.value is _MISSING else _shorten(repr(_plain(self.value)))
        return f"{self.field}: {shown}: {self.message}"


class _Missing:
    def __repr__(self) -> str:
        return "(missing)"


_MISSING = _Missing()
MISSING: object = _MISSING
# A problem with a key itself (given twice, ...), not with its value.
NO_VALUE: object = object()
# The field of a problem with the answers file as a whole.
FILE = "(file)"


SHOWN_CHARACTERS = 80
SHOWN_PROBLEMS = 50


def _shorten(text: str) -> str:
    """At most about SHOWN_CHARACTERS of a value in a message: a bad value may be megabytes."""
    if len(text) <= SHOWN_CHARACTERS:
        return text
    return f"{text[:SHOWN_CHARACTERS]}... ({len(text)} characters)"


def _plain(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value


class WizardError(Exception):
    """Base of every error npu-wizard reports to the user."""

    exit_code = 1


class AnswersError(WizardError):
    """The answers have problems; every one is listed."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        count = len(problems)
        lines = [f"{count} problem{'s' if count != 1 else ''} in the answers (nothing was written):"]
        lines += [f"  - {problem}" for problem in problems[:SHOWN_PROBLEMS]]
        if count > SHOWN_PROBLEMS:
            lines.append(f"  ... and {count - SHOWN_PROBLEMS} more")
        super().__init__("\n".join(lines))


class TargetError(WizardError):
    """The output folder cannot be used as asked (exists without --force, or unsafe)."""


class RenderError(WizardError):
    """Rendering the templates failed; nothing was left behind."""


class ConflictError(WizardError):
    """An update found edits of the user's and of the generator on the same lines."""


def cannot_write(path: Path, error: OSError, then: str = "") -> str:
    """One line for a record of a run that could not be written, `then` saying what became of the job."""
    return f"cannot write {path} ({error.strerror}){then}: {write_advice(error)}"
