"""`npu-wizard run PROJECT`: start the job, hand it to a view (live or plain) and raise for its outcome.

The CLI parses argv into `RunOptions` and calls `run`; whatever ends the runner ends the job.
"""

from __future__ import annotations

import signal
from pathlib import Path

from wizard.bundle.command import bundle_line
from wizard.errors import TargetError
from wizard.monitor.plain import run_plain
from wizard.render.conflict_markers import refuse_unresolved
from wizard.run.checkpoints import checkpoint_dir, set_aside
from wizard.run.engines import engine_for
from wizard.run.job import Job
from wizard.run.launch import RunOptions, load_project, manual_steps
from wizard.run.launch import dry_run as show_dry_run
from wizard.run_page.command import report_at_end, report_line


def run(folder: str, options: RunOptions, *, dry_run: bool, fresh: bool, live: bool, report: bool = False) -> None:
    """Run the project in `folder` (or print what a run would do): RunFailed or RunInterrupted unless it finished.

    With `report`, write the run's report.html once it ended, however it ended.
    """
    project = Path(folder)
    refuse_unresolved(project, f"run npu-wizard run {folder} again")
    if dry_run:
        print(show_dry_run(project, options), end="")
        return
    steps = manual_steps(project, options)
    if steps is not None:
        print(steps)
        return
    if fresh:  # before anything moves or a run folder is made
        refuse_fresh(project)
    if "--bandwidth" in options.train_args:
        refuse_one_rank_bandwidth(project)
    job = Job(project, options)
    if fresh:
        folder = checkpoint_dir(job.project)
        aside = set_aside(folder, job.answers["project_name"])
        moved = f"--fresh: moved the old checkpoints into {aside}" if aside else f"--fresh: no checkpoints in {folder}"
        job.notes.append(moved)
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
    if job.submitted:  # a job stopped before it started has nothing to draw
        print(report_at_end(job.run_dir) if report else report_line(job.run_dir), flush=True)
        if job.outcome in ("failed", "hung"):
            print(bundle_line(job.run_dir), flush=True)
    job.raise_for_outcome()


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
