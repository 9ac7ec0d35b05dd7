"""Memory per rank, for real (issue 39): the estimate against what real CPU runs measure, and a rank out of memory.

Two runs of the gpt model through `npu-wizard run` (1 node x 2 ranks, the shell launcher, gloo), the tiny and the small
preset, a few steps each, and one MLP run whose rank 1 runs out of memory for real (a test double,
tests/doubles/out_of_memory, caps its address space and allocates past it). On the CPU there is no allocator to
ask for a peak of tensors, so the measured peak is what the ranks hold, counted exactly: the parameters,
gradients and optimizer state each rank reports in its step events (runtime/memory.py counts them tensor by
tensor), plus the activations the generated model.py saves for its backward at that batch (counted with
torch.autograd.graph.saved_tensors_hooks). The ranks' peak RSS is reported beside it, named as such: it counts
torch itself, so it is no measure of the tensors.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runs import RunEnded, clean_up, events_of, kinds, node_env, render_cpu, run_dirs, run_to_its_end
from tests.test_gpt_runs import write_text_folder
from wizard.answers.model import load_text
from wizard.memory.estimate import estimate, gib

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("memory-runs")]

PRESETS = {
    # batch, steps and logging: a handful of windows, seconds of CPU each
    "tiny": {"batch_size": 8, "max_steps": 8, "log_every": 4},
    "small": {"batch_size": 2, "max_steps": 4, "log_every": 2},
}
TOLERANCE = 0.25
# a sitecustomize that makes one rank run out of memory for real (nothing of it ships in a project)
OUT_OF_MEMORY = Path(__file__).resolve().parent / "doubles" / "out_of_memory"


def gpt_project(root: Path, text: Path, size: str) -> Path:
    """A 1 x 2 CPU project (the shell launcher) of the gpt `size` preset, its tokens prepared from `text`."""
    answers = {"model": "gpt", "dataset": "tokens", "gpt_size": size, "epochs": 1, "lr": 0.001, **PRESETS[size]}
    project = render_cpu(root, "shell", checkpoint_every=0, **answers)
    prepared = subprocess.run(
        [sys.executable, "prepare_data.py", str(text)], cwd=project, capture_output=True, text=True, timeout=60
    )
    assert prepared.returncode == 0, prepared.stderr
    return project


@pytest.fixture(scope="module")
def gpt_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, RunEnded]:
    """The tiny and the small preset, each run to its end."""
    text = write_text_folder(tmp_path_factory.mktemp("text") / "corpus")
    return {
        size: run_to_its_end(gpt_project(tmp_path_factory.mktemp(f"gpt-{size}"), text, size), "--interval", "2")
        for size in PRESETS
    }


def saved_activation_bytes(project: Path, batch: int) -> int:
    """Bytes the project's own model.py saves for the backward of one training forward at `batch`."""
    import torch

    spec = importlib.util.spec_from_file_location(f"model_{project.name}", project / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    answers = load_text((project / "answers.yaml").read_text())
    from wizard.answers.language_model import shape_from_answers

    shape = shape_from_answers(answers.values)
    config = module.GPTConfig(257, shape.block_size, shape.n_layer, shape.n_head, shape.n_embd, shape.dropout)
    torch.manual_seed(0)
    model = module.GPT(config).train()
    tokens = torch.randint(0, 257, (batch, shape.block_size))
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        module.next_token_loss(model(tokens), tokens)
    return sum(size for pointer, size in saved.items() if pointer not in weights)


def test_each_logged_step_carries_the_ranks_peak_and_the_bytes_it_holds(gpt_runs: dict[str, RunEnded]) -> None:
    run = gpt_runs["tiny"]
    assert run.code == 0, run.stdout + run.stderr
    for rank, events in events_of(run.run_dir).items():
        steps = kinds(events, "step")
        assert [event["step"] for event in steps] == [4, 8], rank
        for event in steps:
            assert event["memory_peak_of"] in ("peak RSS, this window", "peak RSS since start")
            assert event["memory_peak_bytes"] > event["memory_state_bytes"] > 0
    assert "memory (peak RSS" in run.stdout and "highest per rank: rank 0" in run.stdout


@pytest.mark.parametrize("size", list(PRESETS))
def test_the_estimate_is_within_a_quarter_of_the_measured_peak(gpt_runs: dict[str, RunEnded], size: str) -> None:
    run = gpt_runs[size]
    assert run.code == 0, run.stdout + run.stderr
    answers = load_text((run.project / "answers.yaml").read_text())
    guess = estimate(answers.values)
    held = {rank: kinds(events, "step")[-1]["memory_state_bytes"] for rank, events in events_of(run.run_dir).items()}
    activations = saved_activation_bytes(run.project, PRESETS[size]["batch_size"])
    measured = held[0] + activations
    rss = max(kinds(events_of(run.run_dir)[0], "step")[-1]["memory_peak_bytes"], 1)
    figures = (
        f"{size}: estimate {guess.total:,} B ({gib(guess.total)}: state {guess.total - guess.activations:,}, "
        f"activations {guess.activations:,}); measured {measured:,} B ({gib(measured)}: state {held[0]:,}, "
        f"activations {activations:,}); rank 0's peak RSS {rss:,} B ({gib(rss)}, the whole process)"
    )
    print(figures)
    assert held[0] == held[1]  # ddp: every rank holds the same
    assert abs(guess.total - guess.activations - held[0]) <= TOLERANCE * held[0], figures
    assert abs(guess.activations - activations) <= TOLERANCE * activations, figures
    assert abs(guess.total - measured) <= TOLERANCE * measured, figures
    assert rss > held[0]  # RSS holds the tensors and torch itself


@pytest.fixture(scope="module")
def out_of_memory(tmp_path_factory: pytest.TempPathFactory) -> RunEnded:
    """An MLP run (1 x 2) whose rank 1 runs out of memory for real at its second logged step."""
    project = render_cpu(tmp_path_factory.mktemp("oom"), "shell", log_every=4)
    env = node_env(
        project / "runs" / "unused",
        PYTHONPATH=os.pathsep.join(filter(None, [str(OUT_OF_MEMORY), os.environ.get("PYTHONPATH")])),
        NPU_WIZARD_TEST_OOM_AT_STEP="8",
        NPU_WIZARD_TEST_OOM_RANK="1",
        NPU_WIZARD_TEST_OOM_LIMIT_BYTES=str(64 * 2**20),
    )
    runner = subprocess.Popen(
        [sys.executable, "-m", "wizard", "run", str(project), "--plain", "--interval", "2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = runner.communicate(timeout=300)
    finally:
        clean_up(project, runner)
    (run_dir,) = run_dirs(project)
    return RunEnded(project, run_dir, runner.returncode, stdout, stderr, [])


def test_a_rank_out_of_memory_is_the_root_cause_with_its_peak_the_estimate_and_what_lowers_it(
    out_of_memory: RunEnded,
) -> None:
    run = out_of_memory
    said = run.stdout + run.stderr
    assert run.code == 3, said
    assert "root cause: rank 1 (node 0): MemoryError" in said
    assert "hint: out of memory: the rank ran out of memory" in said
    assert "rank 1's last logged peak: " in said and "at step 4 (peak RSS" in said
    assert "the estimate for this run: " in said and "(MLP, ddp on 2 ranks), of " in said
    # the estimate fits this host: the real peak was higher, and the changes that lower it most are named
    assert "the estimate fits, so the real peak was higher than estimated; these lower it most: " in said
    assert "training.parallelism: fsdp2 (" in said and "(the same global batch)" in said
