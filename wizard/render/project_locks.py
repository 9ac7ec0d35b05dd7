"""The locks of a project: one `npu-wizard update` at a time, and one run of each node at a time.

Both are flocks on files in the project's `.npu-wizard/`, taken the same way: the file is opened without
following a link, locked without waiting, checked to still be the file at its path (a holder removes its file
while it still holds it, as it lets go), and given one line naming its holder, so that whoever is refused can be
told who is at work. The kernel drops a lock when its holder dies, so a holder killed with -9 never blocks the
next one.

- The update lock, `.npu-wizard/update.lock`: two updates at once would share one staging folder and mix their
  files. It names the update's pid and command.
- The run locks, `.npu-wizard/run-node-<N>.lock`, one per node a runner starts: two runs of one node would
  resume from the same checkpoint and both write into `checkpoints/`; an update would rewrite files under a
  live run. Each names the runner's pid and run folder. The descriptors are not inherited: the lock is the
  runner's, not its job's; a runner killed with -9 leaves its file, and the next run takes it unless that
  runner's job still runs (its processes are named, and nothing starts). The runners of the other nodes of a
  cluster (`run --node N` on a folder every host shares) hold locks of their own.

A file system that takes no flock (NFS without lockd, Lustre mounted without `-o flock`) answers flock with
ENOLCK, EOPNOTSUPP or ENOSYS: there a run or an update goes ahead unlocked, and the lock gives the one line that
says so, naming the file system (its type and mount point, from /proc/self/mountinfo) and what goes unguarded.

The run lock sits here, in render, because `npu-wizard update` must refuse to change files under a live run, and
the render stage imports nothing from the run stage.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from wizard.errors import TargetError, write_advice
from wizard.render.pristine import STATE_DIR

UPDATE_LOCK = f"{STATE_DIR}/update.lock"
RUN_LOCK_NAME = "run-node-{node}.lock"
RUN_LOCK_GLOB = "run-node-*.lock"
HOLDER_LIMIT = 300  # characters of the holder's line shown
ATTEMPTS = 20  # opens that may race with a holder removing the file as it lets go
OPEN_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
PEEK_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
NO_LOCKS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS})
MOUNTINFO = Path("/proc/self/mountinfo")
UPDATE_UNGUARDED = "this update holds no update lock: nothing stops a second update or a run of this project meanwhile"
RUN_UNGUARDED = "this run holds no run lock: nothing stops a second run of this project, or an update under it"


# ---- the update lock --------------------------------------------------------------------------------


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
    _refuse_link(state)
    path = project / UPDATE_LOCK
    fd = None
    unlocked = None
    try:
        try:
            fd = _take_update(path, project, command, optional)
        except OSError as error:
            unlocked = _unlocked(path, error, UPDATE_UNGUARDED)
        yield unlocked
    finally:
        if fd is not None:
            _let_go(path, fd)
        if made:
            _remove_if_empty(state)  # the refused update changes nothing


def _take_update(path: Path, project: Path, command: str, optional: bool) -> int | None:
    """The descriptor of the locked update lock, its holder line written (None: optional and not possible)."""

    def cannot_open(error: OSError) -> TargetError | None:
        if optional and not os.path.islink(path):
            return None
        if error.errno in (errno.EROFS, errno.ENOSPC, errno.EDQUOT):
            return TargetError(
                f"cannot take the update lock {path} ({error.strerror}), so nothing was changed: "
                f"{write_advice(error)}, then run again"
            )
        return TargetError(
            f"cannot take the update lock {path} ({error.strerror}): it must be a plain file npu-wizard may "
            "write; remove it, then run again"
        )

    def busy(fd: int) -> TargetError:
        line = _holder_line(fd)
        return TargetError(
            f"another npu-wizard update of {project} is running "
            f"({f'held by {line}' if line else 'its holder has not said who it is yet'}), so nothing was changed: "
            "wait for it to finish (or stop it), then run this one again"
        )

    fd = _take(
        path,
        cannot_open,
        busy,
        f"{path} is not a plain file; npu-wizard locks updates with it: remove it, then run again",
        "the update lock",
    )
    if fd is None:
        return None
    try:
        _write_holder(fd, f"pid {os.getpid()}: {command}")
    except OSError as error:  # a full disk: the lock goes, and with it the file, as on any let-go
        _let_go(path, fd)
        if optional:
            return None
        raise TargetError(
            f"cannot write the update lock {path} ({error.strerror}), so nothing was changed: "
            f"{write_advice(error)}, then run again"
        ) from None
    return fd


def update_at_work(project: Path) -> str | None:
    """Who holds `project`'s update lock now (an update or a render --into at work), or None when nobody does."""
    line = _held_by(project / UPDATE_LOCK)
    if line is None:
        return None
    return f"held by {line}" if line else "its holder has not said who it is yet"


# ---- the run locks ----------------------------------------------------------------------------------


