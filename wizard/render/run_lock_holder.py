"""Whether a run of a project is alive, read from the run locks the runner holds (wizard.run.run_lock takes them).

It sits in render because `npu-wizard update` must refuse to change files under a live run, and the render
stage imports nothing from the run stage: the run lock's file names and what its holder wrote live here.
"""

from __future__ import annotations

import fcntl
import os
import stat
from pathlib import Path

from wizard.errors import TargetError
from wizard.file_locks import takes_no_locks
from wizard.render.pristine import STATE_DIR

LOCK_NAME = "run-node-{node}.lock"
LOCK_GLOB = "run-node-*.lock"
HOLDER_LIMIT = 300  # characters of the holder's line shown


def live_run(project: Path) -> str | None:
    """Who holds a run lock of `project` now (the pid and run folder it wrote), or None when no run holds one."""
    state = project / STATE_DIR
    if state.is_symlink() or not state.is_dir():
        return None
    for path in sorted(state.glob(LOCK_GLOB)):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue  # gone, or a link: no runner made it
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # shared: refused while a runner holds it
            except BlockingIOError:
                return lock_holder(fd, path)
            except OSError as error:
                if not takes_no_locks(error):
                    raise
                return None  # no lock tells: the caller looks for the job's processes
        finally:
            os.close(fd)
    return None


def lock_holder(fd: int, path: Path) -> str:
    """What the holder of the lock `path` (open as `fd`) wrote: printable characters only, and not too many."""
    try:
        raw = os.pread(fd, HOLDER_LIMIT * 4, 0)
    except OSError:
        raw = b""
    text = raw.decode("utf-8", errors="replace").split("\n", 1)[0]
    line = "".join(c for c in text if c.isprintable())[:HOLDER_LIMIT]
    return line or f"{path.name} is held by a runner that has not said who it is yet"


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
