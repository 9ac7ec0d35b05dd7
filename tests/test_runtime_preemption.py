"""runtime/preemption.py: which ranks ended preempted, and the Slurm batch script's --signal and --requeue."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runtime import events
from runtime.preemption import main, preempted_step
from wizard.answers.model import resolve
from wizard.render.render import render

ROOT = Path(__file__).resolve().parent.parent


def write_events(run_dir: Path, rank: int, *said: dict[str, Any]) -> None:
    path = events.events_path(run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"rank": rank, "time": 1.0, **event}) + "\n" for event in said))


def test_the_step_is_named_only_when_every_rank_ended_preempted_at_it(tmp_path: Path) -> None:
    for rank in (0, 1):
        write_events(tmp_path, rank, {"event": "started"}, {"event": "preempted", "step": 12}, {"event": "heartbeat"})
    assert preempted_step(tmp_path, range(2)) == 12
    write_events(tmp_path, 1, {"event": "preempted", "step": 12}, {"event": "started"})  # a later run started again
    assert preempted_step(tmp_path, range(2)) is None
    write_events(tmp_path, 1, {"event": "preempted", "step": 16})
    assert preempted_step(tmp_path, range(2)) is None  # two steps: not one agreed stop
    assert preempted_step(tmp_path, range(3)) is None  # rank 2 never wrote anything


def test_the_module_says_so_for_the_launch_scripts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for rank in (2, 3):
        write_events(tmp_path, rank, {"event": "preempted", "step": 8})
    assert main([str(tmp_path), "2", "2"]) == 0
    assert capsys.readouterr().out == "ranks 2-3 preempted at step 8, checkpoint saved\n"
    assert main([str(tmp_path), "0", "2"]) == 1
    done = subprocess.run(
        [sys.executable, "-m", "runtime.preemption", str(tmp_path), "2", "2"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0 and "preempted at step 8" in done.stdout  # no torch imported on the way: fast


def render_slurm(tmp_path: Path, **answers: Any) -> Path:
    raw = {
        "project_name": "slurm-signal",
        "device": "cpu",
        "nodes": 2,
        "devices_per_node": 2,
        "launcher": "torchrun",
        "cluster.engine": "slurm",
        **answers,
    }
    return render(resolve(raw), tmp_path).project_dir


def test_slurm_projects_ask_for_usr1_before_the_time_limit_and_may_be_requeued(tmp_path: Path) -> None:
    batch = (render_slurm(tmp_path) / "slurm" / "job.sbatch").read_text()
    assert "#SBATCH --signal=B:USR1@120\n#SBATCH --requeue\n" in batch
    assert "trap save_and_stop USR1\n" in batch
    assert 'scontrol requeue "$SLURM_JOB_ID"' in batch


def test_signal_before_0_renders_neither_the_signal_nor_the_requeue(tmp_path: Path) -> None:
    batch = (render_slurm(tmp_path, **{"cluster.signal_before": 0}) / "slurm" / "job.sbatch").read_text()
    assert "--signal" not in batch and "--requeue" not in batch and "scontrol requeue" not in batch