class RunLock:
    """The locks a runner holds, one per node it starts; `name_run` says which run folder holds them."""

    def __init__(self, project: Path, fds: dict[Path, int], unlocked: str | None = None) -> None:
        self.project = project
        self._fds = fds
        self.unlocked = unlocked  # why no lock is held (a file system without flock), to be said; None: held

    def name_run(self, run_dir: Path | None) -> None:
        """Write who holds the locks: this runner's pid and its run folder (None: not made yet)."""
        where = f"run folder {_relative(run_dir, self.project)}" if run_dir else "starting"
        for path, fd in self._fds.items():
            try:
                _write_holder(fd, f"npu-wizard run, pid {os.getpid()}, {where}")
            except OSError as error:
                raise TargetError(_cannot_run(self.project, path, error)) from None


@contextmanager
def run_lock(project: Path, nodes: Iterable[int]) -> Iterator[RunLock]:
    """Hold the run lock of each of `nodes` of `project`; TargetError naming the live run when one is held."""
    state = project / STATE_DIR
    made = False
    try:
        os.mkdir(state, 0o700)
        made = True
    except FileExistsError:
        pass
    except OSError as error:
        raise TargetError(_cannot_run(project, state, error)) from None
    _refuse_link(state)
    fds: dict[Path, int] = {}
    unlocked = None
    try:
        for node in sorted(set(nodes)):
            path = state / RUN_LOCK_NAME.format(node=node)
            try:
                fd = _take_run(path, project)
            except OSError as error:
                unlocked = _unlocked(path, error, RUN_UNGUARDED)
                break
            if fd is not None:
                fds[path] = fd
        _refuse_orphaned_jobs(project)
        lock = RunLock(project, fds, unlocked)
        lock.name_run(None)
        yield lock
    finally:
        for path, fd in fds.items():  # removed while still held, so whoever opens it next makes a new one
            _let_go(path, fd)
        if made:
            _remove_if_empty(state)


def _take_run(path: Path, project: Path) -> int | None:
    """The descriptor of the locked run lock `path`; TargetError naming the holder when a live run has it."""

    def busy(fd: int) -> TargetError:
        return TargetError(
            f"a run of {project} is alive ({lock_holder(fd, path)}), so nothing was started: one run of a project "
            "at a time (a second would resume from the same checkpoint and write into the same checkpoints/); "
            "wait for it to end, or stop it (Ctrl-C in its terminal, or kill -INT its pid), then run again"
        )

    return _take(
        path,
        lambda error: TargetError(_cannot_run(project, path, error)),
        busy,
        f"{path} is not a plain file; npu-wizard locks runs with it: remove it, then run again",
        "the run lock",
    )


def live_run(project: Path) -> str | None:
    """Who holds a run lock of `project` now (the pid and run folder it wrote), or None when no run holds one."""
    state = project / STATE_DIR
    if state.is_symlink() or not state.is_dir():
        return None
    for path in sorted(state.glob(RUN_LOCK_GLOB)):
        line = _held_by(path)
        if line is not None:
            return line or f"{path.name} is held by a runner that has not said who it is yet"
    return None  # no runner holds one, or no lock tells: the caller looks for the job's processes


def lock_holder(fd: int, path: Path) -> str:
    """What the holder of the run lock `path` (open as `fd`) wrote: printable characters only, and not too many."""
    return _holder_line(fd) or f"{path.name} is held by a runner that has not said who it is yet"


def refuse_live_run(project: Path, doing: str) -> None:
    """TargetError naming the live run of `project` (a runner holding its lock, or a job's processes left running
    in one of its run folders) before `doing` changes files under it."""
    alive = live_run(project)
    if alive is None:
        from wizard.render.replace import live_runs

        alive = "; ".join(live_runs(project)) or None
    if alive:
        raise TargetError(
            f"a run of {project} is alive ({alive}), so nothing was changed: {doing} would change files under it; "
            "wait for it to end, or stop it (Ctrl-C in its terminal, or kill -INT its pid), then run again"
        )


def _refuse_orphaned_jobs(project: Path) -> None:
    """TargetError naming the processes of a job whose runner died (its lock went with it) and that still run."""
    from wizard.render.replace import orphaned_jobs

    left = orphaned_jobs(project)
    if left:
        raise TargetError(
            f"a job of {project} still runs without its runner ({'; '.join(left)}), so nothing was started: a "
            "second job would resume from the same checkpoint and write into the same checkpoints/; stop those "
            "processes (kill -INT PID), then run again"
        )


def _cannot_run(project: Path, path: Path, error: OSError) -> str:
    return (
        f"cannot run {project}: cannot write {path} ({error.strerror}), so nothing was started: a run writes its "
        f"lock, its run folder and its checkpoints inside the project; {write_advice(error)}, then run again"
    )


# ---- taking, reading and letting go of one lock file -------------------------------------------------


def _take(
    path: Path,
    cannot_open: Callable[[OSError], TargetError | None],
    busy: Callable[[int], TargetError],
    not_plain: str,
    what: str,
) -> int | None:
    """The descriptor of `path`, locked; `busy`'s error while another process holds it.

    None where `cannot_open` says so for a file that cannot be opened; OSError where the file system takes no
    locks (`takes_no_locks`), its file removed (no lock in it: a file left would only mislead).
    """
    for _ in range(ATTEMPTS):
        try:
            fd = os.open(path, OPEN_FLAGS, 0o644)
        except OSError as error:
            refused = cannot_open(error)
            if refused is None:
                return None
            raise refused from None
        try:
            if _locked_here(fd, path, busy, not_plain):
                return fd
        except OSError as error:
            if takes_no_locks(error):
                _remove(path)
            raise
        os.close(fd)  # its holder removed this file as it let go: open the new one
    raise TargetError(f"{what} {path} keeps changing hands; run again")


