"""The hang verdict where a user reads it: summary.json, the plain output, the live view and report.html.

The run folder is a real 2 x 2 run stopped mid-training (tests/conftest.py's interrupted_2x2_run, copied),
with the hang/ folder of real gloo ranks (tests/test_hang_verdict.py's late_and_stopped: ranks 0, 1 wait in
all_reduce #4, rank 2 never entered it, rank 3 SIGSTOPped) and its summary.json given the "hang" key the runner
writes at a hang (Job._end: hang_summary), and a straggler flag on rank 2 before it.
"""

from __future__ import annotations

import html
import io
import json
import re
import shutil
import subprocess
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from textual.widgets import Static

from tests.browser import chromium, visit
from tests.runs import RunEnded, clean_up, node_env, render_cpu, run_dirs, start_runner
from tests.test_run_report import needs_browser
from wizard.cli import main
from wizard.monitor.app import MonitorApp
from wizard.monitor.attach import RunFolder
from wizard.monitor.hang_records import HangFolder
from wizard.monitor.hang_verdict import hang_summary, judge
from wizard.monitor.plain import run_plain
from wizard.monitor.state import JobState

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("interrupted-2x2-run")]


@pytest.fixture
def hung_folder(tmp_path: Path, interrupted_2x2_run: RunEnded, late_and_stopped: HangFolder) -> Path:
    """A copy of the interrupted run with the hang/ files and the summary a hang leaves."""
    run_dir = tmp_path / "run"
    shutil.copytree(interrupted_2x2_run.run_dir, run_dir, symlinks=True)
    shutil.copytree(late_and_stopped.folder, run_dir / "hang")
    summary = json.loads((run_dir / "summary.json").read_text())
    started = summary["started_at"]
    summary["stragglers"] = [
        {"rank": 2, "node": 1, "phase": "data", "start": started + 1.0, "end": None, "gap_pct": 40.0, "lost_pct": 9.0}
    ]
    summary["hang"] = hang_summary(run_dir)
    (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


def wizard(*args: str) -> subprocess.CompletedProcess[str]:
    """`npu-wizard ARGS` in this process (matplotlib is imported once), its output and errors caught."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(args))
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def test_summary_json_keeps_the_verdict_and_where_the_files_are(hung_folder: Path) -> None:
    hang = json.loads((hung_folder / "summary.json").read_text())["hang"]
    assert hang["text"].startswith("hang at ") and "rank 2 never entered #4" in hang["text"]
    assert hang["folder"] == str(hung_folder / "hang")
    assert hang["files"] == [f"hang/rank-{rank}.json" for rank in range(4)]
    assert hang["odd_ones_out"] == [2, 3] and hang["did_not_answer"] == [3]
    assert [group["kind"] for group in hang["groups"]] == ["waiting", "never_entered", "did_not_answer"]


def test_the_plain_output_prints_the_verdict(hung_folder: Path) -> None:
    hang = json.loads((hung_folder / "summary.json").read_text())["hang"]
    done = wizard("monitor", str(hung_folder), "--plain")
    assert f"{hang['text']}\n  (every rank's stack and collectives: {hung_folder / 'hang'})" in done.stdout


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_live_view_shows_the_verdict_in_its_alert_area(hung_folder: Path) -> None:
    folder = RunFolder(hung_folder)
    folder.tick()
    app = MonitorApp(folder, title=str(hung_folder), owns_job=False, tick_s=0)
    async with app.run_test(size=(140, 40)):
        alert = str(app.query_one("#alert", Static).render()).replace("\n", " ")
    assert "ranks 0-1 wait in all_reduce #4 (gloo, 4.0 KB float32)" in alert
    assert "rank 3 did not answer" in alert


def test_the_report_says_where_each_rank_was_with_a_timeline_and_a_table(hung_folder: Path) -> None:
    hang = json.loads((hung_folder / "summary.json").read_text())["hang"]
    done = wizard("report", str(hung_folder))
    assert done.returncode == 0, done.stderr
    page = (hung_folder / "report.html").read_text()
    assert '<h2 id="hang">Where each rank was</h2>' in page
    assert hang["text"].replace("(", "(") in page.replace("&#x27;", "'")
    assert 'id="plot-hang-timeline"' in page
    table = page.split('id="plot-hang-timeline"', 1)[1].split("</table>", 1)[0]
    assert [f"<td>rank {rank}</td>" in table for rank in range(4)] == [True] * 4
    assert "<td>never entered</td><td>last #3</td>" in table and "load_batch" in table


def test_a_torn_rank_record_is_named_and_the_report_still_written(hung_folder: Path) -> None:
    record = hung_folder / "hang" / "rank-1.json"
    record.write_text(record.read_text()[:100])
    done = wizard("report", str(hung_folder))
    assert done.returncode == 0 and done.stderr == "", done.stderr
    page = (hung_folder / "report.html").read_text()
    assert "rank 1 did not answer: its record hang/rank-1.json could not be read" in page
    assert f"{record} is no JSON object (torn, or written by something else): not read" in page


@needs_browser
def test_the_timeline_is_drawn_in_chromium(hung_folder: Path, tmp_path: Path) -> None:
    assert wizard("report", str(hung_folder)).returncode == 0
    browser = chromium()
    assert browser is not None
    seen = visit(hung_folder / "report.html", browser)
    (tmp_path / "screenshot.png").write_bytes(seen.screenshot)
    assert seen.errors == [] and all(url.startswith(("file:", "data:")) for url in seen.requests)
    (image,) = [image for image in seen.images if image["id"] == "plot-hang-timeline"]
    assert image["complete"] and image["natural"] == [image["width"], image["height"]] == [1000, 200]
    shot = np.asarray(Image.open(io.BytesIO(seen.screenshot)).convert("L"), dtype=float)
    x, y = round(image["x"]), round(image["y"])
    assert shot[y : y + 200, x : x + 1000].std() > 20  # drawn, not blank


# ---- while the job runs: the runner's verdict at its collection (Job.hang_verdict) -----------------------------


class HungJob:
    """A job source whose runner collected the stacks of the real records (stands in for wizard.run.job.Job)."""

    def __init__(self, run_dir: Path, found: HangFolder, ticks_left: int = 1) -> None:
        self.run_dir, self.nodes, self.answers, self.notes = run_dir, [0], {"nodes": 1}, []
        self.state, self.engine_lines, self.summary, self.interval = JobState(4, clock=self.clock), [], None, 1000.0
        self.started_at, self.ended_at, self.outcome, self.ticks_left = 1000.0, None, None, ticks_left
        self.hang_verdict = judge(found.records, found.time)

    def clock(self) -> float:
        return 1010.0

    def start(self) -> None:
        """Nothing to start."""

    def tick(self) -> str | None:
        self.ticks_left -= 1
        if self.ticks_left < 0:
            self.outcome, self.ended_at = "interrupted", self.clock()
        return self.outcome

    def stop(self, outcome: str = "interrupted", signum: int = 2) -> str:
        self.outcome = outcome
        return outcome

    def finished_note(self) -> None:
        return None

    def print_smoke_report(self, out: object) -> None:
        """No smoke run."""


def test_the_plain_view_prints_the_verdict_once_the_runner_collected_the_stacks(
    tmp_path: Path,
    late_and_stopped: HangFolder,
) -> None:
    job = HungJob(tmp_path, late_and_stopped)
    out = io.StringIO()
    run_plain(job, out=out, poll=0)  # type: ignore[arg-type]
    said = [line for line in out.getvalue().splitlines() if line.startswith("WHERE EACH RANK IS: ")]
    assert said == [f"WHERE EACH RANK IS: {job.hang_verdict.text}"]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_live_view_shows_the_verdict_while_the_job_runs(
    tmp_path: Path,
    late_and_stopped: HangFolder,
) -> None:
    job = HungJob(tmp_path, late_and_stopped, ticks_left=10**6)
    app = MonitorApp(job, title="hung", owns_job=False, tick_s=0)  # type: ignore[arg-type]
    async with app.run_test(size=(140, 40)):
        alert = str(app.query_one("#alert", Static).render()).replace("\n", " ")
    assert "rank 2 never entered #4: its last collective is #3" in alert


# ---- a real hung run: npu-wizard run collects the stacks (wizard/run/hang_stacks.py) and judges them ----------


def test_a_real_hung_run_names_the_late_rank_in_summary_json_the_output_and_the_report(tmp_path: Path) -> None:
    project = render_cpu(tmp_path, "torchrun", nodes=1)  # 1 x 2: the fewest processes that hang
    train = (project / "train.py").read_text().splitlines()
    backward = next(n for n, line in enumerate(train, 1) if line.strip() == "loss.backward()")
    # test-only (runtime/hang_on_purpose.py): rank 1 sleeps after the forward of its step 3, never in its backward
    env = node_env(project / "runs" / "unused", NPU_WIZARD_TEST_HANG="1:3:sleep")
    runner = start_runner(project, "--interval", "2", "--hang-after", "8", "--abort-on-hang", env=env)
    try:
        output, _ = runner.communicate(timeout=300)
    finally:
        clean_up(project, runner)
    (run_dir,) = run_dirs(project)
    assert runner.returncode == 3, output
    hang = json.loads((run_dir / "summary.json").read_text())["hang"]
    said = re.fullmatch(
        r"hang at \d\d:\d\d:\d\d UTC: rank 0 waits in all_reduce #(\d+) \(gloo, [\d.]+ [KM]?B float32\) "
        rf"called from train\.py:{backward} \(loss\.backward\(\)\); rank 1 never entered #\1: its last collective "
        r"is #(\d+) and it is at train\.py:\d+ in \w+",
        hang["text"],
    )
    assert said is not None and int(said.group(2)) == int(said.group(1)) - 1, hang["text"]
    assert hang["odd_ones_out"] == [1] and hang["files"] == ["hang/rank-0.json", "hang/rank-1.json"]
    assert f"WHERE EACH RANK IS: {hang['text']}" in output and f"\n{hang['text']}\n" in output
    assert wizard("report", str(run_dir)).returncode == 0
    assert hang["text"] in html.unescape((run_dir / "report.html").read_text())
