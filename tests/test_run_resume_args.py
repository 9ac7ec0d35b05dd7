"""A user's script that resumes only behind a flag, through training.resume_args, run with the venv off PATH.

Real processes: 1 node x 2 ranks of torchrun on 127.0.0.1, gloo on the CPU, the
manual engine. The script (tests/user_scripts/ddp_init_from.py, shaped like
nanoGPT's train.py) saves out/ckpt.pt itself and loads it only with
--init_from=resume; it calls no report hook. `npu-wizard run` is started as a user
whose virtual environment is not active: PATH is /usr/bin:/bin and PYTHON unset, so
the launch scripts must get npu-wizard's own interpreter and the torchrun beside it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runs import clean_up, events_of, free_port, kinds, leftover_processes, run_dirs, wait_for
from wizard.answers.model import resolve
from wizard.render.render import render
from wizard.run.launch import RunOptions, dry_run

pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).resolve().parent / "user_scripts"
START_S = 240
STEPS = 64


def render_init_from(tmp_path: Path) -> Path:
    """1 node x 2 ranks (torchrun) running the nanoGPT-shaped script as train_gpt.py, resume_args set."""
    answers = {
        "project_name": "own-init-from",
        "device": "cpu",
        "nodes": 1,
        "devices_per_node": 2,
        "launcher": "torchrun",
        "amp": "off",
        "network.host_ips": ["127.0.0.1"],
        "network.master_port": free_port(),
        "training.script": "train_gpt.py",
        "training.script_args": ["--steps", str(STEPS)],
        "training.resume_args": "--init_from=resume",
    }
    project = render(resolve(answers), tmp_path).project_dir
    shutil.copyfile(SCRIPTS / "ddp_init_from.py", project / "train_gpt.py")
    return project


def without_venv() -> dict[str, str]:
    """A user's shell whose virtual environment is not active: no venv on PATH, no PYTHON."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHON" and not key.startswith("NPU_WIZARD_")}
    return {**env, "PATH": "/usr/bin:/bin", "NPU_WIZARD_HEARTBEAT_S": "1"}


def rank_1_once_saved(project: Path, run_dir: Path) -> int | None:
    """Rank 1's pid once the script saved its checkpoint, else None."""
    started = kinds(events_of(run_dir).get(1, []), "started")
    return started[-1]["pid"] if started and (project / "out" / "ckpt.pt").is_file() else None


def test_a_sigkilled_rank_comes_back_with_resume_args_and_the_attempt_number_off_the_venvs_path(
    tmp_path: Path,
) -> None:
    project = render_init_from(tmp_path)
    runner = subprocess.Popen(
        [sys.executable, "-m", "wizard", "run", str(project), "--plain", "--restarts", "1", "--", "--tag", "once"],
        env=without_venv(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        run_dir = wait_for(lambda: run_dirs(project), 60, "the run folder")[0]
        os.kill(wait_for(lambda: rank_1_once_saved(project, run_dir), START_S, "the first checkpoint"), signal.SIGKILL)
        output, _ = runner.communicate(timeout=2 * START_S)
        assert not leftover_processes(project)
    finally:
        clean_up(project, runner)
    assert runner.returncode == 0, output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "finished" and summary["job_restarts"] == 1
    first = (run_dir / "logs" / "attempt-1" / "rank-1.log").read_text()
    assert "argv ['--steps', '64', '--tag', 'once'] attempt 1 resuming 0" in first
    second = (run_dir / "logs" / "rank-1.log").read_text()
    assert "argv ['--steps', '64', '--tag', 'once', '--init_from=resume'] attempt 2 resuming 1" in second
    resumed = int(second.split("resumed at step ")[1].split()[0])
    assert resumed > 0 and f"[rank 1] finished at step {STEPS}" in second
    # a run after a finished one starts anew: no resume_args, attempt 1
    shown = dry_run(project, RunOptions())
    assert "NPU_WIZARD_ATTEMPT=1" in shown and "NPU_WIZARD_RESUMING=0" in shown