def _locked_here(fd: int, path: Path, busy: Callable[[int], TargetError], not_plain: str) -> bool:
    """Lock `fd`; False when the file is no longer the one at `path`; `busy`'s error when someone holds it."""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise TargetError(not_plain)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise busy(fd) from None
        opened, now = os.fstat(fd), os.lstat(path)
    except FileNotFoundError:
        return False
    except BaseException:
        os.close(fd)
        raise
    return (opened.st_dev, opened.st_ino) == (now.st_dev, now.st_ino)


def _write_holder(fd: int, line: str) -> None:
    """Say who holds the lock open as `fd`, in one line that replaces what was there."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{line}\n".encode(), 0)


def _held_by(path: Path) -> str | None:
    """The line of whoever holds the lock `path` now ('' where it said nothing yet); None where nobody holds it,
    there is no such plain file (it goes with its last holder; a link no npu-wizard made), or no lock tells."""
    try:
        fd = os.open(path, PEEK_FLAGS)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # shared: refused while a holder has it
    except BlockingIOError:
        return _holder_line(fd)
    except OSError as error:
        if not takes_no_locks(error):
            raise
        return None
    finally:
        os.close(fd)
    return None


def _holder_line(fd: int) -> str:
    """The first line the holder wrote into the lock open as `fd`: printable characters only, and not too many."""
    try:
        raw = os.pread(fd, HOLDER_LIMIT * 4, 0)
    except OSError:
        raw = b""
    text = raw.decode("utf-8", errors="replace").split("\n", 1)[0]
    return "".join(c for c in text if c.isprintable())[:HOLDER_LIMIT]


def _let_go(path: Path, fd: int) -> None:
    """Remove the lock file while still holding it, then release it."""
    try:
        path.unlink()
    except OSError:
        pass  # gone already, or the disk turned read-only: the kernel still drops the lock below
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass  # gone already, or the disk turned read-only: nothing holds it either way


def _refuse_link(state: Path) -> None:
    """TargetError where the state folder is a link or no folder: npu-wizard never writes through a link."""
    if state.is_symlink() or not state.is_dir():
        raise TargetError(
            f"{state} is {'a symbolic link' if state.is_symlink() else 'not a folder'}; npu-wizard keeps its state "
            "there and never writes through a link: remove it, then run again"
        )


def _remove_if_empty(state: Path) -> None:
    try:
        os.rmdir(state)  # only when empty
    except OSError:
        pass


def _relative(path: Path, project: Path) -> str:
    try:
        return str(path.relative_to(project))
    except ValueError:
        return str(path)


# ---- file systems that take no flock ----------------------------------------------------------------


def takes_no_locks(error: OSError) -> bool:
    """Whether `error` from flock says the file system takes no locks (rather than a held lock or a bad file)."""
    return error.errno in NO_LOCKS


def _unlocked(path: Path, error: OSError, unguarded: str) -> str:
    """The warning for a lock `path` not taken because of `error`; `error` itself where it is no lack of locks."""
    if not takes_no_locks(error):
        raise error
    return unlocked_warning(path, error, unguarded)


def file_system(path: Path, mountinfo: Path = MOUNTINFO) -> str:
    """The file system `path` lies on, as 'nfs4 mounted at /shared'; 'its file system' where that cannot be told."""
    where = os.path.realpath(path)
    try:
        lines = mountinfo.read_text(errors="replace").splitlines()
    except OSError:
        return "its file system"
    best: tuple[str, str] | None = None
    for line in lines:
        fields, _, after = line.partition(" - ")
        parts, kind = fields.split(), after.split()
        if len(parts) < 5 or not kind:
            continue
        mount_point = _unescaped(parts[4])
        inside = where == mount_point or where.startswith(mount_point.rstrip("/") + "/")
        if inside and (best is None or len(mount_point) >= len(best[1])):  # the last of equal mounts is on top
            best = (kind[0], mount_point)
    return f"{best[0]} mounted at {best[1]}" if best else "its file system"


def unlocked_warning(path: Path, error: OSError, unguarded: str) -> str:
    """The one line that says `path` could not be locked, on which file system, and what goes unguarded."""
    return (
        f"{path.parent} is on {file_system(path.parent)}, which takes no file locks (flock: {error.strerror}): "
        f"{unguarded}; for the lock, mount it with locking (NFS: with lockd, without nolock; Lustre: -o flock) "
        "or keep the project on a local disk"
    )


def _unescaped(field: str) -> str:
    """A mountinfo path: space, tab, newline and backslash are written as octal escapes."""
    for code in ("040", "011", "012", "134"):
        field = field.replace("\\" + code, chr(int(code, 8)))
    return field
