"""Sharded checkpoints: one folder per step, one shard per rank (torch.distributed.checkpoint).

Every rank writes its shard into a hidden `.step-N.partial` folder; rank 0
then adds the training state (epoch, step, the project) and the completion
marker, and renames the folder to `step-N`. A step folder without its marker
(copied in part, or left by another tool) is ignored, so a crash mid-save
leaves the previous step whole. Such a folder loads on any world size. The
resume point is the newest of the complete step folders and the whole
checkpoints (step-N.pt) of runtime/checkpoint.py, so a job can move from ddp to
fsdp2 and back.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from . import checkpoint
from .checkpoint_owner import PROJECT_KEY
from .errors import SetupError
from .folders import keep_out_of_git

FOLDER = re.compile(r"step-(\d+)")
MARKER = "complete.json"  # written last, before the rename: the folder is whole
TRAINING_STATE = "training.pt"  # epoch, step, batches done and the project, from rank 0
PARTIAL = ".partial"
# a failed save on a disk with less than 1 MiB left ran out of space
FULL_BELOW = 1 << 20


def folder_name(step: int) -> str:
    """The folder of the sharded checkpoint taken after `step` steps."""
    return f"step-{step:09d}"


def complete_folders(directory: Path) -> list[Path]:
    """The step folders in `directory` that hold their completion marker, oldest step first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [
        (int(match.group(1)), path)
        for path in directory.iterdir()
        if (match := FOLDER.fullmatch(path.name)) and (path / MARKER).is_file()
    ]
    return [path for _step, path in sorted(found)]


def _marker(folder: Path) -> dict[str, Any]:
    """A step folder's marker ({} where it cannot be read)."""
    try:
        marker = json.loads((Path(folder) / MARKER).read_text())
    except (OSError, ValueError):
        return {}
    return marker if isinstance(marker, dict) else {}


def marker_project(folder: Path) -> str | None:
    """The project a step folder's marker names (None where it names none or cannot be read)."""
    owner = _marker(folder).get("project")
    return owner if isinstance(owner, str) else None


