"""Small edges of issue 36, item 39: the restart backoff, a node that is unknown, profile windows, plot labels."""

from __future__ import annotations

from wizard.monitor.state import JobState
from wizard.run.attempts import BACKOFF_MAX_S, Attempt, Attempts


def test_the_backoff_after_thousands_of_restarts_stays_at_its_most() -> None:
    attempts = Attempts(5_000, clock=lambda: 0.0)
    attempts.attempts = [Attempt(number, 0.0) for number in range(1, 1_200)]
    assert attempts.failed(None, JobState(1), 0.0) == BACKOFF_MAX_S


def test_a_straggler_rank_whose_node_is_unknown_is_named_without_node_none() -> None:
    from wizard.run_page.page import _stragglers

    html = _stragglers({"stragglers": [{"rank": 0, "node": None, "phase": "forward", "start": 1.0}]})
    assert "rank 0 (node None)" not in html
    assert "<td>rank 0</td>" in html


def test_a_summary_rank_whose_node_is_unknown_is_named_without_node_none() -> None:
    from wizard.monitor.summary_text import format_summary

    text = format_summary({"outcome": "failed", "ranks": {"0": {"node": None, "state": "failed"}}})
    assert "rank 0 (node None)" not in text
    assert "  rank 0: failed, step None, loss -, - samples/s, restarts 0" in text.splitlines()
