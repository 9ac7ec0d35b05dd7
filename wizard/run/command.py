"""`npu-wizard run PROJECT`: start the job, hand it to a view (live or plain) and raise for its outcome.

The CLI parses argv into `RunOptions` and calls `run`; whatever ends the runner ends the job. What is said
once the job ended (the report's line, the bundle's) comes from the later stages, so the CLI hands it in.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from runtime import rehearsal
from wizard.answers.model import Answers
from wizard.answers.script import is_foreign
from wizard.errors import TargetError, shown
from wizard.monitor.plain import run_plain
from wizard.render import journal
from wizard.render.conflict_markers import refuse_unresolved
from wizard.render.project_locks import RunLock, run_lock, update_at_work
from wizard.run.checkpoints import checkpoint_dir, set_aside
from wizard.run.engines import engine_for
from wizard.run.job import Job
from wizard.run.launch import RunOptions, load_project, manual_steps, nodes_to_start
from wizard.run.launch import dry_run as show_dry_run

Closing = Callable[[Path, str | None], Sequence[str]]  # (run folder, outcome) -> the lines to print once a job ended


def run(
    folder: str, options: RunOptions, *, dry_run: bool, fresh: bool, live: bool, closing: Closing | None = None
) -> None:
    """Run the project in `folder` (or print what a run would do): RunFailed or RunInterrupted unless it finished.

    `closing` gives the lines printed once a submitted job ended, however it ended (it may write the report).
    """
    project = Path(folder)
    refuse_unresolved(project, f"run npu-wizard run {folder} again")
    refuse_epochs_for_own_script(project, options.train_args)
    refuse_profile_ranks(project, options.profile_ranks)
    refuse_bad_rehearsal(options)
    if dry_run:
        print(show_dry_run(project, options, fresh=fresh), end="")
        return
    steps = manual_steps(project, options, fresh=fresh)
    if steps is not None:
        print(steps)
        return
    answers = load_project(project.resolve())
    with run_lock(project.resolve(), nodes_to_start(answers, options.node, options.all_nodes)) as lock:
        if lock.unlocked:
            print(f"npu-wizard: warning: {lock.unlocked}", file=sys.stderr, flush=True)
        refuse_update_at_work(project)
        _run_locked(project, options, lock, fresh=fresh, live=live, closing=closing)


def _run_locked(
    project: Path, options: RunOptions, lock: RunLock, *, fresh: bool, live: bool, closing: Closing | None
) -> None:
    """`run` while holding the run lock of each node it starts."""
    if fresh:  # before anything moves or a run folder is made
        refuse_fresh(project)
    if "--bandwidth" in options.train_args:
        refuse_one_rank_bandwidth(project)
    job = Job(project, options, fresh=fresh)
    lock.name_run(job.run_dir)
    if fresh:
        job.notes.extend(fresh_start(job.project, job.answers))
    try:
        if live:
            from wizard.monitor.app import run_live

            run_live(job)
        else:
            run_plain(job)
    except KeyboardInterrupt as stop:  # Ctrl-C (or TERM, HUP) that the view did not take itself
        job.interrupted(getattr(stop, "signum", signal.SIGINT))
    except BaseException as error:  # whatever ends the runner ends the job: no rank trains unsupervised
        job.abandon(error)
        raise
    for line in job.unwritten:
        print(f"npu-wizard: warning: {line}", file=sys.stderr, flush=True)
    if job.submitted and closing is not None:  # a job stopped before it started has nothing to draw
        for line in closing(job.run_dir, job.outcome):
            print(line, flush=True)
    job.raise_for_outcome()


def fresh_start(project: Path, answers: Answers) -> list[str]:
    """Set this project's checkpoint files aside for --fresh; return what to say about it.

    Only the `step-N.pt` files the generated train.py writes are moved: the
    checkpoints of a user's own script lie wherever it saves them, which
    npu-wizard cannot know, so it says so rather than claim a fresh start.
    """
    folder = checkpoint_dir(project)
    aside = set_aside(folder, answers["project_name"])
    script = answers["training.script"]
    if not is_foreign(script):
        return [f"--fresh: moved the old checkpoints into {aside}" if aside else f"--fresh: no checkpoints in {folder}"]
    moved = f"moved the step-N.pt files into {aside}" if aside else f"no step-N.pt files in {folder} to move"
    return [
        f"--fresh: {moved}; that is all --fresh moves: your script {shown(script)} (training.script) keeps its "
        "own checkpoints where it saves them, and resumes from them if it loads them: move those away yourself "
        "to start from step 0"
    ]


def refuse_epochs_for_own_script(project: Path, train_args: Sequence[str]) -> None:
    """Refuse --epochs for a project that runs the user's own script: only the generated train.py takes it."""
    if "--epochs" not in train_args:
        return
    script = load_project(project.resolve())["training.script"]
    if is_foreign(script):
        epochs = train_args[list(train_args).index("--epochs") + 1]
        raise TargetError(
            f"--epochs {epochs}: {project} runs your own script {shown(script)} (training.script), which npu-wizard "
            "cannot tell how many epochs to train (only the generated train.py takes --epochs); nothing was started. "
            f"Give your script its own option in training.script_args in {project / 'answers.yaml'}, "
            f"run npu-wizard update {project}, then run without --epochs"
        )


def refuse_profile_ranks(project: Path, ranks: str | None) -> None:
    """Refuse --profile-ranks naming a rank the project does not have."""
    from runtime.profile_window import parse_ranks

    chosen = parse_ranks(ranks)[0] if ranks else None
    if not chosen:
        return
    world_size = load_project(project.resolve()).world_size
    missing = sorted(rank for rank in chosen if rank >= world_size)
    if missing:
        raise TargetError(
            f"--profile-ranks {ranks}: {project} has {world_size} rank(s), 0 to {world_size - 1}, so rank "
            f"{', '.join(map(str, missing))} cannot be profiled; nothing was started"
        )


def refuse_bad_rehearsal(options: RunOptions) -> None:
    """Refuse to start ranks that would refuse NPU_WIZARD_REHEARSE (docs/rehearse.md), before any starts."""
    try:
        rehearsal.from_env({**os.environ, **options.env})
    except rehearsal.RehearsalError as error:
        raise TargetError(f"{error}; nothing was started") from None


def refuse_update_at_work(project: Path) -> None:
    """Refuse to start while an update of the project is at work, or one was interrupted half way."""
    holder = update_at_work(project)
    if holder:
        raise TargetError(
            f"an npu-wizard update of {project} is at work ({holder}), so nothing was started: "
            "wait for it to finish, then run again"
        )
    if journal.pending(project):
        record = project / journal.STAGING / journal.JOURNAL
        raise TargetError(
            f"an update of {project} was interrupted half way (its journal {record} is there), "
            f"so nothing was started: run npu-wizard update {project} to finish it, then run again"
        )


def refuse_one_rank_bandwidth(project: Path) -> None:
    """Refuse the network check of a one-rank job: its collectives cross no link and measure nothing."""
    ranks = load_project(project.resolve()).world_size
    if ranks < 2:
        raise TargetError(
            f"--bandwidth needs 2 ranks or more; {project} has 1 (1 node x 1 device): "
            "with one rank no collective crosses a link. Use --smoke alone"
        )


def refuse_fresh(project: Path) -> None:
    """Refuse --fresh where the project's engine cannot set its checkpoints aside from here (the ssh engine)."""
    answers = load_project(project.resolve())
    refusal = engine_for(answers).fresh_refusal(project.resolve(), answers)
    if refusal:
        raise TargetError(refusal)
