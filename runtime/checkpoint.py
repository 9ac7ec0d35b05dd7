"""Checkpoints written atomically by each node's local rank 0, found again after a restart.

A save goes to a hidden temporary file in the same folder, is fsynced, then
renamed over its final name, so a crash mid-save leaves the previous
checkpoint whole. `latest_checkpoint` only considers finished names. On a
restart the ranks agree on the newest checkpoint that every one of them can
load; one that is damaged (it reads to its end but does not unpickle or
unzip) is set aside, renamed and never deleted, and the job resumes from the
one before. A checkpoint that cannot be read (permissions, an I/O error, a
stale NFS handle, no memory) is a failure to report: nothing is set aside.
Each checkpoint names the project that wrote it, so two projects sharing a
folder never resume from each other's.
"""

from __future__ import annotations

import errno
import hashlib
import os
import pickle
import re
import tarfile
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from . import events
from .checkpoint_owner import PROJECT_KEY, written_by
from .errors import SetupError
from .folders import keep_out_of_git

ENV_CHECKPOINT_DIR = "NPU_WIZARD_CHECKPOINT_DIR"
NAME = re.compile(r"step-(\d+)\.pt")
KEEP = 2
SET_ASIDE = ".unreadable"  # step-000000009.pt -> step-000000009.pt.unreadable: no longer a checkpoint name
READ_CHUNK = 8 * 1024 * 1024
# what torch.load raises on a truncated, zeroed or foreign file that read whole
# (torch 2.1 reads a non-zip file as a legacy tar archive: KeyError or TarError);
# an OSError or an allocation failure is not the file's fault
UNREADABLE = (
    EOFError,
    RuntimeError,
    ValueError,
    pickle.UnpicklingError,
    KeyError,
    tarfile.TarError,
)
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
T = TypeVar("T")


class CheckpointSpaceError(SetupError):
    """The checkpoint folder's disk is full: the message names the folder."""


class CheckpointReadError(SetupError):
    """A checkpoint could not be read on some rank (not damaged): nothing was set aside."""


class ForeignCheckpointError(SetupError):
    """The checkpoint folder holds another project's checkpoint."""


class _RecordingWriter:
    """The file torch.save writes to; keeps the OSError torch turns into 'unexpected pos'."""

    def __init__(self, file: BinaryIO) -> None:
        self.file = file
        self.error: OSError | None = None

    def write(self, data: bytes) -> int:
        """Write through, remembering an OSError before re-raising it."""
        try:
            return self.file.write(data)
        except OSError as error:
            self.error = error
            raise

    def flush(self) -> None:
        """Flush through, remembering an OSError before re-raising it."""
        try:
            self.file.flush()
        except OSError as error:
            self.error = error
            raise


def resolve_checkpoint_dir(
    flag: str | None,
    project_dir: Path,
    env: Mapping[str, str] = os.environ,
) -> Path:
    """The checkpoint folder, from the first of: flag, environment, default.

    --checkpoint-dir, then NPU_WIZARD_CHECKPOINT_DIR, then <project>/checkpoints.
    """
    chosen = flag or env.get(ENV_CHECKPOINT_DIR)
    return Path(chosen) if chosen else project_dir / "checkpoints"


def checkpoint_name(step: int) -> str:
    """The file name of the checkpoint taken after `step` steps."""
    return f"step-{step:09d}.pt"


COMPILED_PREFIX = (
    "_orig_mod."  # torch.compile's module wrapper puts it before every key
)


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside DistributedDataParallel and torch.compile wrappers (or the module itself)."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner


def plain_keys(weights: Mapping[str, Any]) -> Mapping[str, Any]:
    """A state dict without torch.compile's wrapper prefix, so it loads compiled or not."""
    if not any(COMPILED_PREFIX in key for key in weights):
        return weights  # as saved, with its _metadata
    return {
        key.replace(COMPILED_PREFIX, "") if COMPILED_PREFIX in key else key: value
        for key, value in weights.items()
    }


