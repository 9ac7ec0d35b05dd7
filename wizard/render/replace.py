"""Replacing an existing project with --force without destroying anything alive, mounted or the user's.

A project may be training (its run folder names the runner's pid, and every
process of a job carries NPU_WIZARD_RUN_DIR), may hold a mount point (a
checkpoint disk bound into it), and holds what a new render would not make:
the user's own code beside npu-wizard's files (every path the earlier render
did not write, as its pristine copy says), and folders grown at run time
(checkpoints/ and runs/, a dataset downloaded into its data folder). All of it
moves into the new project; a clean replacement drops the run-time folders only.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Collection, Sequence
from pathlib import Path

from wizard.answers.script import GENERATED_FILE, OWN_TRAIN_PY
from wizard.errors import TargetError, shown
from wizard.render.journal import pause_for_test
from wizard.render.pristine import STATE_DIR

KEPT = ("checkpoints", "runs")
RUN_FILE = "run.json"
PROC = Path("/proc")
_NAMED = 4  # paths a refusal names before '...'


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
        if pid is not None and is_wizard_process(pid):
            alive.append(f"{run_file.parent.relative_to(project)} by npu-wizard run, pid {pid}")
    named = {line.split(",")[0] for line in alive}
    for run_dir, pids in sorted(_job_processes_under(runs).items()):
        name = str(run_dir.relative_to(project))
        if f"{name} by npu-wizard run" not in named:
            alive.append(f"{name}: {len(pids)} process(es) of its job, pid {', '.join(map(str, pids[:5]))}")
    return alive


def orphaned_jobs(project: Path) -> list[str]:
    """The run folders of `project` whose runner is gone (killed -9, or its host's session closed) while
    processes of its job still run, each with their pids."""
    runs = Path(os.path.realpath(project)) / "runs"
    if not runs.is_dir():
        return []
    left = []
    for run_dir, pids in sorted(_job_processes_under(runs).items()):
        run_file = run_dir / RUN_FILE
        if not run_file.is_file():
            continue  # not a run folder a runner made
        pid = _runner_pid(run_file)
        if pid is None or not is_wizard_process(pid):
            left.append(f"{run_dir.relative_to(runs.parent)}: pid {' '.join(map(str, pids[:8]))}")
    return left


def run_time_paths(target: Path, generated: Collection[str], data_dirs: Sequence[tuple[str, str]]) -> list[str]:
    """What the project `target` grows at run time (what --clean drops): relative paths, none inside another.

    KEPT, checkpoints set aside (checkpoints.old-*), and each data folder
    inside the project (`data_dirs`: (training.data_dir, whose answers)),
    however it is written: relative, absolute, `./data`, under a folder the
    render makes (`launch/data`). TargetError for a data folder that is the
    project itself, holds it, or is something the render makes: its data and
    the new render would be mixed or replaced.
    """
    paths = [*KEPT, *sorted(path.name for path in target.glob("checkpoints.old-*"))]
    for data_dir, whose in data_dirs:
        inside = data_folder_inside(target, data_dir)
        if inside is None:
            continue
        if inside == "." or inside == "..":
            held = "is the project folder itself" if inside == "." else f"holds the project folder {target}"
            raise TargetError(
                f"training.data_dir {data_dir!r} ({whose}) {held}: --force would mix your data with the new "
                "render and --clean would delete it; move the data into a folder of its own, set "
                "training.data_dir to that folder, then render again"
            )
        if inside in generated:
            raise TargetError(
                f"training.data_dir {data_dir!r} ({whose}) is {inside} in {target}, which the render makes: "
                "--force would replace what you keep there; move the data into a folder of its own, set "
                "training.data_dir to that folder, then render again"
            )
        paths.append(inside)
    unique = list(dict.fromkeys(paths))
    return [path for path in unique if not any(is_under(path, other) for other in unique if other != path)]


def with_folders(files: Collection[str]) -> set[str]:
    """Every file of `files` and every folder that holds one, as relative paths."""
    made = set(files)
    for name in files:
        made.update(parent.as_posix() for parent in Path(name).parents if parent != Path("."))
    return made


def users_paths(target: Path, written: Collection[str], made: Collection[str], dropped: Sequence[str]) -> list[str]:
    """What of the project `target` is not npu-wizard's: relative paths, none inside another, sorted.

    `written`: the files the earlier render wrote (npu-wizard's, replaced with
    any edits); `made`: every file and folder the new render makes; `dropped`:
    what --clean deletes. A folder is looked into where a render makes it or
    something in it is dropped, and otherwise kept whole; npu-wizard's state
    (.npu-wizard/) is the new render's.
    """
    looked_into = with_folders(written) | set(made)
    found: list[str] = []

    def visit(folder: str) -> None:
        for entry in sorted(os.scandir(target / folder), key=lambda entry: entry.name):
            path = f"{folder}/{entry.name}" if folder else entry.name
            if path == STATE_DIR or any(is_under(path, gone) for gone in dropped):
                continue
            if entry.is_dir(follow_symlinks=False) and (
                path in looked_into or any(is_under(gone, path) for gone in dropped)
            ):
                visit(path)
            elif path not in written:
                found.append(path)

    visit("")
    return found


def refuse_overwrites(target: Path, kept: Sequence[str], files: Collection[str], made: Collection[str]) -> None:
    """TargetError naming each path of the user's (`kept`) that the new render (`files`, `made`) would write over."""
    clashes = [
        path
        for path in kept
        if path in made or any(parent.as_posix() in files for parent in Path(path).parents if parent != Path("."))
    ]
    if not clashes:
        return
    hint = f"; {OWN_TRAIN_PY}" if GENERATED_FILE in clashes else ""
    raise TargetError(
        f"{target} holds {len(clashes)} path(s) of yours that the new render writes: {named(clashes)}; "
        f"--force never overwrites a file npu-wizard did not generate: move or rename them, then render "
        f"again{hint}; nothing was changed"
    )


def named(paths: Sequence[str]) -> str:
    """The first few of `paths`, comma-separated, '...' for the rest."""
    return ", ".join(shown(path) for path in paths[:_NAMED]) + (", ..." if len(paths) > _NAMED else "")


def data_folder_inside(target: Path, data_dir: str) -> str | None:
    """`data_dir` (relative to `target`, or absolute) as a path relative to `target` if it lies inside it.

    '.' for the project folder itself, '..' for a folder that holds it, None for one elsewhere.
    """
    base = os.path.normpath(target.absolute())
    for root, path in (
        (base, os.path.normpath(os.path.join(base, data_dir))),  # as written: links inside the project kept
        (os.path.realpath(base), os.path.realpath(os.path.join(base, data_dir))),  # as it is on disk
    ):
        if is_under(root, path):
            return ".." if root != path else "."
        if is_under(path, root):
            return os.path.relpath(path, root)
    return None


def is_under(path: str, folder: str) -> bool:
    """Whether `path` is `folder` or lies below it (both normalised, both relative or both absolute)."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def carry_over(old: Path, new: Path, paths: Sequence[str]) -> list[str]:
    """Move `paths` from the project `old` into `new`; return what moved (for `give_back`).

    Each moves as it is, into its folder in the new project, made where the
    new render lacks it (its other entries are npu-wizard's, or dropped); a
    symlink moves as a link, its target never touched. On an OSError what
    moved goes back first.
    """
    moved: list[str] = []
    try:
        for path in paths:
            source, dest = old / path, new / path
            if not os.path.lexists(source):
                continue
            parent = Path(path).parent
            for depth in range(1, len(parent.parts) + 1):
                folder = new / Path(*parent.parts[:depth])
                if not os.path.lexists(folder):
                    folder.mkdir()  # in the new project: deleted with it if the replacement is undone
            if os.path.lexists(dest) or not dest.parent.is_dir() or dest.parent.is_symlink():
                # refuse_overwrites names these first; never lose the user's path with the old project
                raise FileExistsError(f"{path} of the old project is in the way of the new render's files")
            source.rename(dest)
            moved.append(path)
            if len(moved) == 1:
                pause_for_test("after-first-carry")
    except OSError:
        give_back(new, old, moved)
        raise
    return moved


def give_back(new: Path, old: Path, moved: Sequence[str]) -> None:
    """Undo `carry_over`: move what it moved back into the old project."""
    for path in reversed(moved):
        (new / path).rename(old / path)


def _runner_pid(run_file: Path) -> int | None:
    try:
        pid = json.loads(run_file.read_text()).get("runner_pid")
    except (OSError, ValueError, AttributeError):
        return None
    return pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None


def is_wizard_process(pid: int) -> bool:
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
