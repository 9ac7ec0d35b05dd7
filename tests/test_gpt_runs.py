"""The gpt model on token data, for real (issue 38): 2 nodes x 2 processes on the CPU through `npu-wizard run`.

Two runs of the same project answers share the module: one to its end, and one
whose rank 3 is SIGKILLed after node 1's first checkpoint and restarted once
(--restarts 1). With the same seed, and a resume that continues the same data
stream, both log the same losses at every logged step on every rank.
"""

from __future__ import annotations

import math
import os
import random
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.runs import (
    RunEnded,
    clean_up,
    events_of,
    kinds,
    leftover_processes,
    render_cpu,
    run_dirs,
    run_to_its_end,
    start_runner,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("gpt-2x2-runs")]

MAX_STEPS = 200
EVAL_EVERY = 50
START_S = 240
GPT_ANSWERS = {
    "model": "gpt",
    "dataset": "tokens",
    "gpt_size": "tiny",
    "batch_size": 8,
    "max_steps": MAX_STEPS,
    "epochs": 10,  # an epoch is 80 steps of this text: the max steps end the run
    "eval_every": EVAL_EVERY,
    "log_every": 10,
    "checkpoint_every": 50,
    "lr": 0.003,
    "lr_schedule": "cosine",
    "warmup_steps": 20,
    "min_lr": 0.0003,
}


def write_text_folder(folder: Path) -> Path:
    """Four .txt files of short seeded sentences: some structure for a model to learn, 180k bytes in all."""
    rng = random.Random(7)
    subjects = ["the cat", "a dog", "my friend", "the old man", "our teacher", "the small bird"]
    verbs = ["sees", "likes", "follows", "finds", "watches", "hears"]
    objects = ["the red ball", "a green tree", "the river", "a quiet house", "the long road", "some bread"]
    folder.mkdir()
    for part in range(4):
        lines = [f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}." for _ in range(1500)]
        (folder / f"part{part}.txt").write_text("\n".join(lines) + "\n")
    return folder


def unigram_entropy_nats(folder: Path) -> float:
    """The byte-level unigram entropy of the folder's text with one end-of-text per file, in nats like the loss."""
    counts: Counter[int] = Counter()
    for path in sorted(folder.glob("*.txt")):
        counts.update(path.read_bytes())
        counts[256] += 1
    total = sum(counts.values())
    return -sum(n / total * math.log(n / total) for n in counts.values())


def gpt_project(root: Path, text: Path, launcher: str = "torchrun", **answers: object) -> Path:
    """A 2 x 2 CPU project of the tiny gpt, its tokens prepared from `text`; `answers` change training.*."""
    project = render_cpu(root, launcher, nodes=2, **{**GPT_ANSWERS, **answers})
    prepared = subprocess.run(
        [sys.executable, "prepare_data.py", str(text)], cwd=project, capture_output=True, text=True, timeout=60
    )
    assert prepared.returncode == 0, prepared.stderr
    return project


def rank3_pid_after_checkpoint(run_dir: Path) -> int | None:
    """Rank 3's pid once node 1 (rank 2, its local rank 0) wrote a checkpoint, else None."""
    found = events_of(run_dir)
    if not kinds(found.get(2, []), "checkpoint") or not kinds(found.get(3, []), "started"):
        return None
    return kinds(found[3], "started")[-1]["pid"]


@dataclass(frozen=True)
class GptRuns:
    """The run to its end, the killed and restarted run, and the entropy of their text."""

    whole: RunEnded
    killed: RunEnded
    entropy: float


@pytest.fixture(scope="module")
def gpt_runs(tmp_path_factory: pytest.TempPathFactory) -> GptRuns:
    """Both 2 x 2 runs of the tiny gpt (about a minute on two cores)."""
    text = write_text_folder(tmp_path_factory.mktemp("text") / "corpus")
    whole = run_to_its_end(gpt_project(tmp_path_factory.mktemp("gpt-whole"), text), "--interval", "2")
    project = gpt_project(tmp_path_factory.mktemp("gpt-killed"), text)
    runner = start_runner(project, "--interval", "2", "--restarts", "1")
    try:
        run_dir = wait_for(lambda: run_dirs(project), 60, "the run folder")[0]
        os.kill(
            wait_for(lambda: rank3_pid_after_checkpoint(run_dir), START_S, "node 1's first checkpoint"), signal.SIGKILL
        )
        output, _ = runner.communicate(timeout=2 * START_S)
        left = leftover_processes(project)
    finally:
        clean_up(project, runner)
    killed = RunEnded(project, run_dir, runner.returncode, output, "", left)
    return GptRuns(whole, killed, unigram_entropy_nats(text))


def logged_losses(run: RunEnded, rank: int) -> dict[int, float]:
    """The loss a rank logged at each step, the last attempt's where a step was logged twice."""
    return {event["step"]: event["loss"] for event in kinds(events_of(run.run_dir)[rank], "step")}


def test_the_training_loss_falls_well_below_the_unigram_entropy_of_the_text(gpt_runs: GptRuns) -> None:
    assert gpt_runs.whole.code == 0, gpt_runs.whole.stdout + gpt_runs.whole.stderr
    for rank in range(4):
        losses = logged_losses(gpt_runs.whole, rank)
        assert losses[10] > gpt_runs.entropy  # it starts above what byte frequencies alone give (2.86 nats)
        assert losses[MAX_STEPS] < 0.5 * gpt_runs.entropy, (losses, gpt_runs.entropy)


def test_the_step_events_carry_tokens_per_second_and_no_mfu_on_the_cpu(gpt_runs: GptRuns) -> None:
    steps = kinds(events_of(gpt_runs.whole.run_dir)[0], "step")
    assert all(event["tokens_per_s"] == pytest.approx(event["samples_per_s"] * 64) for event in steps)
    assert not any("mfu" in event for event in steps)


def test_the_validation_loss_is_reported_at_each_eval_every_the_same_on_every_rank(gpt_runs: GptRuns) -> None:
    found = events_of(gpt_runs.whole.run_dir)
    evals = {rank: kinds(found[rank], "eval") for rank in range(4)}
    assert [event["step"] for event in evals[0]] == list(range(EVAL_EVERY, MAX_STEPS + 1, EVAL_EVERY))
    assert all([e["val_loss"] for e in evals[rank]] == [e["val_loss"] for e in evals[0]] for rank in range(4))
    assert evals[0][-1]["val_loss"] < evals[0][0]["val_loss"] < gpt_runs.entropy
    assert f"step {MAX_STEPS}: validation loss" in (gpt_runs.whole.run_dir / "logs" / "rank-0.log").read_text()


def test_a_sigkilled_rank_restarts_the_job_from_the_checkpoint_and_the_loss_continues_the_same_curve(
    gpt_runs: GptRuns,
) -> None:
    killed = gpt_runs.killed
    assert killed.code == 0, killed.stdout
    assert killed.left == []
    started = kinds(events_of(killed.run_dir)[3], "started")
    assert len(started) == 2 and started[1]["resumed_step"] >= 50
    resumed = started[1]["resumed_step"]
    for rank in range(4):
        whole, after_kill = logged_losses(gpt_runs.whole, rank), logged_losses(killed, rank)
        assert sorted(after_kill) == sorted(whole)
        # the same seed gives the same curve; after the resume the same windows follow, none repeated: the same
        # losses at every step after the checkpoint, as the run that was never stopped logged them
        for step, loss in whole.items():
            assert after_kill[step] == pytest.approx(loss, rel=1e-4, abs=1e-5), (rank, step, resumed)
