"""`--profile-ranks straggler` for real: a 2 x 2 CPU job (gloo) whose rank 3 runs one operator slower.

NPU_WIZARD_TEST_SLOW_OP_RANK=3 (a test-only variable of tests/user_scripts/profiled_report.py)
makes rank 3's forward also run `test_slow_op`, a 50 ms sleep inside a record_function of that
name: slower where the monitor looks (forward_s) and where a profiler looks (an operator).
Once the monitor flags rank 3, the runner asks it and a median rank, down the status stream,
for a window of 10 steps; the job trains on (until the test stops it), and the report puts
test_slow_op first in its comparison of the two ranks.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runs import clean_up, node_env, run_dirs, start_runner, wait_for
from tests.test_profile_runs import render_own
from wizard.monitor.stragglers import FLAG_S

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("profile_straggler")]

START_S = 300  # four torch processes on a loaded two-core machine
FLAGGED_S = START_S + 20 * FLAG_S  # the detector learns the job's jitter, then wants FLAG_S of slow windows
TEST_ONLY_SLOW_OP_RANK = {"NPU_WIZARD_TEST_SLOW_OP_RANK": "3", "NPU_WIZARD_TEST_SLOW_OP_S": "0.05"}


def asked_windows(run_dir: Path) -> dict[int, dict]:
    """The ranks that wrote a window the runner asked for, with their profile event."""
    found = {}
    for path in (run_dir / "events").glob("rank-*.jsonl"):
        for line in path.read_text().splitlines():
            if '"event": "profile"' in line:
                event = json.loads(line)
                if event.get("reason") == "asked":
                    found[event["rank"]] = event
    return found


def test_the_straggler_and_a_median_rank_record_a_window_and_the_slowed_operator_leads(tmp_path: Path) -> None:
    project = render_own(tmp_path, "profiled_report.py", ["--steps", "0"])  # trains until stopped
    env = {**node_env(project / "runs" / "unused"), **TEST_ONLY_SLOW_OP_RANK}
    runner = start_runner(project, "--interval", "2", "--profile-ranks", "straggler", env=env)
    try:
        run_dir = wait_for(lambda: run_dirs(project), START_S, "the run folder")[0]
        windows = wait_for(lambda: len(asked_windows(run_dir)) == 2 and asked_windows(run_dir), FLAGGED_S, "windows")
        runner.send_signal(signal.SIGINT)
        output, _ = runner.communicate(timeout=120)
    finally:
        clean_up(project, runner)
    assert 3 in windows, windows
    (median,) = set(windows) - {3}
    assert median in (0, 1, 2)
    assert f"rank 3 and rank {median} (a median rank) record the next 10 steps" in output
    for rank in (3, median):
        assert windows[rank]["outcome"] == "recorded" and windows[rank]["last"] - windows[rank]["first"] == 10
        (trace,) = (run_dir / "profile" / f"rank-{rank}").glob("*.pt.trace.json")
        json.loads(trace.read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [(a["straggler"], a["median"], a["steps"]) for a in summary["profile"]["asked"]] == [(3, median, 10)]
    assert "profile: rank 3 (straggler) and rank" in output
    report = subprocess.run(
        [sys.executable, "-m", "wizard", "report", str(run_dir)], capture_output=True, text=True, timeout=300
    )
    assert report.returncode == 0, report.stderr
    page = (run_dir / "report.html").read_text()
    comparison = page[page.index(f"Straggler rank 3 beside median rank {median}") :]
    header = comparison.index("<th>difference</th></tr>")
    table = comparison[header : comparison.index("</table>", header)]
    rows = [re.findall(r"<td>(.*?)</td>", row) for row in table.split("<tr>")[1:]]
    # ranked by the size of the difference, either way: the slowed operator (the straggler's time, +) and the
    # median rank's wait for it in the gradients' all_reduce (-) lead the table, in either order
    leading = {row[0]: row[-1] for row in rows[:2]}
    assert leading.get("test_slow_op", "").startswith("+"), rows[:4]
    assert any("all_reduce" in row[0] and row[-1].startswith("-") for row in rows[:3]), rows[:4]
