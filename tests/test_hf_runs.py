"""training.model hf for real (issue 38): a tiny local model trains 1 node x 2 ranks on the CPU, checkpoints, resumes.

The model and its tokenizer are made here from a config (tests/hf_models.py)
and saved into the project's models/tiny, so the relative folder is read at
start-up; prepare_data.py tokenizes a text folder with that tokenizer. One
project, two runs shared by the tests: 6 steps, then again to 10 with
--max-steps, which resumes from the step-6 checkpoint. A third project asks
for windows beyond the model's 64 positions and is refused at start-up.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.hf_models import LINES, POSITIONS, save_tiny_model
from tests.runs import events_of, kinds, node_env, render_cpu, wait_nodes

pytest.importorskip("transformers")
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("hf-runs")]

HF_ANSWERS = {
    "model": "hf",
    "dataset": "tokens",
    "hf_model_path": "models/tiny",
    "block_size": 32,
    "batch_size": 4,
    "max_steps": 6,
    "epochs": 10,
    "eval_every": 3,
    "log_every": 2,
    "checkpoint_every": 3,
    "lr": 0.003,
}


def hf_project(root: Path, model: Path, **answers: object) -> Path:
    """A 1 x 2 torchrun CPU project of the tiny model, copied into its models/tiny."""
    project = render_cpu(root, "torchrun", **{**HF_ANSWERS, **answers})
    shutil.copytree(model, project / "models" / "tiny")
    return project


def prepare_text(project: Path, text: Path) -> None:
    """Seeded lines of the tokenizer's own text in two files, tokenized by the project's prepare_data.py."""
    text.mkdir()
    rng = random.Random(3)
    for part in range(2):
        (text / f"part{part}.txt").write_text("\n".join(rng.choice(LINES) for _ in range(600)) + "\n")
    prepared = subprocess.run(
        [sys.executable, "prepare_data.py", str(text)], cwd=project, capture_output=True, text=True, timeout=180
    )
    assert prepared.returncode == 0, prepared.stderr


def run_node(project: Path, run_dir: Path, *args: str, timeout: float = 300) -> tuple[int, str]:
    """launch/node0.sh ARGS to its end, as a user starts it, with a Hugging Face cache of its own (hf-home)."""
    process = subprocess.Popen(
        ["bash", str(project / "launch" / "node0.sh"), *args],
        env=node_env(run_dir, HF_HOME=str(project.parent / "hf-home")),
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    ((code, output),) = wait_nodes([process], timeout)
    return code, output


@dataclass(frozen=True)
class HfRuns:
    """The tiny model, the project, its first run (6 steps) and the run that resumed it to 10."""

    model: Path
    project: Path
    first: Path
    resumed: Path
    outputs: tuple[str, str]


@pytest.fixture(scope="module")
def hf_runs(tmp_path_factory: pytest.TempPathFactory) -> HfRuns:
    """Both runs of the tiny hf model (about a minute on two quiet cores)."""
    root = tmp_path_factory.mktemp("hf-runs")
    model = save_tiny_model(root / "tiny")
    project = hf_project(root, model)
    prepare_text(project, root / "text")
    first_code, first_output = run_node(project, root / "first")
    assert first_code == 0, first_output[-3000:]
    resumed_code, resumed_output = run_node(project, root / "resumed", "--max-steps", "10")
    assert resumed_code == 0, resumed_output[-3000:]
    return HfRuns(model, project, root / "first", root / "resumed", (first_output, resumed_output))


def test_the_tiny_model_trains_on_both_ranks_with_the_same_weights_and_a_falling_loss(hf_runs: HfRuns) -> None:
    found = events_of(hf_runs.first)
    assert sorted(found) == [0, 1]
    digests = {kinds(events, "finished")[-1]["weights_sha256"] for events in found.values()}
    assert len(digests) == 1
    steps = kinds(found[0], "step")
    assert [event["step"] for event in steps] == [2, 4, 6]
    assert steps[-1]["loss"] < steps[0]["loss"]
    assert all(event["tokens_per_s"] == pytest.approx(event["samples_per_s"] * 32) for event in steps)
    assert not any("mfu" in event for event in steps)  # never on a CPU


def test_the_validation_loss_is_reported_at_each_eval_every_the_same_on_both_ranks(hf_runs: HfRuns) -> None:
    found = events_of(hf_runs.first)
    evals = {rank: [(e["step"], e["val_loss"]) for e in kinds(found[rank], "eval")] for rank in (0, 1)}
    assert [step for step, _ in evals[0]] == [3, 6] and evals[0] == evals[1]
    assert evals[0][1][1] < evals[0][0][1]


def test_the_run_checkpoints_and_a_longer_run_resumes_from_the_last_checkpoint(hf_runs: HfRuns) -> None:
    saved = [event["step"] for event in kinds(events_of(hf_runs.first)[0], "checkpoint")]
    assert saved == [3, 6]
    found = events_of(hf_runs.resumed)
    for rank in (0, 1):
        assert kinds(found[rank], "started")[0]["resumed_step"] == 6
        assert [event["step"] for event in kinds(found[rank], "step")] == [8, 10]
    assert "resuming from" in hf_runs.outputs[1] and "step-000000006.pt" in hf_runs.outputs[1]
    first_losses = [event["loss"] for event in kinds(events_of(hf_runs.first)[0], "step")]
    resumed_losses = [event["loss"] for event in kinds(found[0], "step")]
    assert resumed_losses[-1] < first_losses[0]  # the curve goes on from the trained weights, not from the start
    assert sorted(path.name for path in (hf_runs.project / "checkpoints").glob("*.pt"))[-1] == "step-000000010.pt"


def test_nothing_is_downloaded_into_the_hugging_face_cache(hf_runs: HfRuns) -> None:
    # HF_HUB_OFFLINE and local_files_only: the runs read models/tiny alone
    cache = hf_runs.project.parent / "hf-home"
    assert not list(cache.rglob("*.safetensors")) and not list(cache.rglob("config.json"))


def test_windows_beyond_the_models_positions_are_refused_at_start_up_and_nothing_is_written(
    hf_runs: HfRuns, tmp_path: Path
) -> None:
    project = hf_project(tmp_path, hf_runs.model, block_size=POSITIONS * 2, devices_per_node=1)
    shutil.copytree(hf_runs.project / "data", project / "data")
    code, output = run_node(project, tmp_path / "run")
    assert code != 0
    assert f"block_size {POSITIONS * 2} is beyond the model's context" in output
    assert f"set training.block_size to {POSITIONS} or less" in output
    assert not list(project.glob("checkpoints/*.pt"))