def save_checkpoint(
    directory: Path,
    step: int,
    state: Mapping[str, Any],
    keep: int = KEEP,
    project: str | None = None,
) -> Path:
    """Write `state` atomically as the checkpoint of `step`; keep the newest `keep`.

    `project` is kept in the checkpoint: `resume_point` refuses another project's.
    """
    directory = Path(directory)
    # a folder made here is ours: git leaves it out; one the user made stays as it is
    if not directory.is_dir():
        try:
            directory.mkdir(parents=True, exist_ok=True)
            keep_out_of_git(directory)
        except OSError as error:
            if _no_space(error, None):
                raise _space_error(directory, step) from error
            raise
    final = directory / checkpoint_name(step)
    handle, temporary = tempfile.mkstemp(
        prefix=f".{final.name}.",
        suffix=".tmp",
        dir=directory,
    )
    writer: _RecordingWriter | None = None
    try:
        with os.fdopen(handle, "wb") as file:
            writer = _RecordingWriter(file)
            body = dict(state)
            if project is not None:
                body[PROJECT_KEY] = project
            torch.save(body, writer)
            writer.flush()
            os.fsync(file.fileno())
        os.replace(temporary, final)
    except BaseException as error:
        Path(temporary).unlink(missing_ok=True)
        if _no_space(error, writer):
            raise _space_error(directory, step) from error
        raise
    _fsync_folder(directory)
    prune_checkpoints(directory, keep, project)
    return final


def list_checkpoints(directory: Path) -> list[Path]:
    """Finished checkpoints in `directory`, oldest step first (temporary and set-aside files ignored)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [
        (int(match.group(1)), path)
        for path in directory.iterdir()
        if (match := NAME.fullmatch(path.name)) and path.is_file()
    ]
    return [path for _step, path in sorted(found)]


def latest_checkpoint(directory: Path) -> Path | None:
    """The checkpoint with the highest step in `directory`, or None."""
    found = list_checkpoints(directory)
    return found[-1] if found else None


def prune_checkpoints(
    directory: Path, keep: int = KEEP, project: str | None = None
) -> list[Path]:
    """Delete all but the newest `keep` checkpoints of `project`; return what was deleted.

    Another project's checkpoints in a shared folder are never deleted (nor
    counted); one that names no project is taken as this project's, as
    `resume_point` takes it.
    """
    found = list_checkpoints(directory)
    if project is not None:
        found = [path for path in found if written_by(path) in (None, project)]
    doomed = found[:-keep] if keep > 0 else found
    for path in doomed:
        path.unlink(missing_ok=True)
    return doomed


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load a checkpoint onto the CPU (tensors, numbers and dicts only).

    Model weights saved from a compiled module lose its `_orig_mod.` prefix.
    """
    state = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and isinstance(state.get("model"), Mapping):
        state["model"] = plain_keys(state["model"])
    return state


def resume_point(
    directory: Path, project: str | None = None
) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint every rank can load, and its state, decided by all ranks together.

    Each node's local rank 0 saves its own copy (DDP keeps the weights equal),
    so nodes need no shared storage; after a crash mid-save the nodes may hold
    different newest steps, and the job takes the newest one they all hold. A
    damaged copy is renamed aside (with a warning naming it) and every rank
    falls back to the next older step; None means start afresh. A copy some
    rank cannot read, or one another project wrote, stops every rank with a
    SetupError and sets nothing aside.
    """
    directory = Path(directory)
    every_rank = _gather([_step_of(path) for path in list_checkpoints(directory)])
    common = set.intersection(*(set(steps) for steps in every_rank))
    if not common and any(every_rank):
        seen = ", ".join(
            f"rank {r}: {max(s) if s else 'none'}" for r, s in enumerate(every_rank)
        )
        raise SetupError(
            f"no checkpoint in {directory} is held by every rank (newest step per rank: {seen}): "
            "copy the newest checkpoint to every node's folder, or move the folders away to start afresh"
        )
    for step in sorted(common, reverse=True):
        path = directory / checkpoint_name(step)
        state, problem = _try_load(path, project)
        problems = _gather(problem)
        _raise_for(step, problems)
        if not any(problems):
            return path, state  # type: ignore[return-value]
        aside = set_aside(path) if problem is not None else None
        if aside is not None:
            _warn(f"warning: checkpoint {path} cannot be loaded; kept aside as {aside}")
        if _is_first_rank():
            unreadable = "; ".join(sorted({p[1] for p in problems if p is not None}))
            _warn(
                f"warning: the checkpoint of step {step} cannot be loaded on every rank: {unreadable}"
            )
    if common and _is_first_rank():
        _warn(
            f"warning: no checkpoint in {directory} can be loaded by every rank: starting afresh"
        )
    return None


def _try_load(
    path: Path, project: str | None
) -> tuple[dict[str, Any] | None, tuple[str, str] | None]:
    """(state, None), or (None, (kind, words)): kind is damaged, unread or foreign."""
    try:
        _read_through(
            path
        )  # a file that does not read to its end is not judged by its bytes
        state = load_checkpoint(path)
    except (OSError, MemoryError) as error:
        return None, ("unread", f"{path} ({_describe(error)})")
    except UNREADABLE as error:
        # torch 2.1's weights-only load wraps an allocation failure in UnpicklingError
        if _out_of_memory(error):
            return None, ("unread", f"{path} ({_describe(error)})")
        return None, ("damaged", f"{path} ({_describe(error)})")
    owner = state.get(PROJECT_KEY) if isinstance(state, dict) else None
    if project is not None and owner is not None and owner != project:
        return None, ("foreign", f"{path} was written by project {owner!r}")
    return state, None


def _raise_for(step: int, problems: list[tuple[str, str] | None]) -> None:
    """Stop every rank alike when a rank could not read the checkpoint or it is another project's."""
    for kind, error in (
        ("unread", CheckpointReadError),
        ("foreign", ForeignCheckpointError),
    ):
        found = [
            f"rank {rank}: {p[1]}"
            for rank, p in enumerate(problems)
            if p is not None and p[0] == kind
        ]
        if not found:
            continue
        if kind == "unread":
            raise error(
                f"the checkpoint of step {step} could not be read ({'; '.join(found)}); "
                "nothing was set aside: fix the cause (permissions, the disk or file system, memory) "
                "and run again, or move the file away to resume from an older step"
            )
        raise error(
            f"the checkpoint folder is shared with another project ({'; '.join(found)}): "
            "give each project its own folder (NPU_WIZARD_CHECKPOINT_DIR, or train.py's --checkpoint-dir)"
        )


