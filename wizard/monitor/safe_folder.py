"""A folder of a run opened once, never through a link; its files are made, read, removed and moved relative
to it (dir_fd), so a link planted in a shared run folder, in its place or inside it, is never followed.

The runner keeps RUN/hang/ and moves a failed attempt's logs into RUN/logs/attempt-N/ this way.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from wizard.monitor.run_files import OPEN_FLAGS, RunFileError, refusal

FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class NotAFolder(OSError):
    """A link, or a file that is no folder, where a run's folder should be."""

    def __init__(self, path: Path, link: bool) -> None:
        what = "a symbolic link, not a folder" if link else "no folder"
        super().__init__(errno.ENOTDIR, f"{path.name} is {what}")
        self.path = path


class Folder:
    """A folder opened once (never through a link): every file in it is acted on relative to the opened folder."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self.fd = path, fd

    @classmethod
    def open(cls, path: Path, *, make: bool = False) -> Folder:
        """`path` opened (made first with `make`); NotAFolder where a link or a file is in its place."""
        if make:
            try:
                os.mkdir(path)
            except FileExistsError:
                pass
        try:
            return cls(path, os.open(path, FOLDER_FLAGS))
        except OSError as error:
            raise _refused(path, error, lambda: os.lstat(path).st_mode) from None

    def folder(self, name: str, *, make: bool = False) -> Folder:
        """The folder `name` in this one, opened (made first with `make`); NotAFolder for a link or a file."""
        if make:
            try:
                os.mkdir(name, dir_fd=self.fd)
            except FileExistsError:
                pass
        try:
            return Folder(self.path / name, os.open(name, FOLDER_FLAGS, dir_fd=self.fd))
        except OSError as error:
            raise _refused(self.path / name, error, lambda: self.mode(name) or 0) from None

    def names(self) -> list[str]:
        """The names in the folder, sorted."""
        return sorted(os.listdir(self.fd))

    def mode(self, name: str) -> int | None:
        """The mode of `name` (a link's own, not followed); None where there is no such file."""
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return None

    def is_file(self, name: str) -> bool:
        """Whether `name` is a regular file (not a link to one)."""
        mode = self.mode(name)
        return mode is not None and stat.S_ISREG(mode)

    def remove(self, name: str) -> None:
        """Remove the file `name` (a link itself, never its target); nothing where it is gone."""
        try:
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            pass

    def read(self, name: str, limit: int) -> bytes | None:
        """The whole regular file `name` (None where there is none); RunFileError for anything else or a bigger one."""
        try:
            fd = os.open(name, OPEN_FLAGS, dir_fd=self.fd)
        except FileNotFoundError:
            return None
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise RunFileError(refusal(self.path / name, stat.S_IFLNK)) from None
            raise RunFileError(f"cannot read {self.path / name}: {error.strerror or error}") from None
        with os.fdopen(fd, "rb") as handle:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise RunFileError(refusal(self.path / name, mode))
            data = handle.read(limit + 1)
        if len(data) > limit:
            raise RunFileError(f"{self.path / name} holds over {limit:,} bytes, more than it may")
        return data

    def write(self, name: str, data: bytes) -> None:
        """Write `name` through a new file of its own beside it, moved into place: a link there is replaced."""
        temporary = f".{name}.{secrets.token_hex(6)}.tmp"
        fd = os.open(temporary, NEW_FILE_FLAGS, 0o666, dir_fd=self.fd)  # O_EXCL: a name someone took fails
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.replace(temporary, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            self.remove(temporary)
            raise

    def move(self, name: str, into: Folder) -> None:
        """Move the file `name` into the folder `into`, under the same name."""
        os.rename(name, name, src_dir_fd=self.fd, dst_dir_fd=into.fd)

    def close(self) -> None:
        """Close the opened folder."""
        os.close(self.fd)

    def __enter__(self) -> Folder:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


def _refused(path: Path, error: OSError, mode: Callable[[], int]) -> OSError:
    """NotAFolder where opening `path` met a link or a file (ELOOP or ENOTDIR, as the kernel says it; `mode`:
    what is there, not followed); else the error as it is."""
    if error.errno not in (errno.ELOOP, errno.ENOTDIR):
        return error
    try:
        link = stat.S_ISLNK(mode())
    except OSError:
        link = False
    return NotAFolder(path, link)
