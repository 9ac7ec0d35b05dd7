"""Escape sequences a rank writes reach the terminal escaped: `run` and `monitor`, plain and live.

A rank's error message, its traceback and its log are anyone's text: ESC [2J clears the screen of whoever
watches the run, ESC ]0; retitles the window. They used to go out raw through the plain output, the summary,
the root cause `run` exits with and the live view; now each control character is shown as `\\x1b`.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from textual.widgets import Log, Static

from runtime.events import EventWriter
from tests.test_hostfile import npu_wizard
from tests.test_monitor_app import NOW, FakeJob, anyio_backend, app_for, own_script_state
from tests.test_user_script import render_own, run_to_the_end
from wizard.monitor.attach import RunFolder, watch_plain
from wizard.monitor.terminal import printable

CLEAR_AND_RETITLE = "\x1b[2J\x1b]0;owned\x07"
SHOWN = "\\x1b[2J\\x1b]0;owned\\x07"
__all__ = ["anyio_backend"]  # the fixture the live view's test runs on (asyncio)

HOSTILE_SCRIPT = f"""
print("about to fail {CLEAR_AND_RETITLE}", flush=True)
raise RuntimeError("bad batch {CLEAR_AND_RETITLE}")
"""


def test_printable_escapes_control_characters_and_keeps_lines_and_tabs() -> None:
    assert printable(f"a\tb\n{CLEAR_AND_RETITLE}\r\u202e") == f"a\tb\n{SHOWN}\\r\\u202e"
    assert printable("rank 3 (node 1): ünïcode ok") == "rank 3 (node 1): ünïcode ok"


def test_a_ranks_escape_sequences_reach_run_and_monitor_escaped(tmp_path: Path) -> None:
    """A real `run --plain` of a script whose message and log hold ESC [2J, then `monitor --plain` of its folder."""
    project = render_own(
        tmp_path, nodes=1, devices_per_node=1, **{"network.host_ips": ["127.0.0.1"], "training.script_args": []}
    )
    (project / "src" / "ddp_tutorial.py").write_text(HOSTILE_SCRIPT)
    code, output, run_dir, _ = run_to_the_end(project, env={})
    assert code == 3, output
    assert "\x1b" not in output and "\x07" not in output
    assert f"RuntimeError: bad batch {SHOWN}" in output  # the root cause, as the summary and the exit say it
    assert f"  | about to fail {SHOWN}" in output  # its log's last lines
    assert CLEAR_AND_RETITLE in json.loads((run_dir / "summary.json").read_text())["failure"]["summary"]  # data
    watched = npu_wizard("monitor", "--plain", str(run_dir), cwd=tmp_path)
    assert watched.returncode == 0, watched.stderr
    assert "\x1b" not in watched.stdout and f"bad batch {SHOWN}" in watched.stdout


def test_a_watched_folders_warning_and_log_reach_the_plain_view_escaped(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    writer = EventWriter(run_dir, 0)
    writer.started(local_rank=0, node=0, device="cpu", world_size=1)
    writer.warning(f"checkpoint slow {CLEAR_AND_RETITLE}", "checkpoint")
    try:
        raise ValueError(f"bad {CLEAR_AND_RETITLE}")
    except ValueError as error:
        writer.error(error)
    writer.close()
    (run_dir / "logs").mkdir()
    (run_dir / "logs" / "rank-0.log").write_text(f"last words {CLEAR_AND_RETITLE}\n")
    out = io.StringIO()
    watch_plain(RunFolder(run_dir), out=out, poll=0)
    printed = out.getvalue()
    assert "\x1b" not in printed
    assert f"checkpoint slow {SHOWN}" in printed and f"  | last words {SHOWN}" in printed


@pytest.mark.anyio
async def test_the_live_view_shows_a_ranks_escape_sequences_escaped(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rank-0.log").write_text(f"step 1 {CLEAR_AND_RETITLE}\n")
    job = FakeJob(own_script_state(), tmp_path, outcome="failed")
    job.summary = {
        "ended_at": NOW,
        "failure": {"rank": 0, "node": 0, "summary": f"ValueError: [b]bad[/b] {CLEAR_AND_RETITLE}", "hint": None},
    }
    app = app_for(job)
    async with app.run_test(size=(110, 32)):
        alert = str(app.query_one("#alert", Static).render())
        assert f"root cause: rank 0 (node 0): ValueError: [b]bad[/b] {SHOWN}" in alert
        log = app.query_one(Log)
        assert f"step 1 {SHOWN}" in log.lines and not any("\x1b" in line for line in log.lines)


@pytest.mark.anyio
async def test_an_outcome_a_summary_json_made_up_is_shown_escaped_in_the_job_line(tmp_path: Path) -> None:
    """`monitor` takes the outcome from summary.json, which is anyone's to write."""
    app = app_for(FakeJob(own_script_state(), tmp_path, outcome=f"done {CLEAR_AND_RETITLE}[b]"))
    async with app.run_test(size=(110, 32)):
        line = str(app.query_one("#job", Static).render())
        assert "\x1b" not in line and "DONE \\x1b[2J\\x1b]0;OWNED\\x07[B] (q to quit)" in line
