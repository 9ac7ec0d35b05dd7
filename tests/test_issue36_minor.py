"""Small edges of issue 36, item 39: the restart backoff, a node that is unknown, profile windows, plot labels."""

from __future__ import annotations

import pytest

from wizard.monitor.state import JobState
from wizard.run.attempts import HEALTH_DEADLINE_S, Attempt, Attempts


def test_the_wait_after_thousands_of_restarts_is_still_the_health_deadline() -> None:
    attempts = Attempts(5_000, clock=lambda: 0.0)
    attempts.attempts = [Attempt(number, 0.0) for number in range(1, 1_200)]
    assert attempts.failed(None, JobState(1), 0.0) == HEALTH_DEADLINE_S


def test_a_straggler_rank_whose_node_is_unknown_is_named_without_node_none() -> None:
    from wizard.run_page.page import _stragglers

    html = _stragglers({"stragglers": [{"rank": 0, "node": None, "phase": "forward", "start": 1.0}]})
    assert "rank 0 (node None)" not in html
    assert "<td>rank 0</td>" in html


def test_a_summary_rank_whose_node_is_unknown_is_named_without_node_none() -> None:
    from wizard.monitor.summary_text import format_summary

    text = format_summary({"outcome": "failed", "ranks": {"0": {"node": None, "state": "failed"}}})
    assert "rank 0 (node None)" not in text
    assert "  rank 0: failed, step None, loss -, - samples/s" in text.splitlines()


def test_a_straggler_profile_with_no_straggler_says_so_in_the_summary() -> None:
    from wizard.monitor.summary_text import profile_lines

    assert profile_lines({"profile": {"no_straggler": True}}) == [
        "profile: --profile-ranks straggler: no straggler was flagged, so no rank recorded a window"
    ]


def test_a_window_cut_short_before_its_first_step_says_no_step_was_recorded() -> None:
    from wizard.monitor.summary_text import profile_lines

    window = {"rank": 0, "first": 60, "last": 60, "path": "RUN/profile/rank-0", "outcome": "cut short"}
    (line,) = profile_lines({"profile": {"windows": [window]}})
    assert line.startswith("profile: rank 0 recorded no step (the training ended first); traces in RUN/profile")


def test_a_summary_read_back_keeps_that_no_straggler_was_flagged() -> None:
    from wizard.monitor.summary_file import _checked_profile

    assert _checked_profile({"no_straggler": True}) == {"windows": [], "asked": [], "no_straggler": True}


def test_a_hang_mark_from_the_run_folder_reaches_matplotlib_without_control_bytes_or_mathtext() -> None:
    from wizard.run_page.hang_section import _short

    said = _short({"kind": "stuck", "place": {"function": "\x1b[31mred$x$"}})
    assert said == "\\x1b[31mred\\$x\\$"


def test_a_straggler_named_in_summary_json_is_labelled_without_control_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    from matplotlib.figure import Figure

    from wizard.run_page import plots

    class Grid:
        grid = [0.0, 1.0]
        ranks: list = []

        def nodes(self) -> dict:
            return {}

    axes = Figure().add_subplot()
    monkeypatch.setattr(plots, "_seconds", lambda value, series: value)  # the straggler's times as they are
    plots._shade_straggler(axes, Grid(), {"rank": None, "node": "\x1bnode", "start": 0.0, "end": 1.0}, "compute_ms")
    (label,) = [patch.get_label() for patch in axes.patches]
    assert "\x1b" not in label and "\\x1b" in label


def test_a_rank_that_crashed_in_native_code_before_the_first_step_is_not_restarted() -> None:
    from wizard.monitor.ranks import Failure

    state = JobState(2)
    state.ingest({"event": "started", "rank": 0, "time": 1.0, "pid": 11})
    vanished = Failure(0, 0, 2.0, "vanished", "its process 11 vanished without an error")
    ended = "signal 11 (SIGSEGV: a crash in native code)"
    refusal = Attempts(3).refusal("failed", vanished, state, ended)
    assert refusal is not None
    assert refusal.startswith("not restarted: the script crashed (signal 11, SIGSEGV) before the job's first step")
    # killed from outside (kill -9, a node's preemption) is not the script's own doing: a restart may help
    assert Attempts(3).refusal("failed", vanished, state, "signal 9 (SIGKILL: kill -9 or the OOM killer)") is None


def test_a_script_reporting_no_steps_that_crashed_after_hours_is_restarted() -> None:
    from wizard.monitor.ranks import Failure

    ticks = [0.0]
    state = JobState(1, clock=lambda: 1_000.0, ticker=lambda: ticks[0])  # the wall clock says nothing here
    state.ingest({"event": "started", "rank": 0, "time": 1_000.0, "pid": 11})
    for hour in range(1, 11):
        ticks[0] = hour * 3600.0
        state.ingest({"event": "heartbeat", "rank": 0, "time": 1_000.0 + ticks[0], "pid": 11, "silent_s": 1.0})
    state.vanished(0, 1_000.0)
    (vanished,) = state.failures()
    ended = "signal 11 (SIGSEGV: a crash in native code)"
    assert Attempts(3).refusal("failed", vanished, state, ended) is None
    # replayed from files (no ticker): the events' own stamps tell the same
    replayed = JobState(1)
    replayed.ingest({"event": "started", "rank": 0, "time": 1_000.0, "pid": 11})
    replayed.ingest({"event": "lost", "rank": 0, "time": 1_000.0 + 36_000.0, "pid": 11})
    lost = Failure(0, 0, 37_000.0, "vanished", "its process 11 vanished without an error")
    assert Attempts(3).refusal("failed", lost, replayed, ended) is None


def test_a_rank_aborted_at_import_is_restarted_a_watchdog_abort_is_no_crash_of_the_script() -> None:
    from wizard.monitor.ranks import Failure

    state = JobState(2)
    state.ingest({"event": "started", "rank": 0, "time": 1.0, "pid": 11})
    vanished = Failure(0, 0, 2.0, "vanished", "its process 11 vanished without an error")
    assert Attempts(3).refusal("failed", vanished, state, "signal 6 (SIGABRT: the process aborted)") is None


def test_a_native_crash_seconds_after_the_start_is_still_refused_on_the_runner_s_ticker() -> None:
    ticks = [500.0]
    state = JobState(1, clock=lambda: 1_000.0, ticker=lambda: ticks[0])
    state.ingest({"event": "started", "rank": 0, "time": 1_000.0, "pid": 11})
    ticks[0] += 5.0
    state.vanished(0, 1_005.0)
    (vanished,) = state.failures()
    refusal = Attempts(3).refusal("failed", vanished, state, "signal 11 (SIGSEGV: a crash in native code)")
    assert refusal is not None and refusal.startswith("not restarted: the script crashed (signal 11, SIGSEGV)")
