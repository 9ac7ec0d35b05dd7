"""The rendered train.py warms the scaled learning rate up, logs it, and resumes on the curve.

Real CPU runs (gloo, 2 processes on 127.0.0.1): the step events carry the rate
each logged step trained with.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from runtime.schedule import LinearWarmup
from tests.runs import events_of, kinds, node_env, render_cpu

pytestmark = pytest.mark.slow

# 1024 samples / 2 ranks / batch 16 = 32 steps an epoch; 0.05 x (16 x 2) / 8 = 0.2
STEPS_PER_EPOCH = 32
WARMUP = LinearWarmup(start_lr=0.05, target_lr=0.2, warmup_steps=2 * STEPS_PER_EPOCH)


def warmup_project(tmp_path: Path, epochs: int) -> Path:
    """A 2-rank torchrun project whose rate is scaled 4x and warmed up over 2 epochs."""
    return render_cpu(
        tmp_path, "torchrun", epochs=epochs, base_batch_size=8, base_lr=0.05, warmup_epochs=2, checkpoint_every=0
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


def logged_rates(run_dir: Path) -> dict[int, float]:
    """Rank 0's learning rate per logged step."""
    return {event["step"]: event["lr"] for event in kinds(events_of(run_dir)[0], "step")}


def test_the_scaled_rate_climbs_from_the_base_rate_over_the_warmup_epochs(tmp_path: Path) -> None:
    project = warmup_project(tmp_path, epochs=3)
    output = run_node0(project, tmp_path / "run")
    assert (
        "learning rate warmup: 0.05 -> 0.2 linearly over the first 64 steps (Goyal et al. 2017), then 0.2"
    ) in output
    rates = logged_rates(tmp_path / "run")
    assert len(rates) == 3 * STEPS_PER_EPOCH // 4
    for step, lr in rates.items():  # the rate of step s was set before it, after s - 1 steps
        assert lr == pytest.approx(WARMUP.lr_at(step - 1)), step
    assert rates[4] < 0.07 and rates[96] == pytest.approx(0.2)


def test_a_resumed_run_continues_the_warmup_where_it_stopped(tmp_path: Path) -> None:
    project = warmup_project(tmp_path, epochs=2)
    run_node0(project, tmp_path / "first", "--epochs", "1")
    assert max(logged_rates(tmp_path / "first")) == STEPS_PER_EPOCH
    run_node0(project, tmp_path / "second")
    resumed = kinds(events_of(tmp_path / "second")[0], "started")[0]
    assert resumed["resumed_step"] == STEPS_PER_EPOCH
    rates = logged_rates(tmp_path / "second")
    assert min(rates) == STEPS_PER_EPOCH + 4
    for step, lr in rates.items():
        assert lr == pytest.approx(WARMUP.lr_at(step - 1)), step
