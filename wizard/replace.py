"""Replacing an existing project with --force without destroying anything alive or mounted.

A project may be training (its run folder names the runner's pid, and every
process of a job carries NPU_WIZARD_RUN_DIR), may hold a mount point (a
checkpoint disk bound into it), and grows folders at run time that a new
render would not make: checkpoints/ and runs/, and a dataset downloaded into
its data folder, move into the new project unless the user asks for a clean
replacement.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

from wizard.errors import TargetError

KEPT = ("checkpoints", "runs")
RUN_FILE = "run.json"
PROC = Path("/proc")


def check_replaceable(target: Path) -> None:
    """Refuse (TargetError) to replace `target` while a run of it is alive or a mount point is inside it."""
    mounts = mounts_inside(target)
    if mounts:
        raise TargetError(
            f"{mounts[0]} is a mount point inside {target}; --force never replaces mounted data: "
            "unmount it or choose another -o"
        )
    alive = live_runs(target)
    if alive:
        raise TargetError(
            f"a run of {target} is alive ({'; '.join(alive)}): stop it first (Ctrl-C in its terminal, "
            f"or kill -INT the runner's pid), then render again"
        )


def mounts_inside(folder: Path) -> list[Path]:
    """Mount points at or below `folder` (bind mounts of the same disk included), from /proc/self/mountinfo."""
    try:
        lines = (PROC / "self" / "mountinfo").read_text().splitlines()
    except OSError:
        return []
    root = os.path.realpath(folder)
    found = []
    for line in lines:
        fields = line.split()
        if len(fields) < 5:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        if point == root or point.startswith(root.rstrip("/") + "/"):
            found.append(Path(point))
    return sorted(found)


def live_runs(project: Path) -> list[str]:
    """What of the project is running: runners named by runs/*/run.json, processes inside its run folders."""
    project = Path(os.path.realpath(project))
    runs = project / "runs"
    if not runs.is_dir():
        return []
    alive = []
    for run_file in sorted(runs.glob(f"*/{RUN_FILE}")):
        pid = _runner_pid(run_file)
        if pid is not None and _is_runner(pid):
            alive.append(f"{run_file.parent.relative_to(project)} by npu-wizard run, pid {pid}")
    named = {line.split(",")[0] for line in alive}
    for run_dir, pids in sorted(_job_processes_under(runs).items()):
        name = str(run_dir.relative_to(project))
        if f"{name} by npu-wizard run" not in named:
            alive.append(f"{name}: {len(pids)} process(es) of its job, pid {', '.join(map(str, pids[:5]))}")
    return alive


def carry_over(old: Path, new: Path, data_dirs: Sequence[str] = ()) -> list[str]:
    """Move the run-time folders into the new project; return their names.

    KEPT, checkpoints set aside, and the top folder of each relative data
    folder (`data_dirs`: the old and the new answers' `training.data_dir`).
    """
    moved: list[str] = []
    # `npu-wizard run --fresh` sets old checkpoints aside as checkpoints.old-<stamp>: kept as well.
    names = [*KEPT, *sorted(path.name for path in old.glob("checkpoints.old-*"))]
    for data_dir in data_dirs:
        top = Path(data_dir).parts[0] if data_dir and not Path(data_dir).is_absolute() else ""
        if top not in ("", ".", "..", *names):
            names.append(top)
    try:
        for name in names:
            source = old / name
            if (source.is_dir() or source.is_symlink()) and not (new / name).exists():
                source.rename(new / name)  # a symlink moves as a link: its target is never touched
                moved.append(name)
    except OSError:
        give_back(new, old, moved)
        raise
    return moved


def give_back(new: Path, old: Path, moved: list[str]) -> None:
    """Undo `carry_over`: move the named folders back into the old project."""
    for name in reversed(moved):
        (new / name).rename(old / name)


def _runner_pid(run_file: Path) -> int | None:
    try:
        pid = json.loads(run_file.read_text()).get("runner_pid")
    except (OSError, ValueError, AttributeError):
        return None
    return pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None


def _is_runner(pid: int) -> bool:
    """Whether `pid` is alive and still an npu-wizard process (not a reused pid)."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
        command = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X") and b"wizard" in command


def _job_processes_under(runs: Path) -> dict[Path, list[int]]:
    """Live processes whose NPU_WIZARD_RUN_DIR lies under `runs`, by run folder (the launch scripts run alone)."""
    prefix = os.path.realpath(runs).rstrip("/") + "/"
    found: dict[Path, list[int]] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        for item in environ.split(b"\0"):
            if item.startswith(b"NPU_WIZARD_RUN_DIR="):
                run_dir = os.path.realpath(item.split(b"=", 1)[1].decode(errors="replace"))
                if (run_dir + "/").startswith(prefix):
                    found.setdefault(Path(run_dir), []).append(int(entry.name))
                break
    return found
