"""The plain view's words for a running job: the job's line, then each rank's (grouped by state for many ranks).

What CI logs and `nohup` users read (`npu-wizard run` and `monitor` off a terminal, or with --plain): every
interval the job's line (summary_text.progress_line), then a line per rank, or beyond COMPACT_AFTER ranks a line
per state naming its ranks; a rank its launcher started again (torchrun --max-restarts) is said once, when seen.
"""

from __future__ import annotations

from wizard.monitor.hang_verdict import ranks_text
from wizard.monitor.ranks import RankView, where
from wizard.monitor.state import FAILED, FINISHED, HUNG, RUNNING, STALLED, JobState
from wizard.monitor.summary_text import progress_line

COMPACT_AFTER = 16  # more ranks than this are shown a line per state, not a line per rank


def progress_block(state: JobState, elapsed: float, now: float) -> str:
    """The job's line, then a line per rank (or per state, for many ranks)."""
    return "\n".join([progress_line(state, elapsed, now), *rank_lines(state, now)])


def rank_lines(state: JobState, now: float) -> list[str]:
    """`  rank 1 (node 0): stalled, step 40, last step 42s ago`, or `  ranks 0-7: running, steps 38-40` for many."""
    if len(state.ranks) <= COMPACT_AFTER:
        return [
            f"  {where(rank, view.node)}: {rank_words(view, state.state(rank, now), now)}"
            for rank, view in sorted(state.ranks.items())
        ]
    by_state: dict[str, list[RankView]] = {}
    for rank, view in sorted(state.ranks.items()):
        by_state.setdefault(state.state(rank, now), []).append(view)
    return [
        f"  {ranks_text(v.rank for v in views)}: {group_words(views, name, now)}" for name, views in by_state.items()
    ]


def rank_words(view: RankView, name: str, now: float) -> str:
    """One rank's state, step, loss and rate; for a stalled or hung one, how long ago it last stepped."""
    said = [name + (f" (exit {view.exit_code})" if view.exit_code is not None and name in (FAILED, FINISHED) else "")]
    if view.steps_reported:
        said.append(f"step {view.step}")
        if view.loss is not None:
            said.append(f"loss {view.loss:.4f}")
        if name == RUNNING and view.samples_per_s:
            said.append(f"{view.samples_per_s:,.0f} samples/s")
    elif view.printed_at is not None and view.outcome is None:
        said.append(f"printed {max(0.0, now - view.printed_at):.0f}s ago")  # a script that reports no steps
    said += _stuck(view, name, now)
    if view.restarts:
        said.append(f"started again {view.restarts}x by its launcher")
    return ", ".join(said)


def group_words(views: list[RankView], name: str, now: float) -> str:
    """The ranks of one state together: their steps, and for stalled or hung ones the longest since a step."""
    said = [name]
    steps = sorted({view.step for view in views if view.steps_reported})
    if steps:
        said.append(f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}")
    longest = max(views, key=lambda view: now - (view.progress_at or now))
    said += _stuck(longest, name, now)
    restarted = [view for view in views if view.restarts]
    if restarted:
        said.append(f"{ranks_text(v.rank for v in restarted)} started again by the launcher")
    return ", ".join(said)


def _stuck(view: RankView, name: str, now: float) -> list[str]:
    """`last step 42s ago` (or `printed`) for a stalled rank, and how long a hung one has been silent."""
    said = []
    if name in (STALLED, HUNG) and view.progress_at is not None:
        what = "last step" if view.steps_reported else "last printed"
        said.append(f"{what} {max(0.0, now - view.progress_at):.0f}s ago")
    if name == HUNG and view.last_seen is not None:
        said.append(f"no heartbeat for {max(0.0, now - view.last_seen):.0f}s")
    return said


def restart_lines(state: JobState, seen: dict[int, int]) -> list[str]:
    """A line for the ranks the launcher started again since the last call (`seen`: each rank's restarts said)."""
    again: dict[int, list[int]] = {}
    for rank, view in sorted(state.ranks.items()):
        if view.restarts > seen.get(rank, 0):
            again.setdefault(view.restarts, []).append(rank)
            seen[rank] = view.restarts
    return [
        f"RESTARTED: {ranks_text(ranks)} started again by {'their' if len(ranks) > 1 else 'its'} launcher "
        f"(worker restart {count}, the launcher's --max-restarts)"
        for count, ranks in sorted(again.items())
    ]
