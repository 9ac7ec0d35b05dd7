"""`--profile-ranks straggler`: when the monitor flags a straggler, that rank and a median rank record a window.

The ask goes down the status stream, the channel the stacks of a hang are
collected through (runtime/status.py's asks): {"ask": "profile", "steps": N}
to the two ranks only. Each starts its window at its next step
(runtime/profile_window.py) while the job trains on. At most `windows` asks a
run (1 unless straggler:N).
"""

from __future__ import annotations

from runtime.profile_window import ASK, DEFAULT_STEPS, parse_ranks, parse_window
from wizard.monitor.state import JobState
from wizard.monitor.stragglers import Straggler
from wizard.run.intake import Intake


class StragglerProfiles:
    """Asks each newly flagged straggler and a median rank for a profile window, up to `windows` times a run."""

    def __init__(self, steps: int, windows: int) -> None:
        self.steps = steps
        self.left = windows
        self._seen: set[tuple[int | None, int | None, float]] = set()

    def look(self, state: JobState, intake: Intake, now: float) -> list[str]:
        """Ask for the flags raised since the last look; the lines that say so."""
        lines = []
        for finding in state.stragglers.active():
            key = (finding.rank, finding.node, finding.start)
            if self.left <= 0 or key in self._seen:
                continue
            self._seen.add(key)
            pair = pair_for(state, finding)
            if pair is None:
                continue
            slow, median = pair
            if intake.ask(ASK, steps=self.steps, ranks={slow, median}) is None:
                return [*lines, "PROFILE: no status stream here to ask the straggler's rank for a window"]
            self.left -= 1
            state.profile_asks.append({"straggler": slow, "median": median, "steps": self.steps, "at": now})
            lines.append(
                f"PROFILE: {finding.who()} is a straggler: rank {slow} and rank {median} (a median rank) "
                f"record the next {self.steps} steps"
            )
        return lines


def pair_for(state: JobState, finding: Straggler) -> tuple[int, int] | None:
    """The straggler's rank (a slow node's slowest) and the rank whose compute time is the median of the others."""
    if finding.rank is not None:
        slow = finding.rank
        others = [rank for rank in state.ranks if rank != slow]
    else:
        on_node = [rank for rank in state.ranks if state.node_of(rank) == finding.node]
        if not on_node:
            return None
        slow = max(on_node, key=lambda rank: _compute(state, rank))
        others = [rank for rank in state.ranks if rank not in on_node]
    if not others:
        return None
    ranked = sorted(others, key=lambda rank: (_compute(state, rank), rank))
    return slow, ranked[len(ranked) // 2]


def _compute(state: JobState, rank: int) -> float:
    value = state.ranks[rank].compute_s
    return value if value is not None else 0.0


def straggler_profiles(window: str | None, ranks: str | None) -> StragglerProfiles | None:
    """The asker for --profile-ranks straggler[:N] (windows as long as --profile A:B, else 10 steps); else None."""
    if not ranks:
        return None
    _, straggler, windows = parse_ranks(ranks)
    if not straggler:
        return None
    first, last = parse_window(window) if window else (0, DEFAULT_STEPS)
    return StragglerProfiles(last - first, windows)
