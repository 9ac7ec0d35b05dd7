"""A project's checkpoint folder as the runner sees it: set aside for --fresh, and a run with nothing to train.

The runner never imports torch, so it loads no checkpoint: it reads only the
project name a checkpoint keeps (without unpickling), and what the ranks
report (the step they resumed at and the steps the asked epochs take) says
whether the checkpoint already completes the epochs (or the max steps).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from runtime.checkpoint_owner import written_by
from wizard.errors import TargetError
from wizard.monitor.state import JobState

ENV_CHECKPOINT_DIR = "NPU_WIZARD_CHECKPOINT_DIR"  # the same variable runtime/checkpoint.py reads
CHECKPOINT_FILE = re.compile(r"step-\d+\.pt(\.unreadable(\.\d+)?)?|\.step-\d+\.pt\..+\.tmp")
# a sharded checkpoint (training.parallelism fsdp2): a folder per step, its set-aside copies, a torn save's folder
CHECKPOINT_FOLDER = re.compile(r"step-\d+(\.unreadable(\.\d+)?)?|\.step-\d+\.partial")
SHARDED_MARKER = "complete.json"  # runtime/sharded_checkpoint.py's MARKER: it names the project
ASIDE_PREFIX = "set-aside-"


def checkpoint_dir(project: Path, env: Mapping[str, str] = os.environ) -> Path:
    """The folder this node's ranks save to: NPU_WIZARD_CHECKPOINT_DIR, else <project>/checkpoints."""
    chosen = env.get(ENV_CHECKPOINT_DIR)
    return Path(chosen) if chosen else project / "checkpoints"


def set_aside(folder: Path, project: str) -> Path | None:
    """Move this project's checkpoint files into `<folder>/set-aside-<stamp>/`; nothing is deleted.

    Only checkpoints move (`step-N.pt` files and sharded `step-N` folders, their
    set-aside copies, a torn save's temporary file or folder), never the folder
    or anything else in it. A
    folder that holds another project's checkpoint is refused before anything
    moves: the run would refuse it next. Returns the new subfolder (None when
    there was nothing to move).
    """
    if not folder.is_dir():
        return None
    ours = []
    for path in sorted(folder.iterdir()):
        if path.is_symlink() or not _is_checkpoint(path):
            continue
        owner = written_by(path) if path.is_file() else _folder_owner(path)
        if owner is not None and owner != project:
            raise TargetError(
                f"--fresh: {path} was written by project {owner!r}, not {project!r}: give this project its own "
                "checkpoint folder (NPU_WIZARD_CHECKPOINT_DIR); nothing was moved"
            )
        ours.append(path)
    if not ours:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for suffix in range(1000):
        aside = folder / (f"{ASIDE_PREFIX}{stamp}" + (f"-{suffix}" if suffix else ""))
        try:
            aside.mkdir()
        except FileExistsError:
            continue
        except OSError as error:
            raise TargetError(f"--fresh: cannot make {aside} to set the checkpoints aside: {error.strerror}") from None
        try:
            for path in ours:
                path.rename(aside / path.name)
        except OSError as error:
            raise TargetError(f"--fresh: cannot move {path} into {aside}: {error.strerror}") from None
        return aside
    raise TargetError(f"--fresh: cannot find a free name in {folder}")


def _is_checkpoint(path: Path) -> bool:
    if path.is_file():
        return CHECKPOINT_FILE.fullmatch(path.name) is not None
    return path.is_dir() and CHECKPOINT_FOLDER.fullmatch(path.name) is not None


def _folder_owner(path: Path) -> str | None:
    """The project a sharded checkpoint folder's marker names (None where it names none or cannot be read)."""
    try:
        owner = json.loads((path / SHARDED_MARKER).read_text()).get("project")
    except (OSError, ValueError, AttributeError):
        return None
    return owner if isinstance(owner, str) else None


def nothing_to_train(state: JobState, epochs: int, folder: Path, max_steps: int = 0) -> str | None:
    """When every rank resumed from a checkpoint that already completes the run: say so and how to go on.

    `max_steps`: the run's limit in optimizer steps (0: none). Where it set the ranks' total, more epochs would
    train nothing: the way on is more steps.
    """
    views = list(state.ranks.values())
    done = views and all(
        view.starts and view.total_steps and view.resumed_step >= view.total_steps and view.first_step_at is None
        for view in views
    )
    if not done:
        return None
    step = max(view.resumed_step for view in views)
    afresh = (
        f"to start afresh, run again with --fresh (moves the checkpoints in {folder} into a subfolder, deletes nothing)"
    )
    if max_steps and max(view.total_steps or 0 for view in views) == max_steps:
        return (
            f"nothing to train: the checkpoint at step {step} already completes the {max_steps} step(s) of max steps; "
            f"to train on, run again with -- --max-steps N (more than {step}); {afresh}"
        )
    return (
        f"nothing to train: the checkpoint at step {step} already completes the {epochs} epoch(s) asked; "
        f"to train on, run again with --epochs N (more than {epochs}); {afresh}"
    )


def epochs_asked(train_args: Sequence[str], default: int) -> int:
    """The epochs this run asked for: `--epochs N` among the training arguments, else the project's."""
    args = list(train_args)
    if "--epochs" in args[:-1]:
        return int(args[args.index("--epochs") + 1])
    return default


def max_steps_asked(train_args: Sequence[str], default: int) -> int:
    """The optimizer steps this run is limited to: its last `--max-steps N` (or `=N`), else the project's."""
    asked = default
    args = list(train_args)
    for index, arg in enumerate(args):
        value = args[index + 1] if arg == "--max-steps" and index + 1 < len(args) else None
        if arg.startswith("--max-steps="):
            value = arg.partition("=")[2]
        if value is not None and value.isdigit():
            asked = int(value)
    return asked
