"""Reading a run folder without trusting it: regular files only, never through a link, never unbounded."""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from wizard.errors import TargetError

MEMBER_LIMIT = 2 * 1024 * 1024  # bytes of one file the bundle keeps: the tail of a bigger one
KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFLNK: "a link",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a folder",
}


@dataclass(frozen=True)
class Read:
    """What was read of a file: its last `limit` bytes at most, and its whole size."""

    data: bytes
    size: int

    @property
    def cut(self) -> bool:
        return len(self.data) < self.size


def kind_of(mode: int) -> str:
    """What a file of this mode is, in words."""
    return KINDS.get(stat.S_IFMT(mode), "not a regular file")


def refuse(path: Path, mode: int) -> TargetError:
    return TargetError(
        f"{path} is {kind_of(mode)}, not a regular file: npu-wizard bundle reads only regular files in a run "
        "folder (move it away and bundle again); nothing was written"
    )


def entries(folder: Path) -> list[tuple[str, int]]:
    """The names in `folder` with their modes (links not followed), sorted; [] for no such folder."""
    try:
        listed = list(os.scandir(folder))
    except FileNotFoundError:
        return []
    except OSError as error:
        raise TargetError(f"cannot read {folder}: {error.strerror or error}") from error
    return sorted((entry.name, entry.stat(follow_symlinks=False).st_mode) for entry in listed)


def is_folder(path: Path) -> bool:
    """Whether `path` is a real folder (not a link to one); a link or any other file in its place is refused."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(mode):
        raise refuse(path, mode)
    return True


def read_bounded(path: Path, limit: int = MEMBER_LIMIT, *, head: bool = False) -> Read | None:
    """The last (with `head`: the first) `limit` bytes of the regular file `path` (None: no such file); refused
    for anything else.

    Opened without following a link and without blocking (a FIFO is never waited on), then checked to be
    a regular file before a byte is read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        return None
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise refuse(path, stat.S_IFLNK) from error
        raise TargetError(f"cannot read {path}: {error.strerror or error}") from error
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise refuse(path, info.st_mode)
        start = 0 if head else max(0, info.st_size - limit)
        os.lseek(fd, start, os.SEEK_SET)
        chunks, left = [], min(limit, info.st_size - start)
        while left > 0:
            chunk = os.read(fd, min(left, 1024 * 1024))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if head and len(data) < info.st_size and b"\n" in data:  # the head ends on a whole line
            data = data[: data.rindex(b"\n") + 1]
        if start and b"\n" in data:  # the tail starts on a whole line
            data = data[data.index(b"\n") + 1 :]
        return Read(data, info.st_size)
    except OSError as error:
        raise TargetError(f"cannot read {path}: {error.strerror or error}") from error
    finally:
        os.close(fd)
