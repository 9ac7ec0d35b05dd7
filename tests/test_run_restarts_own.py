"""`npu-wizard run --restarts` with a user's own env:// script that resumes from its own checkpoints.

Real processes: 2 nodes x 1 rank of torchrun on 127.0.0.1, gloo on the CPU, the
manual engine. The script (tests/user_scripts/ddp_resume_report.py) saves every 8
steps and, started again, loads its newest checkpoint and reports its steps on
from there: the runner learns where it resumed from its first reported step.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from tests.runs import clean_up, events_of, free_port, kinds, leftover_processes, run_dirs, start_runner, wait_for
from wizard.answers.model import resolve
from wizard.render.render import render

pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).resolve().parent / "user_scripts"
START_S = 240
STEPS = 96


def render_resuming(tmp_path: Path) -> Path:
    """2 nodes x 1 rank (torchrun) running the resuming script as own.py."""
    answers = {
        "project_name": "own-resume",
        "device": "cpu",
        "nodes": 2,
        "devices_per_node": 1,
        "launcher": "torchrun",
        "amp": "off",
        "network.host_ips": ["127.0.0.1", "127.0.0.1"],
        "network.master_port": free_port(),
        "training.script": "own.py",
        "training.script_args": ["--steps", str(STEPS)],
    }
    project = render(resolve(answers), tmp_path).project_dir
    shutil.copyfile(SCRIPTS / "ddp_resume_report.py", project / "own.py")
    return project


def rank_1_once_saved(run_dir: Path) -> int | None:
    """Rank 1's pid once rank 0 reported a checkpoint, else None."""
    found = events_of(run_dir)
    if not kinds(found.get(0, []), "checkpoint") or not kinds(found.get(1, []), "started"):
        return None
    return kinds(found[1], "started")[-1]["pid"]


def test_a_users_resuming_script_goes_through_a_sigkill_restart_to_the_end(tmp_path: Path) -> None:
    project = render_resuming(tmp_path)
    runner = start_runner(project, "--interval", "2", "--restarts", "1")
    try:
        run_dir = wait_for(lambda: run_dirs(project), 60, "the run folder")[0]
        os.kill(wait_for(lambda: rank_1_once_saved(run_dir), START_S, "rank 0's first checkpoint"), signal.SIGKILL)
        output, _ = runner.communicate(timeout=2 * START_S)
        assert not leftover_processes(project)
    finally:
        clean_up(project, runner)
    assert runner.returncode == 0, output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "finished" and summary["job_restarts"] == 1
    assert summary["steps"] == STEPS
    first, second = summary["attempts"]
    assert first["kind"] == "vanished" and first["cause"].startswith("rank 1 (node 1): its process")
    # where the script itself said it resumed, in its log of the second attempt
    said = (run_dir / "logs" / "rank-1.log").read_text()
    resumed = int(said.split("resumed from ")[1].split(" at step ")[1].split()[0])
    assert resumed > 0 and first["resumed_from_step"] == resumed
    assert first["steps_lost"] == first["failed_at_step"] - resumed >= 0
    assert second["outcome"] == "finished"
    for rank in (0, 1):
        assert len(kinds(events_of(run_dir)[rank], "started")) == 2
        assert kinds(events_of(run_dir)[rank], "finished")
    assert f"[rank 1] finished at step {STEPS}" in said