def _read_through(path: Path) -> None:
    """Read the whole file (and drop it), so that a read error is told apart from damage."""
    with open(path, "rb") as file:
        while file.read(READ_CHUNK):
            pass


def _out_of_memory(error: Exception) -> bool:
    words = str(error).lower()
    return (
        "can't allocate memory" in words
        or "out of memory" in words
        or "not enough memory" in words
    )


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:500]


def set_aside(path: Path) -> Path | None:
    """Rename an unreadable checkpoint out of the way (never delete it); None if another rank did."""
    for attempt in range(1000):
        aside = path.with_name(
            path.name + SET_ASIDE + (f".{attempt}" if attempt else "")
        )
        if aside.exists():
            continue
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            return None  # another rank of this node set it aside first
        return aside
    return None


def _gather(value: T) -> list[T]:
    """`value` from every rank, in rank order (this rank's alone without a process group)."""
    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    every_rank: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every_rank, value)
    return every_rank


def _is_first_rank() -> bool:
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def _step_of(path: Path) -> int:
    match = NAME.fullmatch(path.name)
    assert match is not None  # list_checkpoints only returns checkpoint names
    return int(match.group(1))


def _warn(message: str) -> None:
    events.warn(message, "checkpoint")


def _space_error(directory: Path, step: int) -> CheckpointSpaceError:
    """The one clear error of a save that ran out of disk in `directory`."""
    return CheckpointSpaceError(
        f"no space left on {directory}: the checkpoint of step {step} was not written "
        "(free space on that disk, or point --checkpoint-dir or NPU_WIZARD_CHECKPOINT_DIR at another)"
    )


def _no_space(error: BaseException, writer: _RecordingWriter | None) -> bool:
    """Whether a failed save ran out of disk (torch reports it as 'unexpected pos')."""
    causes = [error, writer.error if writer is not None else None]
    return any(
        isinstance(cause, OSError) and cause.errno in NO_SPACE for cause in causes
    )


def parameters_digest(model: nn.Module) -> str:
    """sha256 of every parameter's bytes, to compare ranks' weights bit for bit (a collective under fsdp2)."""
    digest = hashlib.sha256()
    for name, parameter in unwrap(model).named_parameters():
        digest.update(name.encode())
        # a shard of fully_shard: every rank gathers it whole
        if hasattr(parameter, "full_tensor"):
            parameter = parameter.full_tensor()
        data = parameter.detach().reshape(-1).cpu().contiguous()
        digest.update(data.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _fsync_folder(directory: Path) -> None:
    # the rename itself must reach the disk, or a power loss could undo it
    folder = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
