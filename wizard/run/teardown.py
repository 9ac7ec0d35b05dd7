"""How `npu-wizard run` stopped a job: whether it gave the ranks their save grace, and why not.

A rank saves a checkpoint on SIGTERM at its next logged step, and every save
but a lone rank's waits in a collective for its peers (the checkpoint's
barrier, the step's all_reduce). With a peer dead or hung no rank gets there,
so a stop for a dead or hung rank gives them no save grace: the runner stops
every process at once. A stop of a healthy job (Ctrl-C, SIGTERM, a
scheduler's preemption) still waits up to --save-grace for the ranks to save.
summary.json's `teardown` records which it was.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from wizard.monitor.ranks import where
from wizard.monitor.state import JobState


@dataclass
class Teardown:
    """The runner's stopping of the job: why, what it waited for, how long it took."""

    save_grace_s: float  # --save-grace: what a healthy job's ranks get
    no_save_because: str | None = None  # why the ranks were given no save grace; None when they were
    waited_for_saves_s: float = 0.0  # how long the runner waited for the ranks to save (0: it did not ask)
    stop_s: float | None = None  # from the decision to stop to every process gone
    _began: float | None = None

    def began(self) -> None:
        """The runner decided to stop the job now (the first decision counts)."""
        if self._began is None:
            self._began = time.monotonic()

    def done(self) -> None:
        """Every process of the job is gone."""
        if self._began is not None:
            self.stop_s = round(time.monotonic() - self._began, 3)

    def record(self) -> dict:
        """As summary.json's `teardown` says it."""
        return {
            "waited_for_saves": self.waited_for_saves_s > 0,
            "waited_for_saves_s": round(self.waited_for_saves_s, 3),
            "save_grace_s": self.save_grace_s,
            "no_save_because": self.no_save_because,
            "stop_s": self.stop_s,
        }


def no_save_reason(state: JobState) -> str | None:
    """Why no rank can save a checkpoint now (a rank failed, vanished or hangs); None when they can."""
    cause = state.root_cause()
    if cause is not None:
        return f"{where(cause.rank, cause.node)} {'vanished' if cause.kind == 'vanished' else 'failed'}"
    hung = state.hung()
    if hung:
        return f"rank{'s' * (len(hung) > 1)} {', '.join(map(str, hung))} hung"
    if state.stalled():
        return "the job stalled (no rank made a step)"
    return None
