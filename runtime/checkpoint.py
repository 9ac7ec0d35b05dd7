"""Checkpoints written atomically by each node's local rank 0, found again after a restart.

A save goes to a hidden temporary file in the same folder, is fsynced, then
renamed over its final name, so a crash mid-save leaves the previous
checkpoint whole. `latest_checkpoint` only considers finished names.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from runtime.errors import SetupError

ENV_CHECKPOINT_DIR = "NPU_WIZARD_CHECKPOINT_DIR"
NAME = re.compile(r"step-(\d+)\.pt")
KEEP = 2


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


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside a DistributedDataParallel wrapper (or the module itself)."""
    return getattr(model, "module", model)


def save_checkpoint(
    directory: Path,
    step: int,
    state: Mapping[str, Any],
    keep: int = KEEP,
) -> Path:
    """Write `state` atomically as the checkpoint of `step`; keep the newest `keep`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / checkpoint_name(step)
    handle, temporary = tempfile.mkstemp(
        prefix=f".{final.name}.",
        suffix=".tmp",
        dir=directory,
    )
    try:
        with os.fdopen(handle, "wb") as file:
            torch.save(dict(state), file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, final)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    _fsync_folder(directory)
    prune_checkpoints(directory, keep)
    return final


def list_checkpoints(directory: Path) -> list[Path]:
    """Finished checkpoints in `directory`, oldest step first (temporary files ignored)."""
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


def prune_checkpoints(directory: Path, keep: int = KEEP) -> list[Path]:
    """Delete all but the newest `keep` checkpoints; return what was deleted."""
    found = list_checkpoints(directory)
    doomed = found[:-keep] if keep > 0 else found
    for path in doomed:
        path.unlink(missing_ok=True)
    return doomed


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load a checkpoint onto the CPU (tensors, numbers and dicts only)."""
    return torch.load(path, map_location="cpu", weights_only=True)


def agreed_latest_checkpoint(directory: Path) -> Path | None:
    """The newest checkpoint every rank can load, agreed across the job.

    Each node's local rank 0 saves its own copy (DDP keeps the weights equal),
    so nodes need no shared storage; after a crash mid-save the nodes may hold
    different newest steps, and the job takes the newest one they all hold.
    """
    steps = [
        int(NAME.fullmatch(path.name).group(1)) for path in list_checkpoints(directory)
    ]
    if not (dist.is_available() and dist.is_initialized()):
        return Path(directory) / checkpoint_name(steps[-1]) if steps else None
    every_rank: list[list[int] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(every_rank, steps)
    common = set.intersection(*(set(seen or []) for seen in every_rank))
    if common:
        return Path(directory) / checkpoint_name(max(common))
    if any(every_rank):
        seen = ", ".join(
            f"rank {r}: {max(s) if s else 'none'}" for r, s in enumerate(every_rank)
        )
        raise SetupError(
            f"no checkpoint in {directory} is held by every rank (newest step per rank: {seen}): "
            "copy the newest checkpoint to every node's folder, or move the folders away to start afresh"
        )
    return None


def parameters_digest(model: nn.Module) -> str:
    """sha256 of every parameter's bytes, to compare ranks' weights bit for bit."""
    digest = hashlib.sha256()
    for name, parameter in unwrap(model).named_parameters():
        digest.update(name.encode())
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
