"""Where every rank of a running job is: the part of `Job` that collects the ranks' stacks (RUN/hang/).

At a hang (once per episode, before anything is stopped), and when `npu-wizard monitor RUN --stacks` asks
through the run folder, the runner asks every rank on the status stream, probes those that do not answer
(wizard/run/hang_stacks.py), writes RUN/hang/ and judges it (wizard.monitor.hang_verdict).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from wizard.errors import cannot_write
from wizard.monitor.hang_verdict import HangVerdict, judge
from wizard.run import hang_stacks

if TYPE_CHECKING:
    from wizard.answers.model import Answers
    from wizard.monitor.state import JobState
    from wizard.run.engines import Engine, Launch
    from wizard.run.intake import Intake


class StacksOfJob(Protocol):
    """What `JobStacks` uses of `Job` (wizard.run.job), and all it uses: Job sets each of these itself."""

    run_dir: Path
    answers: Answers
    state: JobState
    intake: Intake
    engine: Engine
    stacks: dict[int, dict] | None  # where each rank was at the last collection: JobStacks writes it
    hang_verdict: HangVerdict | None  # its judgement: JobStacks writes it
    unwritten: list[str]  # records of the run a full or read-only disk refused: JobStacks adds to it
    _hang_seen: bool  # within one hang episode the stacks are collected once: JobStacks keeps it

    def launch(self) -> Launch:
        """What the engine is asked to start (the probe of a rank that does not answer needs it)."""
        ...


class JobStacks(StacksOfJob):
    """`Job`'s collection of every rank's stack (a part of wizard.run.job.Job, using what StacksOfJob names)."""

    def collect_stacks(
        self, reason: str, on_progress: Callable[[int, int], None] | None = None, asked_id: str | None = None
    ) -> Path | None:
        """Ask every rank where it is and write RUN/hang/ (call it before stopping anything); the folder.

        `reason` is "hang" or "asked" (`asked_id`: the ask's, for the one who waits). Waits at most
        hang_stacks.ANSWER_WAIT_S for the answers; a rank that does not answer is probed (its state, SIGUSR2).
        Returns None where the run folder could not be written (said in `unwritten`).
        """
        ranks = sorted(self.state.expected or range(self.answers.world_size))
        try:
            self.stacks = hang_stacks.collect(
                self.run_dir, self.intake, ranks, reason, self._probe_remote, on_progress=on_progress, asked_id=asked_id
            )
        except OSError as error:
            self.unwritten.append(cannot_write(self.run_dir / hang_stacks.HANG_DIR, error))
            return None
        self.hang_verdict = judge(self.stacks, asked=reason == "asked")  # a snapshot asked for is no hang
        return self.run_dir / hang_stacks.HANG_DIR

    def _collect_at_hang(self) -> None:
        """Collect the stacks once when a hang starts (ranks silent, or none stepping)."""
        hang = bool(self.state.hung()) or self.state.stalled()
        if hang and not self._hang_seen:
            self.collect_stacks("hang")
        self._hang_seen = hang

    def _collect_when_asked(self) -> None:
        """Collect the stacks when `npu-wizard monitor RUN --stacks` left its ask in RUN/hang/."""
        asked_id = hang_stacks.take_ask(self.run_dir)
        if asked_id is not None:
            self.collect_stacks("asked", asked_id=asked_id)

    def _probe_remote(self, rank: int, host: str | None, pid: int) -> hang_stacks.Unanswered | None:
        probed = self.engine.probe_rank(self.launch(), rank, host, pid)
        return hang_stacks.read_probe(*probed) if probed is not None else None
