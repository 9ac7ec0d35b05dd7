"""The rendered train.py trains for real: 2 CPU processes with gloo, torchrun and mp.spawn.

Each run is a few seconds of a tiny synthetic job; the ranks must end with
bit-identical weights, a falling loss and a checkpoint on disk.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.events import read_events
from tests.runs import free_port
from wizard.answers.model import resolve
from wizard.render.render import render

pytestmark = pytest.mark.slow


def cpu_project(tmp_path: Path, launcher: str, amp: str) -> Path:
    """A 1 node x 2 process CPU project with a tiny synthetic dataset."""
    answers = resolve(
        {
            "project_name": "smoke",
            "device": "cpu",
            "nodes": 1,
            "devices_per_node": 2,
            "launcher": launcher,
            "amp": amp,
            "training.samples": 1024,
            "training.batch_size": 16,
            "training.epochs": 2,
            "training.log_every": 4,
            "training.checkpoint_every": 10,
        }
    )
    return render(answers, tmp_path / "out").project_dir


def rank_env(run_dir: Path, **extra: str) -> dict[str, str]:
    """What a launch script exports for node 0 on loopback."""
    return {
        **os.environ,
        "HCCL_IF_IP": "127.0.0.1",
        "NODE_RANK": "0",
        "NPU_WIZARD_RUN_DIR": str(run_dir),
        "NPU_WIZARD_HEARTBEAT_S": "0.5",
        **extra,
    }


def assert_trained(project: Path, run_dir: Path) -> None:
    """Both ranks started and finished with identical weights; loss fell; a checkpoint exists."""
    found = read_events(run_dir)
    assert sorted(found) == [0, 1]
    finished = {}
    for rank, rank_events in found.items():
        kinds = [e["event"] for e in rank_events]
        assert "started" in kinds and "finished" in kinds and "error" not in kinds, kinds
        finished[rank] = next(e for e in rank_events if e["event"] == "finished")["weights_sha256"]
        started = next(e for e in rank_events if e["event"] == "started")
        assert (started["rank"], started["local_rank"], started["world_size"]) == (rank, rank, 2)
    assert finished[0] == finished[1]
    losses = [e["loss"] for e in found[0] if e["event"] == "step"]
    assert len(losses) >= 4 and sum(losses[-2:]) < sum(losses[:2]), losses
    assert list((project / "checkpoints").glob("step-*.pt"))
    assert (run_dir / "logs" / "rank-1.log").read_text().startswith("rank 1/2: cpu with gloo")


def test_torchrun_trains_two_ranks_to_identical_weights(tmp_path: Path) -> None:
    project = cpu_project(tmp_path, "torchrun", "fp16")
    run_dir = tmp_path / "run"
    command = [
        *(sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--node-rank", "0"),
        *("--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port())),
        *("train.py", "--launcher", "torchrun"),
    ]
    result = subprocess.run(command, cwd=project, env=rank_env(run_dir), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert_trained(project, run_dir)
    assert "finished 2 epoch(s)" in result.stdout


def test_mp_spawn_trains_two_ranks_to_identical_weights(tmp_path: Path) -> None:
    project = cpu_project(tmp_path, "mp-spawn", "bf16")
    run_dir = tmp_path / "run"
    command = [sys.executable, "train.py", "--launcher", "mp-spawn", "--nnodes", "1", "--node-rank", "0"]
    command += ["--nproc-per-node", "2"]
    env = rank_env(run_dir, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    result = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert_trained(project, run_dir)
