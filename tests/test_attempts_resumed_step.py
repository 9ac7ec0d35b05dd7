"""Where a restarted user's script resumed: its first reported step after the restart, not the newest one.

A user's own script says nothing of its checkpoint; the runner learns the step it
resumed from by the first step it reports. Under load several steps come in
between two ticks of the runner, so the newest step would say one too many.
"""

from __future__ import annotations

from wizard.monitor.state import JobState
from wizard.run.attempts import Attempts


def second_attempt(steps: list[int]) -> tuple[Attempts, JobState]:
    """Two ranks started again (no resumed_step said), each reporting `steps` before the runner looks."""
    now = [100.0]
    attempts = Attempts(1, clock=lambda: now[0])
    attempts.failed(None, JobState(2), now[0])
    attempts.started_again(now[0] + 1)
    state = JobState(2, clock=lambda: now[0])
    for rank in (0, 1):
        state.ingest({"event": "started", "rank": rank, "time": 102.0})
        for n, step in enumerate(steps):
            state.ingest({"event": "step", "rank": rank, "time": 103.0 + n, "step": step})
    return attempts, state


def test_the_first_step_after_the_restart_names_the_step_resumed_from() -> None:
    attempts, state = second_attempt([9, 10, 11])
    attempts.note_progress(state)
    assert attempts.attempts[0].resumed_from_step == 8
    assert attempts.attempts[0].recovered_at == 103.0


def test_no_step_yet_leaves_it_unknown() -> None:
    attempts, state = second_attempt([])
    attempts.note_progress(state)
    assert attempts.attempts[0].resumed_from_step is None
