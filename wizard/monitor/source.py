"""What the views need from a job, as protocols: wizard.run's `Job` and wizard.monitor.attach's `RunFolder` fit them.

The monitor defines them and the run side implements them, so the views import nothing from wizard.run.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TextIO

from wizard.answers.model import Answers
from wizard.monitor.state import JobState


class JobSource(Protocol):
    """What the view needs from a job: its state, a tick, a stop."""

    state: JobState
    run_dir: Path
    started_at: float
    outcome: str | None
    summary: dict | None
    clock: Callable[[], float]

    def tick(self) -> str | None:
        """Read what happened; the outcome once the job ended."""

    def stop(self, outcome: str = "interrupted", signum: int = signal.SIGINT) -> str:
        """Stop the job (`signum`: what asked, for the exit code)."""


class RunningJob(JobSource, Protocol):
    """A job the view starts and drives to its end (`npu-wizard run`): wizard.run.job.Job."""

    answers: Answers
    nodes: list[int]
    notes: list[str]  # said before the start
    engine_lines: list[str]  # what the engine said since the view last emptied the list
    say: Callable[[str], None]  # a line for the user at once, while stopping (the plain view prints it)
    ended_at: float | None

    @property
    def interval(self) -> float:
        """Seconds between two progress lines of the plain view."""

    def start(self) -> None:
        """Have the engine start every node."""

    def finished_note(self) -> str | None:
        """The words for a finished job that trained nothing; None otherwise."""

    def print_smoke_report(self, out: TextIO) -> None:
        """The per-rank report of a smoke run; nothing for a training run."""
