"""Reading a run folder's files: regular files only, each read to a bound, anything else refused by name.

A run folder is anyone's to write into (a cluster's scratch disk): a FIFO in place of summary.json blocks a
reader for ever, a link to /dev/zero fills its memory, a link to a private file shows that file in a report.
Every reader of run.json, summary.json, events files and logs goes through here: a file is opened without
following a link and without waiting (O_NOFOLLOW, O_NONBLOCK), and read only if what was opened is a regular
file; a whole-file read stops at its bound. What is refused raises `RunFileError`, whose message is one line
naming the file and what it is.

Three ways to read a file: whole, refused past a bound (`read_bounded`, `read_json_object`, `read_events`); only
its end or its start, at most a bound of it (`read_tail`, `read_head`); or at most a bound of its end or start
cut on whole lines, with the file's whole size (`read_part`: what the bundle keeps of a log). A folder is listed
without following links (`entries`), and a link or a file in place of a folder is refused (`is_folder`).
"""

from __future__ import annotations

import errno
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from runtime.events import RANK_FILE, EventFollower
from wizard.errors import TargetError

JSON_LIMIT = 64 * 2**20  # run.json, summary.json: a summary of 65,536 ranks is some 20 MiB
TAIL_BYTES = 64 * 1024  # the end of a log read for its last lines
HEAD_BYTES = 64 * 1024  # the start of an events file read for its `started` event
EVENTS_FOLDER = "events"
OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_NOFOLLOW | os.O_CLOEXEC
KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a folder",
    stat.S_IFLNK: "a symbolic link",
}


class RunFileError(TargetError):
    """A file of a run folder that is no regular file, or larger than it may be."""


@dataclass(frozen=True)
class Read:
    """What `read_part` read of a file: at most its bound of it, and the file's whole size."""

    data: bytes
    size: int

    @property
    def cut(self) -> bool:
        """Whether part of the file was left out."""
        return len(self.data) < self.size


def kind_of(mode: int) -> str:
    """What a file of this mode (stat's st_mode) is, in words."""
    return KINDS.get(stat.S_IFMT(mode), "no regular file")


def refusal(path: Path, mode: int) -> str:
    """The one line that refuses `path`, which is a file of kind `mode` (stat's st_mode)."""
    return (
        f"{path} is {kind_of(mode)}, not a regular file: npu-wizard reads only regular files in a run folder "
        "(move it away)"
    )


