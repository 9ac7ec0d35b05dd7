"""One `npu-wizard update` of a project at a time: an flock on `.npu-wizard/update.lock` that names its holder.

Two updates at once would share one staging folder and mix their files. The
lock file holds the pid and command of the update that holds it, so a second
one can say who is at work; the kernel drops the lock when its holder dies,
so a killed update never blocks the next one. On a file system that takes
no flock (NFS without lockd, Lustre without -o flock) the update goes ahead
unlocked: the lock yields the one line that says so.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from wizard.errors import TargetError, write_advice
from wizard.file_locks import takes_no_locks, unlocked_warning
from wizard.render.pristine import STATE_DIR

LOCK = f"{STATE_DIR}/update.lock"
HOLDER_LIMIT = 300  # characters of the holder's line shown
ATTEMPTS = 20  # opens that may race with a holder removing the file as it lets go
UNGUARDED = "this update holds no update lock: nothing stops a second update or a run of this project meanwhile"


@contextmanager
def update_lock(project: Path, command: str, *, optional: bool = False) -> Iterator[str | None]:
    """Hold `project`'s update lock for `command`; TargetError naming the holder when another process has it.

    Yields None, or the line to say where the file system takes no locks (the update then goes ahead unlocked).

    A project with no `.npu-wizard/` (its pristine copy lost: `update --rebase`)
    gets one (0700) to hold the lock; it goes again if the update leaves it empty.
    `optional`: a project where the lock cannot be made (read-only, or no
    `.npu-wizard/`) is not locked, for a dry run that writes nothing.
    """
    state = project / STATE_DIR
    made = False
    if not os.path.lexists(state):
        if optional:
            yield
            return
        try:
            os.mkdir(state, 0o700)
            made = True
        except FileExistsError:
            pass  # another update made it just now: the lock inside it decides
        except OSError as error:
            raise TargetError(
                f"cannot make {state} ({error.strerror}), where npu-wizard keeps its state and the update lock; "
                "nothing was changed"
            ) from None
    if state.is_symlink() or not state.is_dir():
        raise TargetError(
            f"{state} is {'a symbolic link' if state.is_symlink() else 'not a folder'}; npu-wizard keeps its state "
            "there and never writes through a link: remove it, then run again"
        )
    path = project / LOCK
    fd = None
    unlocked = None
    try:
        try:
            fd = _take(path, project, command, optional)
        except OSError as error:
            if not takes_no_locks(error):
                raise
            _remove(path)  # no lock in it: a file left would only mislead
            unlocked = unlocked_warning(path, error, UNGUARDED)
        yield unlocked
    finally:
        if fd is not None:
            _let_go(path, fd)
        if made:
            try:
                os.rmdir(state)  # only when empty: the refused update changes nothing
            except OSError:
                pass


def _take(path: Path, project: Path, command: str, optional: bool) -> int | None:
    """The descriptor of the locked file, its holder line written (None: optional and not possible)."""
    for _ in range(ATTEMPTS):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
        except OSError as error:
            if optional and not os.path.islink(path):
                return None
            if error.errno in (errno.EROFS, errno.ENOSPC, errno.EDQUOT):
                raise TargetError(
                    f"cannot take the update lock {path} ({error.strerror}), so nothing was changed: "
                    f"{write_advice(error)}, then run again"
                ) from None
            raise TargetError(
                f"cannot take the update lock {path} ({error.strerror}): it must be a plain file npu-wizard may "
                "write; remove it, then run again"
            ) from None
        if _locked_here(fd, path, project):
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"pid {os.getpid()}: {command}\n".encode(), 0)
            except OSError as error:  # a full disk: the lock goes, and with it the file, as on any let-go
                _let_go(path, fd)
                if optional:
                    return None
                raise TargetError(
                    f"cannot write the update lock {path} ({error.strerror}), so nothing was changed: "
                    f"{write_advice(error)}, then run again"
                ) from None
            return fd
        os.close(fd)  # the holder removed this file as it let go: open the new one
    raise TargetError(f"the update lock {path} keeps changing hands; run again")


def _locked_here(fd: int, path: Path, project: Path) -> bool:
    """Lock `fd`; False when the file is no longer the one at `path`; TargetError when someone holds it."""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise TargetError(
                f"{path} is not a plain file; npu-wizard locks updates with it: remove it, then run again"
            )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise TargetError(
                f"another npu-wizard update of {project} is running ({_holder(fd)}), so nothing was changed: "
                "wait for it to finish (or stop it), then run this one again"
            ) from None
        opened, now = os.fstat(fd), os.lstat(path)
    except FileNotFoundError:
        return False
    except BaseException:
        os.close(fd)
        raise
    return (opened.st_dev, opened.st_ino) == (now.st_dev, now.st_ino)


def _holder(fd: int) -> str:
    """Who holds the lock, from the line it wrote (printable characters only, and not too many)."""
    try:
        text = os.pread(fd, HOLDER_LIMIT * 4, 0).decode("utf-8", errors="replace")
    except OSError:
        text = ""
    line = "".join(c for c in text.split("\n", 1)[0] if c.isprintable())[:HOLDER_LIMIT]
    return f"held by {line}" if line else "its holder has not said who it is yet"


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass  # gone already, or the disk turned read-only: nothing holds it either way


def _let_go(path: Path, fd: int) -> None:
    """Remove the lock file while still holding it, then release it."""
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)


def update_at_work(project: Path) -> str | None:
    """Who holds `project`'s update lock now (an update or a render --into at work), or None when nobody does."""
    path = project / LOCK
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None  # no lock file (it goes with its last holder), or a link no update made
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # shared: refused while an update holds it
    except BlockingIOError:
        return _holder(fd)
    except OSError as error:
        if not takes_no_locks(error):
            raise
        return None  # no lock tells who is at work
    finally:
        os.close(fd)
    return None
