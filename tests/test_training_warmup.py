"""The rendered train.py warms the scaled learning rate up, logs it, and resumes on the curve.

Real CPU runs (gloo, 2 processes on 127.0.0.1, the shell launcher): the step events carry the rate
each logged step trained with. Two runs of one project share the module: epoch 1, then the
same job resumed from its checkpoint to epoch 3, past the end of the warmup.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from runtime.schedule import LinearWarmup
from tests.runs import events_of, kinds, node_env, render_cpu

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("warmup-runs")]

# 1024 samples / 2 ranks / batch 16 = 32 steps an epoch; 0.05 x (16 x 2) / 8 = 0.2
STEPS_PER_EPOCH = 32
WARMUP = LinearWarmup(start_lr=0.05, target_lr=0.2, warmup_steps=2 * STEPS_PER_EPOCH)


@dataclass(frozen=True)
class WarmupRuns:
    """The first run's folder and output (epoch 1) and the resumed run's folder (epochs 2 and 3)."""

    first: Path
    first_output: str
    resumed: Path


def warmup_project(tmp_path: Path, epochs: int) -> Path:
    """A 2-rank project whose rate is scaled 4x and warmed up over 2 epochs."""
    # the shell launcher: the schedule is the point, and torchrun's agent would import torch in each run
    return render_cpu(
        tmp_path, "shell", epochs=epochs, base_batch_size=8, base_lr=0.05, warmup_epochs=2, checkpoint_every=0
    )


def run_node0(project: Path, run_dir: Path, *args: str) -> str:
    """Run launch/node0.sh to the end with train.py arguments `args`; its output."""
    result = subprocess.run(
        ["bash", str(project / "launch" / "node0.sh"), *args],
        env=node_env(run_dir),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


@pytest.fixture(scope="module")
def warmup_runs(tmp_path_factory: pytest.TempPathFactory) -> WarmupRuns:
    """Epoch 1 of a 3-epoch project, then the same project run again: resumed at step 32, to step 96."""
    root = tmp_path_factory.mktemp("warmup")
    project = warmup_project(root, epochs=3)
    first_output = run_node0(project, root / "first", "--epochs", "1")
    run_node0(project, root / "resumed")
    return WarmupRuns(root / "first", first_output, root / "resumed")


def logged_rates(run_dir: Path) -> dict[int, float]:
    """Rank 0's learning rate per logged step."""
    return {event["step"]: event["lr"] for event in kinds(events_of(run_dir)[0], "step")}


def test_the_scaled_rate_climbs_from_the_base_rate_over_the_warmup_epochs(warmup_runs: WarmupRuns) -> None:
    assert (
        "learning rate warmup: 0.05 -> 0.2 linearly over the first 64 steps (Goyal et al. 2017), then 0.2"
    ) in warmup_runs.first_output
    # the two runs together log each step of the 3 epochs once, as one run of them would
    rates = {**logged_rates(warmup_runs.first), **logged_rates(warmup_runs.resumed)}
    assert len(rates) == 3 * STEPS_PER_EPOCH // 4
    for step, lr in rates.items():  # the rate of step s was set before it, after s - 1 steps
        assert lr == pytest.approx(WARMUP.lr_at(step - 1)), step
    assert rates[4] < 0.07 and rates[96] == pytest.approx(0.2)


def test_a_resumed_run_continues_the_warmup_where_it_stopped(warmup_runs: WarmupRuns) -> None:
    assert max(logged_rates(warmup_runs.first)) == STEPS_PER_EPOCH
    resumed = kinds(events_of(warmup_runs.resumed)[0], "started")[0]
    assert resumed["resumed_step"] == STEPS_PER_EPOCH
    rates = logged_rates(warmup_runs.resumed)
    assert min(rates) == STEPS_PER_EPOCH + 4
    for step, lr in rates.items():
        assert lr == pytest.approx(WARMUP.lr_at(step - 1)), step