def open_regular(path: Path) -> BinaryIO | None:
    """`path` open for reading; None where there is no such file; RunFileError for anything but a regular file."""
    try:
        fd = os.open(path, OPEN_FLAGS)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as error:
        if error.errno == errno.ELOOP:  # O_NOFOLLOW met a link
            raise RunFileError(refusal(path, stat.S_IFLNK)) from None
        raise RunFileError(f"cannot read {path}: {error.strerror or error}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise RunFileError(refusal(path, mode))
    return os.fdopen(fd, "rb")


def check_regular(path: Path) -> bool:
    """Whether there is a file at `path`; RunFileError where what is there is no regular file."""
    try:
        mode = path.lstat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as error:
        raise RunFileError(f"cannot read {path}: {error.strerror or error}") from None
    if not stat.S_ISREG(mode):
        raise RunFileError(refusal(path, mode))
    return True


def read_bounded(path: Path, limit: int) -> bytes | None:
    """The whole of `path` (None for no file); RunFileError where it is no regular file or holds over `limit` bytes."""
    handle = open_regular(path)
    if handle is None:
        return None
    with handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise RunFileError(f"{path} holds over {limit:,} bytes, more than a run folder's file of its kind does")
    return data


def read_tail(path: Path, limit: int = TAIL_BYTES) -> bytes | None:
    """The last `limit` bytes of `path` (None for no file); RunFileError where it is no regular file."""
    handle = open_regular(path)
    if handle is None:
        return None
    with handle:
        size = os.fstat(handle.fileno()).st_size
        handle.seek(max(0, size - limit))
        return handle.read(limit)


def read_head(path: Path, limit: int = HEAD_BYTES) -> bytes | None:
    """The first `limit` bytes of `path` (None for no file); RunFileError where it is no regular file."""
    handle = open_regular(path)
    if handle is None:
        return None
    with handle:
        return handle.read(limit)


def read_part(path: Path, limit: int, *, head: bool = False) -> Read | None:
    """At most the last (with `head`: the first) `limit` bytes of `path`, on whole lines where it is cut, and its
    whole size; None for no file; RunFileError where it is no regular file or cannot be read."""
    handle = open_regular(path)
    if handle is None:
        return None
    with handle:
        try:
            size = os.fstat(handle.fileno()).st_size
            start = 0 if head else max(0, size - limit)
            handle.seek(start)
            data = handle.read(min(limit, size - start))
        except OSError as error:
            raise RunFileError(f"cannot read {path}: {error.strerror or error}") from None
    if head and len(data) < size and b"\n" in data:  # the head ends on a whole line
        data = data[: data.rindex(b"\n") + 1]
    if start and b"\n" in data:  # the tail starts on a whole line
        data = data[data.index(b"\n") + 1 :]
    return Read(data, size)


def entries(folder: Path) -> list[tuple[str, int]]:
    """The names in `folder` with their modes (links not followed), sorted; [] for no such folder."""
    try:
        listed = list(os.scandir(folder))
    except FileNotFoundError:
        return []
    except OSError as error:
        raise RunFileError(f"cannot read {folder}: {error.strerror or error}") from None
    return sorted((entry.name, entry.stat(follow_symlinks=False).st_mode) for entry in listed)


def is_folder(path: Path) -> bool:
    """Whether `path` is a real folder (not a link to one); RunFileError for a link or any other file there."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(mode):
        raise RunFileError(refusal(path, mode))
    return True


def read_json_object(path: Path, limit: int = JSON_LIMIT) -> dict[str, Any] | None:
    """The object in the JSON file `path`; None for no file, no JSON or JSON that is no object.

    RunFileError where the file is no regular file or larger than `limit`.
    """
    data = read_bounded(path, limit)
    if data is None:
        return None
    try:
        found = json.loads(data)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
        return None
    return found if isinstance(found, dict) else None


def log_lines(path: Path, lines: int, limit: int = TAIL_BYTES) -> list[str]:
    """The last `lines` lines of the log `path`; none for no file, one line saying why for a file refused."""
    try:
        tail = read_tail(path, limit)
    except RunFileError as refused:
        return [f"({refused})"]
    return [] if tail is None else tail.decode(errors="replace").splitlines()[-lines:]


def events_files(run_dir: Path) -> list[Path]:
    """The events files `<run_dir>/events/rank-R.jsonl`, by name; RunFileError where one is no regular file."""
    folder = run_dir / EVENTS_FOLDER
    if not folder.is_dir():
        return []
    found = sorted(path for path in folder.iterdir() if RANK_FILE.fullmatch(path.name))
    for path in found:
        check_regular(path)
    return found


EVENTS_LIMIT = 256 * 2**20  # an events file read whole (a smoke or network check run's: a few KiB)


def read_events(run_dir: Path, limit: int = EVENTS_LIMIT) -> dict[int, list[dict[str, Any]]]:
    """Every rank's events in `run_dir`, keyed by rank, in file order (runtime.events.read_events, bounded).

    A line that is no JSON object, and a torn last line, are passed over; RunFileError for a file refused.
    """
    found: dict[int, list[dict[str, Any]]] = {}
    for path in events_files(run_dir):
        match = RANK_FILE.fullmatch(path.name)
        data = read_bounded(path, limit) if match else None
        if match is None or data is None:
            continue
        events = found.setdefault(int(match.group(1)), [])
        for line in data.split(b"\n")[:-1]:
            try:
                event = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if isinstance(event, dict):
                events.append(event)
    return dict(sorted(found.items()))


class RegularFollower(EventFollower):
    """An EventFollower that reads regular files only: a file that is none is passed over and named in `refused`.

    A run folder is checked whole when it is opened (`events_files`); this keeps a file swapped for a FIFO or a
    device later from blocking the monitor or feeding it without end.
    """

    def __init__(self, run_dir: Path) -> None:
        super().__init__(run_dir)
        self.refused: dict[Path, str] = {}  # each file passed over, with the line that says why

    def _read(self, path: Path) -> list[dict[str, Any]]:
        try:
            check_regular(path)
        except RunFileError as refused:
            self.refused.setdefault(path, str(refused))
            return []
        return super()._read(path)