def save_sharded(
    directory: Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    training: Mapping[str, Any],
    project: str | None = None,
    keep: int = checkpoint.KEEP,
) -> Path:
    """Write this rank's shard of step `step`; rank 0 completes the folder. Every rank calls it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    directory = Path(directory)
    final = directory / folder_name(step)
    partial = directory / f".{final.name}{PARTIAL}"
    first = dist.get_rank() == 0
    with _space_said(directory, step, partial if first else None):
        _on_rank_0(first, step, lambda: _prepare(directory, partial))
        model_state, optimizer_state = get_state_dict(model, optimizer)
        dcp.save(
            {"model": model_state, "optimizer": optimizer_state},
            checkpoint_id=str(partial),
        )
        # no rank goes on (or exits) before the folder is complete
        _on_rank_0(
            first,
            step,
            lambda: _complete(directory, final, partial, step, training, project, keep),
        )
    return final


def _prepare(directory: Path, partial: Path) -> None:
    """Rank 0, before any shard: the checkpoint folder and an empty partial folder."""
    if not directory.is_dir():
        directory.mkdir(parents=True, exist_ok=True)
        keep_out_of_git(directory)
    shutil.rmtree(partial, ignore_errors=True)  # a save that died before its rename
    partial.mkdir()


def _on_rank_0(first: bool, step: int, work: Callable[[], None]) -> None:
    """Run `work` on rank 0, every rank waiting: where it fails, every rank raises (the
    others would otherwise wait for rank 0 at the next collective until its timeout)."""
    failure: list[str | None] = [None]
    error: Exception | None = None
    if first:
        try:
            work()
        except Exception as raised:  # noqa: BLE001 - re-raised here, told to the others
            error = raised
            failure[0] = f"{type(raised).__name__}: {raised}"[:500]
    dist.broadcast_object_list(failure, src=0)
    if error is not None:
        raise error
    if failure[0] is not None:
        raise SetupError(
            f"rank 0 could not write the checkpoint of step {step}: {failure[0]}"
        )


def _complete(
    directory: Path,
    final: Path,
    partial: Path,
    step: int,
    training: Mapping[str, Any],
    project: str | None,
    keep: int,
) -> None:
    """Rank 0, once every shard is written: the training state, the marker, the rename."""
    torch.save({**training, PROJECT_KEY: project}, partial / TRAINING_STATE)
    _fsync_file(partial / TRAINING_STATE)
    # dcp.save returned on rank 0 once every rank's shard was written: their sizes
    # go in the marker, so that a shard cut short later (a copy, a full disk) is found
    files = {
        path.name: path.stat().st_size
        for path in sorted(partial.iterdir())
        if path.is_file()
    }
    marker = {
        "step": step,
        "world_size": dist.get_world_size(),
        "project": project,
        "files": files,
    }
    _write_synced(partial / MARKER, json.dumps(marker) + "\n")
    older = directory / f".{final.name}.older"
    if final.exists():  # the same step saved again: the newer save wins, and the
        # older is renamed out of the way first, never half deleted under its name
        shutil.rmtree(older, ignore_errors=True)
        os.rename(final, older)
    os.rename(partial, final)
    checkpoint._fsync_folder(directory)
    shutil.rmtree(older, ignore_errors=True)
    prune_folders(directory, keep, project)


@contextmanager
def _space_said(directory: Path, step: int, partial: Path | None) -> Iterator[None]:
    """A save that fails leaves no partial folder (rank 0 removes it), and one that ran
    out of disk says so, naming the folder, on every rank that saw it."""
    try:
        yield
    except BaseException as error:  # dcp raises CheckpointException, a BaseException
        # torch.save, which dcp writes each shard with, turns ENOSPC into "unexpected pos":
        # the disk itself says whether it is full, asked before the partial folder goes
        stopped = isinstance(error, (KeyboardInterrupt, SystemExit))
        full = not stopped and (_out_of_space(error) or _disk_full(directory))
        if partial is not None:
            shutil.rmtree(partial, ignore_errors=True)
        if full:
            raise checkpoint._space_error(directory, step) from error
        raise


def _disk_full(directory: Path) -> bool:
    """Whether the disk of `directory` has less than FULL_BELOW bytes left for this user."""
    try:
        disk = os.statvfs(directory)
    except OSError:
        return False
    return disk.f_bavail * disk.f_frsize < FULL_BELOW


def _out_of_space(error: BaseException) -> bool:
    """Whether a disk filled up anywhere in the error: its causes, or the failures of
    each rank that dcp's CheckpointException gathers (each in a wrapper's .exc)."""
    found: list[object] = [error]
    seen: set[int] = set()
    while found:
        cause = found.pop()
        if cause is None or id(cause) in seen:
            continue
        seen.add(id(cause))
        if isinstance(cause, OSError) and cause.errno in checkpoint.NO_SPACE:
            return True
        found += [getattr(cause, name, None) for name in ("__cause__", "__context__")]
        failures = getattr(cause, "failures", None)
        if isinstance(failures, dict):
            found += [getattr(failure, "exc", failure) for failure in failures.values()]
    return False


def prune_folders(directory: Path, keep: int, project: str | None) -> list[Path]:
    """Delete all but the newest `keep` complete step folders of `project` (another project's stay)."""
    found = [
        path
        for path in complete_folders(directory)
        if project is None or marker_project(path) in (None, project)
    ]
    doomed = found[:-keep] if keep > 0 else found
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def resume_point(
    directory: Path, project: str | None = None
) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint every rank sees: a complete step folder or a step-N.pt file, and its state.

    A step folder's state is its training state alone: load_sharded_state reads the shards.
    """
    directory = Path(directory)
    every_rank = checkpoint._gather(
        [_step_of(path) for path in complete_folders(directory)]
    )
    common = set.intersection(*(set(steps) for steps in every_rank))
    files = [
        checkpoint._step_of(path) for path in checkpoint.list_checkpoints(directory)
    ]
    newest_file = max(checkpoint._gather(max(files, default=-1)))
    for step in sorted(common, reverse=True):
        if step < newest_file:
            break  # a whole checkpoint is newer
        folder = directory / folder_name(step)
        state = _training_state(folder, project)
        if state is not None:
            return folder, state
    resumed = checkpoint.resume_point(directory, project=project)
    if resumed is not None or not common:
        return resumed
    for step in sorted((s for s in common if s < newest_file), reverse=True):
        folder = directory / folder_name(step)
        state = _training_state(folder, project)
        if state is not None:
            return folder, state
    return None


def _training_state(folder: Path, project: str | None) -> dict[str, Any] | None:
    """A step folder's training state; None (the folder set aside, said) where it does not load."""
    owner = marker_project(folder)
    if project is not None and owner is not None and owner != project:
        raise checkpoint.ForeignCheckpointError(
            f"the checkpoint folder is shared with another project ({folder} was written by project {owner!r}): "
            "give each project its own folder (NPU_WIZARD_CHECKPOINT_DIR, or train.py's --checkpoint-dir)"
        )
    state = None
    # one rank reads the sizes for all (they see one folder): not a stat per file per rank
    problem = damage(folder) if checkpoint._is_first_rank() else None
    if problem is None:
        try:
            state = torch.load(
                folder / TRAINING_STATE, map_location="cpu", weights_only=True
            )
        except checkpoint.UNREADABLE as error:
            problem = f"{folder} ({type(error).__name__}: {error})"[:500]
    problems = [found for found in checkpoint._gather(problem) if found]
    if not problems:
        written_by = _marker(folder).get("world_size")
        if (
            isinstance(state, dict)
            and "world_size" not in state
            and isinstance(written_by, int)
        ):
            state["world_size"] = written_by  # saved before the training state kept it
        return state
    if checkpoint._is_first_rank():
        aside = checkpoint.set_aside(folder)
        checkpoint._warn(
            f"warning: checkpoint {folder} cannot be loaded ({problems[0]}); "
            f"kept aside as {aside}"
        )
    return None


def damage(folder: Path) -> str | None:
    """What is missing or cut short in a complete step folder, by the sizes its marker
    recorded; None where all is there, where the marker recorded no sizes, or where
    the disk would not say (an error other than a missing file is no proof of damage)."""
    try:
        files = json.loads((folder / MARKER).read_text()).get("files")
    except OSError:
        return None
    except (ValueError, AttributeError) as error:
        return f"{folder / MARKER} cannot be read ({type(error).__name__})"
    if not isinstance(files, dict):
        return None  # written before the sizes were recorded
    for name, size in sorted(files.items()):
        if Path(name).name != name or name in ("", ".", "..") or "\0" in name:
            return f"{folder / MARKER} names {name!r}, not a file of the folder"
        try:
            found = (folder / name).stat().st_size
        except FileNotFoundError:
            return f"{folder}: {name} is missing"
        except OSError:
            return None
        if found != size:
            return f"{folder}: {name} holds {found} bytes, {size} were written"
    return None


def _step_of(path: Path) -> int:
    match = FOLDER.fullmatch(path.name)
    assert match is not None  # complete_folders only returns step folder names
    return int(match.group(1))


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as file:
        os.fsync(file.fileno())
