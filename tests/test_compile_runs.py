"""training.compile default, for real: the CPU demo trains compiled as it trains eagerly, and resumes across.

One module-scoped sequence of real 1 node x 2 rank jobs on the CPU (gloo, the
shell launcher: compiling is the point, and torchrun's agent would import torch
in each job), an eager and a compiled project of the same answers sharing
checkpoints: epoch 1 eager; epoch 2 compiled, resumed from the eager
checkpoint; then, from a copy of the compiled job's checkpoint of step 56,
steps 57-64 again eagerly, to compare with the compiled ones. The compiled
job compiles with inductor, which costs tens of seconds on 2 cores: the one
real compile of the suite (about 2 to 3 minutes for the three jobs here).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from runtime.checkpoint import COMPILED_PREFIX
from tests.runs import events_of, free_port, kinds, node_env, render_cpu

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("compile-runs")]

STEPS_PER_EPOCH = 32  # 1024 samples / (16 a batch x 2 ranks)


@dataclass(frozen=True)
class Runs:
    """The run folders and checkpoint folders of the sequence."""

    eager_first: Path  # epoch 1
    compiled: Path  # epoch 2, from the eager checkpoint of step 32
    eager_again: Path  # steps 57-64, from the compiled checkpoint of step 56
    checkpoints: Path
    again_checkpoints: Path
    inductor_cache: Path  # where the compiled job's inductor wrote its kernels


def run_epochs(project: Path, run_dir: Path, checkpoints: Path, epochs: int, **env: str) -> None:
    """Run the project's one node to `epochs` epochs, keeping checkpoints in `checkpoints`."""
    result = subprocess.run(
        ["bash", str(project / "launch" / "node0.sh"), "--epochs", str(epochs)],
        env=node_env(run_dir, NPU_WIZARD_CHECKPOINT_DIR=str(checkpoints), **env),
        capture_output=True,
        text=True,
        timeout=900,  # a safety net: the three runs took 425 s in all in a stress pass (two cores, stress-ng)
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """The sequence: eager, compiled from the eager checkpoint, eager again from a compiled one."""
    root = tmp_path_factory.mktemp("compile")
    runs = Runs(*(root / name for name in ("first", "compiled", "again", "checkpoints", "again-cp", "inductor")))
    # one project name (a checkpoint folder is shared only within a project) and, as the jobs run
    # one after another, one master port
    answers = {"project_name": "cpu-compiled", "network.master_port": free_port()}
    eager = render_cpu(root / "eager", "shell", answers=answers)
    compiled = render_cpu(root / "compiled", "shell", answers={**answers, "training.compile": "default"})
    run_epochs(eager, runs.eager_first, runs.checkpoints, 1)
    run_epochs(compiled, runs.compiled, runs.checkpoints, 2, TORCHINDUCTOR_CACHE_DIR=str(runs.inductor_cache))
    shutil.copytree(runs.checkpoints, runs.again_checkpoints)
    (runs.again_checkpoints / "step-000000064.pt").unlink()  # the newest two are kept: 56 is left
    run_epochs(eager, runs.eager_again, runs.again_checkpoints, 2)
    return runs


def losses(run_dir: Path) -> dict[int, float]:
    """Rank 0's logged loss by step."""
    return {event["step"]: event["loss"] for event in kinds(events_of(run_dir)[0], "step")}


def started(run_dir: Path) -> dict:
    """Rank 0's started event."""
    return kinds(events_of(run_dir)[0], "started")[-1]


def test_a_compiled_job_resumes_from_an_eager_checkpoint_and_compiles(runs: Runs) -> None:
    assert started(runs.compiled)["resumed_step"] == STEPS_PER_EPOCH
    assert sorted(losses(runs.compiled)) == list(range(STEPS_PER_EPOCH + 4, 2 * STEPS_PER_EPOCH + 1, 4))
    assert list(runs.inductor_cache.rglob("*.py")), "inductor wrote no kernel: nothing compiled"
    for rank, rank_events in events_of(runs.compiled).items():
        fallbacks = [event for event in kinds(rank_events, "warning") if event["kind"] == "compile"]
        assert fallbacks == [], f"rank {rank} fell back to eager"


def test_compiled_the_demo_trains_to_the_loss_of_eager(runs: Runs) -> None:
    compiled, eager = losses(runs.compiled), losses(runs.eager_again)
    assert sorted(eager) == [60, 64]
    # the same batches from the same weights: fused kernels round differently, nothing more
    assert [compiled[step] for step in sorted(eager)] == pytest.approx(
        [eager[step] for step in sorted(eager)], abs=0.02
    )
    first = list(losses(runs.eager_first).values())
    assert sum(compiled.values()) / len(compiled) < sum(first) / len(first)  # and it learns


def test_an_eager_job_resumes_from_the_compiled_jobs_checkpoint(runs: Runs) -> None:
    assert started(runs.eager_again)["resumed_step"] == 56


def test_the_compiled_jobs_checkpoint_holds_the_modules_own_keys(runs: Runs) -> None:
    saved = torch.load(runs.checkpoints / "step-000000064.pt", map_location="cpu", weights_only=True)
    eager = torch.load(runs.again_checkpoints / "step-000000064.pt", map_location="cpu", weights_only=True)
    assert list(saved["model"]) == list(eager["model"])
    assert not any(COMPILED_PREFIX in key for key in saved["model"])
