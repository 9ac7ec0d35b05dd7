"""The attempts of a job run with `--restarts` (summary.json's `attempts`), in words for every view."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def attempt_lines(summary: Mapping[str, Any]) -> list[str]:
    """One line per attempt of a job that was started again; none for a job that ran once."""
    attempts = [a for a in summary.get("attempts") or [] if isinstance(a, Mapping)]
    if len(attempts) < 2 and not any(a.get("refused") for a in attempts):
        return []
    restarts = summary.get("job_restarts", len(attempts) - 1)
    lines = [f"attempts: {len(attempts)} ({restarts} restart(s) of the whole job)"]
    lines += [f"  {attempt_line(attempt)}" for attempt in attempts]
    return lines


def attempt_line(attempt: Mapping[str, Any]) -> str:
    """What became of one attempt: how it ended, and for a failed one where the next resumed and what it cost."""
    head = f"attempt {attempt.get('attempt')}: "
    outcome = attempt.get("outcome")
    if attempt.get("cause") is None:
        return head + (outcome or "running")
    said = head + f"{outcome or 'failed'} at step {attempt.get('failed_at_step')}: {attempt.get('cause')}"
    resumed = attempt.get("resumed_from_step")
    if resumed is not None:
        said += f"; the next resumed from step {resumed} ({attempt.get('steps_lost')} step(s) lost)"
        recovery = attempt.get("failure_to_first_step_s")
        said += f", first step {recovery:.1f}s after the failure" if isinstance(recovery, (int, float)) else ""
    if attempt.get("refused"):
        said += f"; {attempt['refused']}"
    return said


def restart_words(summary: dict[str, Any]) -> str:
    """`no restart`, `1 restart of the whole job`, `2 restarts: 1 of the whole job, 1 of ranks by their launcher`.

    summary.json's `restarts` counts both kinds; `job_restarts` the whole job's (run --restarts).
    """
    total, job = summary.get("restarts") or 0, summary.get("job_restarts") or 0
    total = total if isinstance(total, int) else 0
    job = min(job, total) if isinstance(job, int) else 0
    workers = total - job
    if not total:
        return "no restart"
    kinds = [
        *([f"{job} of the whole job"] if job else []),
        *([f"{workers} of ranks by their launcher"] if workers else []),
    ]
    if len(kinds) == 1:
        return f"{total} restart{'s' if total > 1 else ''} {kinds[0].split(' ', 1)[1]}"
    return f"{total} restarts: {', '.join(kinds)}"
