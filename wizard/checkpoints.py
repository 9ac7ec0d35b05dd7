"""A project's checkpoint folder as the runner sees it: set aside for --fresh, and a run with nothing to train.

The runner never imports torch, so it reads no checkpoint: what the ranks
report (the step they resumed at and the steps the asked epochs take) says
whether the checkpoint already completes the epochs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from wizard.errors import TargetError
from wizard.monitor.state import JobState

if TYPE_CHECKING:
    from wizard.run import Job

ENV_CHECKPOINT_DIR = "NPU_WIZARD_CHECKPOINT_DIR"  # the same variable runtime/checkpoint.py reads


def checkpoint_dir(project: Path, env: Mapping[str, str] = os.environ) -> Path:
    """The folder this node's ranks save to: NPU_WIZARD_CHECKPOINT_DIR, else <project>/checkpoints."""
    chosen = env.get(ENV_CHECKPOINT_DIR)
    return Path(chosen) if chosen else project / "checkpoints"


def set_aside(folder: Path) -> Path | None:
    """Rename `folder` to `<name>.old-<stamp>` beside it (nothing is deleted); None when there is nothing to move."""
    if not folder.is_dir() or not any(folder.iterdir()):
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for suffix in range(1000):
        aside = folder.with_name(f"{folder.name}.old-{stamp}" + (f"-{suffix}" if suffix else ""))
        if not aside.exists():
            try:
                folder.rename(aside)
            except OSError as error:
                raise TargetError(f"--fresh: cannot move {folder} aside to {aside}: {error.strerror}") from None
            return aside
    raise TargetError(f"--fresh: cannot find a free name beside {folder}")


def nothing_to_train(state: JobState, epochs: int, folder: Path) -> str | None:
    """When every rank resumed from a checkpoint that already completes the epochs: say so and how to go on."""
    views = list(state.ranks.values())
    done = views and all(
        view.starts and view.total_steps and view.resumed_step >= view.total_steps and view.first_step_at is None
        for view in views
    )
    if not done:
        return None
    step = max(view.resumed_step for view in views)
    return (
        f"nothing to train: the checkpoint at step {step} already completes the {epochs} epoch(s) asked; "
        f"to train on, run again with --epochs N (more than {epochs}); "
        f"to start afresh, run again with --fresh (moves {folder} aside, deletes nothing)"
    )


def epochs_asked(train_args: Sequence[str], default: int) -> int:
    """The epochs this run asked for: `--epochs N` among the training arguments, else the project's."""
    args = list(train_args)
    if "--epochs" in args[:-1]:
        return int(args[args.index("--epochs") + 1])
    return default


def finished_note(job: Job) -> str | None:
    """The words for a finished job that trained nothing (its checkpoint already completed the epochs)."""
    if job.outcome != "finished":
        return None
    epochs = epochs_asked(job.options.train_args, job.answers["training.epochs"])
    return nothing_to_train(job.state, epochs, checkpoint_dir(job.project, {**os.environ, **job.options.env}))
