"""One run of each node of a project at a time: an flock on `.npu-wizard/run-node-<N>.lock` for each node it starts.

Two runs of one node would resume from the same checkpoint and both write into
`checkpoints/`; an update would rewrite files under a live run. The runner
holds the lock of every node it starts until it returns, with a line saying
who it is (pid and run folder), so a second run or an update can name it. The
kernel drops a lock when its holder dies, so a runner killed with -9 leaves
none behind (its file stays, and the next run takes it, unless that runner's
job still runs: its processes are named, and nothing starts); a runner that ends
removes its file while it still holds it. The runners of the
other nodes of a cluster (`run --node N` on a folder every host shares) hold
locks of their own. The descriptors are not inherited: the lock is the
runner's, not its job's. On a file system that takes no flock (NFS without
lockd, Lustre without -o flock) the run goes ahead unlocked, and the lock's
`unlocked` says so in one line.
"""

from __future__ import annotations

import fcntl
import os
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from wizard.errors import TargetError, write_advice
from wizard.file_locks import takes_no_locks, unlocked_warning
from wizard.render.pristine import STATE_DIR
from wizard.render.run_lock_holder import LOCK_NAME, lock_holder

ATTEMPTS = 20  # opens that may race with a holder removing the file as it lets go
UNGUARDED = "this run holds no run lock: nothing stops a second run of this project, or an update under it"


class RunLock:
    """The locks a runner holds, one per node it starts; `name_run` says which run folder holds them."""

    def __init__(self, project: Path, fds: dict[Path, int], unlocked: str | None = None) -> None:
        self.project = project
        self._fds = fds
        self.unlocked = unlocked  # why no lock is held (a file system without flock), to be said; None: held

    def name_run(self, run_dir: Path | None) -> None:
        """Write who holds the locks: this runner's pid and its run folder (None: not made yet)."""
        where = f"run folder {_relative(run_dir, self.project)}" if run_dir else "starting"
        line = f"npu-wizard run, pid {os.getpid()}, {where}\n".encode()
        for path, fd in self._fds.items():
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, line, 0)
            except OSError as error:
                raise TargetError(_cannot_write(self.project, path, error)) from None


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
        raise TargetError(_cannot_write(project, state, error)) from None
    if state.is_symlink() or not state.is_dir():
        raise TargetError(
            f"{state} is {'a symbolic link' if state.is_symlink() else 'not a folder'}; npu-wizard keeps its state "
            "there and never writes through a link: remove it, then run again"
        )
    fds: dict[Path, int] = {}
    unlocked = None
    try:
        for node in sorted(set(nodes)):
            path = state / LOCK_NAME.format(node=node)
            try:
                fds[path] = _take(path, project)
            except OSError as error:
                if not takes_no_locks(error):
                    raise
                _remove(path)  # no lock in it: a file left would only mislead
                unlocked = unlocked_warning(path, error, UNGUARDED)
                break
        _refuse_orphaned_jobs(project)
        lock = RunLock(project, fds, unlocked)
        lock.name_run(None)
        yield lock
    finally:
        for path, fd in fds.items():  # removed while still held, so whoever opens it next makes a new one
            try:
                path.unlink()
            except OSError:
                pass  # gone already, or the disk turned read-only: the kernel still drops the lock below
            finally:
                os.close(fd)
        if made:
            try:
                os.rmdir(state)  # only when empty
            except OSError:
                pass


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


def _take(path: Path, project: Path) -> int:
    """The descriptor of `path`, locked; TargetError naming the holder when a live run has it."""
    for _ in range(ATTEMPTS):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
        except OSError as error:
            raise TargetError(_cannot_write(project, path, error)) from None
        if _locked_here(fd, path, project):
            return fd
        os.close(fd)  # its holder removed this file as it let go: open the new one
    raise TargetError(f"the run lock {path} keeps changing hands; run again")


def _locked_here(fd: int, path: Path, project: Path) -> bool:
    """Lock `fd`; False when the file is no longer the one at `path`; TargetError when a live run holds it."""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise TargetError(f"{path} is not a plain file; npu-wizard locks runs with it: remove it, then run again")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise TargetError(
                f"a run of {project} is alive ({lock_holder(fd, path)}), so nothing was started: one run of a project "
                "at a time (a second would resume from the same checkpoint and write into the same checkpoints/); "
                "wait for it to end, or stop it (Ctrl-C in its terminal, or kill -INT its pid), then run again"
            ) from None
        opened, now = os.fstat(fd), os.lstat(path)
    except FileNotFoundError:
        return False
    except BaseException:
        os.close(fd)
        raise
    return (opened.st_dev, opened.st_ino) == (now.st_dev, now.st_ino)


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass  # gone already, or the disk turned read-only: nothing holds it either way


def _relative(path: Path, project: Path) -> str:
    try:
        return str(path.relative_to(project))
    except ValueError:
        return str(path)


def _cannot_write(project: Path, path: Path, error: OSError) -> str:
    return (
        f"cannot run {project}: cannot write {path} ({error.strerror}), so nothing was started: a run writes its "
        f"lock, its run folder and its checkpoints inside the project; {write_advice(error)}, then run again"
    )
