"""Tokens/s of the generated `gpt` training loop against a bare loop of the same model, in one run.

Both run in this process on the CPU, one after the other, on the same token
file (seeded sentences, tokenized by the rendered project's own
prepare_data.py), with the same model (the tiny gpt of the rendered model.py:
2 layers, 2 heads, width 64, block_size 64), batch (32 windows of 65 tokens:
64 inputs, the targets shifted by one; tokens/s counts the inputs, as the
project's own step events do),
AdamW (the model's configure_optimizer: betas 0.9/0.95, weight decay 0.1 on
the matrices), seed and number of steps:

- generated: the rendered train.py's own Trainer, imported from the rendered
  folder, built as its main() builds it (load_train_data, build_model, its
  learning-rate schedule, the real EventWriter with its heartbeat thread,
  the step timer as a run has it), in a gloo process group of one as a
  launched run is. Rendered with training.eval_every 0 and
  training.checkpoint_every 0 (no validation, no mid-run checkpoints) and
  grad_accum 1; everything else is the gpt answers' defaults, so its step
  includes what a user's step includes: the memory-mapped windows cut per
  batch, the learning rate set every step, gradient clipping at 1.0 (the gpt
  default), the loss read, printed (here to /dev/null) and written as a step
  event every LOG_EVERY=10 steps, and the stop check (a no-op in a group of
  one). Its step events give the timestamps (the wall clock and this
  process's CPU time, noted as each is written): from the one at the end of
  the warm-up steps to the last, so the end-of-run checkpoint is not timed.
- bare: a loop written here: train.bin read whole into a tensor, cut into the
  the same windows, in the same seeded order; per step
  index_select the batch, forward, cross-entropy, backward, step, zero_grad:
  nothing else. Timed from the end of its warm-up steps to a loss read after
  its last step.

Left in, in the bare loop's favour: the generated loop's gradient clipping,
its per-batch read from the memory map and its event stream. Each contender
starts from a fresh model and optimizer every round and warms up for
--warmup steps first; an untimed round of both comes before the timed ones
(not with --smoke). The contenders alternate in the order they run over
--repeat rounds; the median and range of each, and the ratio of the medians,
are printed, with the range of the ratio within a round. The target is on
tokens/s by the wall clock; tokens per second of this process's CPU time are
printed beside it, because on a loaded machine other processes' share of the
cores swings the wall clock far more than the loops differ (one thread each,
so on a quiet machine the two agree). The figures are only printed: whether
the generated loop reaches 0.97x the bare one is said, not asserted.

Threads: OMP_NUM_THREADS and torch's intra-op threads are --threads (default
1): on a small shared machine more threads than free cores would time the
scheduler, not the loop.

    python benchmarks/gpt_throughput.py [--repeat 5] [--steps 200] [--threads 1]
    python benchmarks/gpt_throughput.py --smoke   # tiny sizes: does it run? (tests/test_benchmarks_smoke.py)
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.training_throughput import group_of_one  # noqa: E402

TARGET = 0.97
WARMUP_STEPS = 20
STEPS = 200
SMOKE_WARMUP_STEPS = 10  # --smoke: the first step event after them starts the clock
SMOKE_STEPS = 10  # --smoke: timed from that step event to the next one (LOG_EVERY steps)


def render_project(folder: Path) -> Path:
    """Render the tiny gpt on token data, one CPU process, no validation and no mid-run checkpoints."""
    from wizard.answers.model import resolve
    from wizard.render.render import render

    answers = {
        "project_name": "gpt-bench",
        "device": "cpu",
        "amp": "off",
        "nodes": 1,
        "devices_per_node": 1,
        "network.host_ips": ["127.0.0.1"],
        "training.model": "gpt",
        "training.gpt_size": "tiny",
        "training.dataset": "tokens",
        "training.grad_accum": 1,
        "training.eval_every": 0,
        "training.checkpoint_every": 0,
    }
    return render(resolve(answers), folder).project_dir


def prepare_tokens(project: Path, text_dir: Path, tokens: int) -> None:
    """Seeded sentences, about `tokens` bytes of training text, tokenized by the project's prepare_data.py."""
    rng = random.Random(7)
    subjects = ["the cat", "a dog", "my friend", "the old man", "our teacher", "the small bird"]
    verbs = ["sees", "likes", "follows", "finds", "watches", "hears"]
    objects = ["the red ball", "a green tree", "the river", "a quiet house", "the long road", "some bread"]
    text_dir.mkdir()
    per_part = tokens // 4 + 1
    for part in range(4):
        lines, size = [], 0
        while size < per_part / 0.9:  # prepare_data.py keeps a tenth of each document for val.bin
            lines.append(f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}.")
            size += len(lines[-1]) + 1
        (text_dir / f"part{part}.txt").write_text("\n".join(lines) + "\n")
    done = subprocess.run(
        [sys.executable, "prepare_data.py", str(text_dir)], cwd=project, capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        raise RuntimeError(f"prepare_data.py exited {done.returncode}:\n{done.stdout}{done.stderr}")


def load_train_module(project: Path) -> ModuleType:
    """Import a rendered train.py, with its own runtime/ copy and model.py, as a module."""
    for name in [name for name in sys.modules if name in ("runtime", "model") or name.startswith("runtime.")]:
        del sys.modules[name]
    sys.path.insert(0, str(project))
    spec = importlib.util.spec_from_file_location("rendered_train", project / "train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Rate:
    """Tokens/s of one timed stretch, by the wall clock and by this process's CPU time."""

    wall: float
    cpu: float


class StepClock:
    """The Trainer's EventWriter, with the wall and CPU time noted as each step event is written."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer
        self.marks: list[tuple[int, float, float]] = []  # step, perf_counter, process_time

    def step_done(self, **fields: Any) -> None:
        """Note the times, then write the event."""
        self.marks.append((fields["step"], time.perf_counter(), time.process_time()))
        self.writer.step_done(**fields)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.writer, name)


def tokens_per_step(train: ModuleType) -> int:
    """Input tokens of one optimizer step: the batch of windows times their length."""
    return train.BATCH_SIZE * train.GRAD_ACCUM * train.BLOCK_SIZE


def generated_rate(train: ModuleType, scratch: Path, warmup: int, steps: int) -> Rate:
    """Tokens/s of the rendered Trainer between its step events after `warmup` and after `warmup + steps`."""
    rank = train.distributed.RankInfo(0, 0, 1, 1, 0, "torchrun")
    target = torch.device("cpu")
    torch.manual_seed(train.SEED)
    train_data, spec = train.load_train_data(rank, target)
    model = train.build_model(spec).to(target)
    lr_schedule = train.learning_rate(1, len(train_data), warmup + steps)
    optimizer = model.configure_optimizer(lr_schedule.lr_at(0))
    run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=scratch))
    recorder = StepClock(train.events.EventWriter(run_dir, 0))
    recorder.started(local_rank=0, node=0, device=str(target), world_size=1, launcher="torchrun")
    recorder.start_heartbeat(train.events.heartbeat_interval())
    # the end-of-run checkpoint comes after the last timed step event; tmpfs keeps it short
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else scratch
    with tempfile.TemporaryDirectory(prefix="npu-wizard-bench-", dir=shm) as checkpoints:
        trainer = train.Trainer(
            model, train_data, None, optimizer, lr_schedule, rank, target, recorder, Path(checkpoints)
        )
        with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
            trainer.train(1, warmup + steps)
    recorder.close()
    timed = [mark for mark in recorder.marks if mark[0] >= warmup]
    if trainer.step != warmup + steps or timed[0][0] != warmup or timed[-1][0] != warmup + steps:
        raise RuntimeError(f"the Trainer ran {trainer.step} steps, step events at {[mark[0] for mark in timed]}")
    (first, wall, cpu), (last, wall_end, cpu_end) = timed[0], timed[-1]
    tokens = (last - first) * tokens_per_step(train)
    return Rate(tokens / (wall_end - wall), tokens / (cpu_end - cpu))


def bare_rate(train: ModuleType, warmup: int, steps: int) -> Rate:
    """Tokens/s of a plain loop over the same model class, windows, batch and optimizer: nothing else."""
    meta = train.tokens.read_meta(train.DATA_DIR)
    block, batch = train.BLOCK_SIZE, train.BATCH_SIZE
    stream = torch.from_numpy(np.fromfile(train.DATA_DIR / "train.bin", dtype=meta.dtype).astype(np.int64))
    count = (len(stream) - 1) // block
    windows = stream[: count * block + 1].unfold(0, block + 1, block)  # overlapping by one token
    generator = torch.Generator().manual_seed(train.SEED)
    order = torch.randperm(count, generator=generator)[: (warmup + steps) * batch].view(warmup + steps, batch)
    torch.manual_seed(train.SEED)
    config = train.GPTConfig(meta.vocab_size, block, train.N_LAYER, train.N_HEAD, train.N_EMBD, train.DROPOUT)
    model = train.GPT(config)
    optimizer = model.configure_optimizer(train.learning_rate(1, count // batch, warmup + steps).lr_at(0))

    def step(index: torch.Tensor) -> torch.Tensor:
        rows = windows.index_select(0, index)
        loss = F.cross_entropy(model(rows[:, :-1]).flatten(0, 1), rows[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    for index in order[:warmup]:
        loss = step(index)
    loss.item()
    wall, cpu = time.perf_counter(), time.process_time()
    for index in order[warmup:]:
        loss = step(index)
    loss.item()
    tokens = steps * tokens_per_step(train)
    return Rate(tokens / (time.perf_counter() - wall), tokens / (time.process_time() - cpu))


def spread(values: list[float]) -> str:
    """Median and range of `values`."""
    return f"{statistics.median(values):>9,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def measure(args: argparse.Namespace, train: ModuleType, scratch: Path) -> dict[str, list[Rate]]:
    """Both loops --repeat times, alternating which goes first, after an untimed round (not with --smoke)."""
    runs = {
        "generated": lambda: generated_rate(train, scratch, args.warmup, args.steps),
        "bare": lambda: bare_rate(train, args.warmup, args.steps),
    }
    rates: dict[str, list[Rate]] = {name: [] for name in runs}
    with group_of_one():
        if not args.smoke:
            for run in runs.values():  # first allocations, page cache
                run()
        for attempt in range(args.repeat):
            for name in list(runs)[:: 1 if attempt % 2 == 0 else -1]:
                rate = runs[name]()
                rates[name].append(rate)
                print(
                    f"  round {attempt + 1}: {name:<9} {rate.wall:>9,.0f} tokens/s, {rate.cpu:>9,.0f} by CPU time",
                    flush=True,
                )
    return rates


def print_report(args: argparse.Namespace, train: ModuleType, rates: dict[str, list[Rate]]) -> None:
    """Each loop's median and range, the ratios and the verdict."""
    print(
        f"\ntokens/s, median of {args.repeat} (range); gpt tiny ({train.N_LAYER} layers, {train.N_HEAD} heads, "
        f"width {train.N_EMBD}), block {train.BLOCK_SIZE}, batch {train.BATCH_SIZE}, {args.warmup} warm-up + "
        f"{args.steps} timed steps, OMP_NUM_THREADS={args.threads}, {os.cpu_count()} cores"
    )
    print(f"{'':36}{'wall clock':>30}{'CPU time':>30}")
    ratios: dict[str, tuple[float, float, float]] = {}
    for name, label in (("generated", "generated loop (train.py Trainer)"), ("bare", "bare loop (same model, AdamW)")):
        print(f"{label:<36}{spread([r.wall for r in rates[name]]):>30}{spread([r.cpu for r in rates[name]]):>30}")
    for clock in ("wall", "cpu"):
        medians = [statistics.median(getattr(rate, clock) for rate in rates[name]) for name in ("generated", "bare")]
        rounds = [getattr(g, clock) / getattr(b, clock) for g, b in zip(rates["generated"], rates["bare"], strict=True)]
        ratios[clock] = (medians[0] / medians[1], min(rounds), max(rounds))
    cells = [f"{median:.3f}x (rounds {low:.3f}-{high:.3f})" for median, low, high in ratios.values()]
    print(f"{'generated / bare, ratio of medians':<36}{cells[0]:>30}{cells[1]:>30}")
    verdicts = {clock: "yes" if ratio[0] >= TARGET else "no" for clock, ratio in ratios.items()}
    print(f"at least {TARGET}x: {verdicts['wall']} (wall clock); by CPU time: {verdicts['cpu']}")


def main() -> int:
    """Render, prepare the tokens, time both loops, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--warmup", type=int, default=WARMUP_STEPS, help="untimed steps first (a multiple of 10, at least 10)"
    )
    parser.add_argument("--steps", type=int, default=STEPS, help="timed steps (a multiple of 10)")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS and torch's intra-op threads")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes, one round: checks that every part runs and prints (seconds; the figures mean nothing)",
    )
    args = parser.parse_args()
    if args.smoke:
        args.repeat, args.warmup, args.steps = 1, SMOKE_WARMUP_STEPS, SMOKE_STEPS
    began = time.perf_counter()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="npu-wizard-bench-") as folder:
        scratch = Path(folder)
        project = render_project(scratch)
        train = load_train_module(project)
        if args.warmup < train.LOG_EVERY or args.warmup % train.LOG_EVERY or args.steps % train.LOG_EVERY:
            parser.error(f"--warmup and --steps must be positive multiples of LOG_EVERY ({train.LOG_EVERY})")
        # one epoch holds every step, with a tenth to spare: no epoch end inside the timed steps
        prepare_tokens(project, scratch / "text", int((args.warmup + args.steps) * tokens_per_step(train) * 1.1))
        rates = measure(args, train, scratch)
    print_report(args, train, rates)
    print(f"\ntotal {time.perf_counter() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
