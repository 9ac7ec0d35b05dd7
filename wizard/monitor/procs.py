"""Finding and ending a job's processes, whatever started them.

Launchers put their workers in sessions of their own (torchrun does), so a
process group signal can miss them. Every process of a job inherits the run's
NPU_WIZARD_RUN_DIR, so walking /proc for it finds them all.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path

PROC = Path("/proc")


def job_processes(run_dir: Path, *, exclude: Iterable[int] = ()) -> list[int]:
    """Pids of the live processes whose environment has NPU_WIZARD_RUN_DIR=run_dir."""
    needle = f"NPU_WIZARD_RUN_DIR={run_dir}".encode()
    skip = {os.getpid(), *exclude}
    found = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0") and is_alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def is_alive(pid: int) -> bool:
    """True when `pid` runs (a zombie, dead but not yet reaped, does not count)."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def is_runner(pid: int) -> bool:
    """True when `pid` is an `npu-wizard run` of this user: what a run folder's runner_pid may name."""
    try:
        words = (PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
        owner = (PROC / str(pid)).stat().st_uid
    except OSError:
        return False
    names = [Path(word.decode(errors="replace")).name for word in words]
    wizard = "npu-wizard" in names or "wizard" in names[1:3]  # the script, or python -m wizard
    return wizard and "run" in names and owner == os.getuid()


def signal_all(pids: Iterable[int], sig: int) -> None:
    """Send `sig` to each pid that still exists."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_job(run_dir: Path, grace: float, *, exclude: Iterable[int] = ()) -> list[int]:
    """TERM every process of the run, KILL what is left after `grace` seconds; return the killed."""
    pids = job_processes(run_dir, exclude=exclude)
    signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while pids and time.monotonic() < deadline:
        time.sleep(0.1)
        pids = [pid for pid in pids if is_alive(pid)]
    left = job_processes(run_dir, exclude=exclude)
    signal_all(left, signal.SIGKILL)
    return left
