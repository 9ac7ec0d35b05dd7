"""Stopping a job with a dead or hung rank waits for no checkpoint (issue 36 items 39 and 40).

Every save waits in a collective for its peers: with one dead or hung, no rank
can save, so the runner gives no save grace. Real 1 x 2 CPU jobs (shell
launcher, gloo); the runner's own record (summary.json's teardown) says what it
waited for, so no assertion rests on this machine's speed.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.runs import clean_up, leftover_processes, render_cpu, run_dirs, start_runner, started_pid, wait_for

pytestmark = pytest.mark.slow

START_S = 180  # a loaded two-core machine takes a while to start torch processes
LONG_RUN = {"samples": 65536, "epochs": 2}  # still training when the test acts
SAVE_GRACE = "60"


def test_a_rank_killed_with_kill_9_stops_the_job_without_waiting_for_saves(tmp_path: Path) -> None:
    project = render_cpu(tmp_path, "shell", **LONG_RUN)
    runner = start_runner(project, "--interval", "1", "--save-grace", SAVE_GRACE)
    try:
        run_dir = wait_for(lambda: run_dirs(project), 60, "the run folder")[0]
        victim = wait_for(lambda: started_pid(run_dir, 1), START_S, "rank 1 to train")
        os.kill(victim, signal.SIGKILL)
        output, _ = runner.communicate(timeout=120)
        left = leftover_processes(project)
    finally:
        clean_up(project, runner)
    assert runner.returncode == 3, output
    assert left == []
    teardown = json.loads((run_dir / "summary.json").read_text())["teardown"]
    assert teardown["waited_for_saves"] is False and teardown["waited_for_saves_s"] == 0
    assert teardown["no_save_because"] == "rank 1 (node 0) vanished"
    assert teardown["save_grace_s"] == float(SAVE_GRACE) > teardown["stop_s"]
    assert "to save a checkpoint at its next logged step" not in output


def test_sigterm_to_a_job_flagged_hung_stops_it_without_the_save_grace(tmp_path: Path) -> None:
    project = render_cpu(tmp_path, "shell", **LONG_RUN)
    runner = start_runner(project, "--interval", "1", "--hang-after", "6", "--save-grace", SAVE_GRACE)
    try:
        run_dir = wait_for(lambda: run_dirs(project), 60, "the run folder")[0]
        frozen = wait_for(lambda: started_pid(run_dir, 1), START_S, "rank 1 to train")
        os.kill(frozen, signal.SIGSTOP)
        # the runner collects every rank's stacks the moment it flags the hang
        wait_for(lambda: (run_dir / "hang" / "collected.json").is_file(), START_S, "the runner to flag the hang")
        runner.send_signal(signal.SIGTERM)
        output, _ = runner.communicate(timeout=120)
        left = leftover_processes(project)
    finally:
        clean_up(project, runner)
    assert runner.returncode == 128 + signal.SIGTERM, output
    assert left == []
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "interrupted"
    teardown = summary["teardown"]
    assert teardown["waited_for_saves"] is False
    assert teardown["no_save_because"] == "rank 1 hung"
    assert teardown["save_grace_s"] == float(SAVE_GRACE) > teardown["stop_s"]
    assert "stopping: no rank can save a checkpoint (rank 1 hung: the others wait for it in a collective)" in output
    assert "every rank was sent SIGTERM to save a checkpoint" not in output
