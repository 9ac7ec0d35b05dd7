"""What the straggler timing costs the CPU demo's training throughput: A/B in one run, goal < 1%.

The straggler timing (runtime/timing.py) times each batch's arrival and each
forward pass and adds `data_s` and `forward_s` to every step event. The
rendered CPU demo's own Trainer (the default MLP on synthetic data, batch 32:
the shortest steps, so the largest relative cost) is run in this process as a
gloo group of one, epochs of --trial-samples, alternately with the timing on
and off (NPU_WIZARD_STEP_TIMING=1 / 0, read when the Trainer is built; off,
the loop runs without the timers), with the real EventWriter in both. The
cost is the median over adjacent pairs of (time on / time off - 1), in this
process's CPU time and in wall time. A shared machine's load swings are about
as large as the effect, so the timer's own work is also measured directly:
its calls for one step (the batch's wrapper, the forward context, a share of
the window read) timed over many steps with no training around them, as a
share of the step, both in CPU time (which the machine's load does not
stretch).

    python benchmarks/straggler_timing_cost.py [--pairs 16]
    python benchmarks/straggler_timing_cost.py --smoke   # tiny sizes: does it run? (tests/test_benchmarks_smoke.py)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from training_throughput import BATCH_SIZE, group_of_one, load_train_module, render_project  # noqa: E402

TARGET = 0.01  # the goal: under 1% of training throughput
TRIAL_SAMPLES = 16384  # one epoch of 512 steps a trial: short, so load swings hit both modes alike
SMOKE_SAMPLES = 1024
MICRO_STEPS = 200_000  # steps of the timer alone, for its own cost


def trainer_epoch(train: ModuleType, scratch: Path, timed: bool, samples: int) -> tuple[float, float, int]:
    """(wall, CPU seconds, steps) of one Trainer epoch of `samples` with the straggler timing on or off."""
    features, labels = train.data.synthetic_tensors(samples, train.INPUT_SHAPE, 10, train.SEED)
    batches = train.data.TensorBatches(features, labels, BATCH_SIZE, rank=0, world_size=1, seed=train.SEED)
    torch.manual_seed(train.SEED)
    model = train.build_model(train.data.DataSpec(train.INPUT_SHAPE, 10))
    lr_schedule = train.learning_rate(1, len(batches), len(batches) * train.EPOCHS)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr_schedule.lr_at(0), momentum=0.9)
    writer = train.events.EventWriter(Path(tempfile.mkdtemp(prefix="events-", dir=scratch)), 0)
    os.environ[train.timing.ENV_STEP_TIMING] = "1" if timed else "0"
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else scratch
    with tempfile.TemporaryDirectory(prefix="npu-wizard-bench-", dir=shm) as checkpoints:
        rank = train.distributed.RankInfo(0, 0, 1, 1, 0, "torchrun")
        trainer = train.Trainer(
            model, batches, None, optimizer, lr_schedule, rank, torch.device("cpu"), writer, Path(checkpoints)
        )
        assert trainer.timer.enabled == timed
        with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
            wall, cpu = time.perf_counter(), time.process_time()
            trainer.train(1, 0)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    writer.close()
    timed_steps = sum(1 for line in writer.path.read_text().splitlines() if '"forward_s"' in line)
    assert (timed_steps > 0) == timed, "the step events must carry the times exactly when the timing is on"
    return wall, cpu, len(batches)


def timer_alone(train: ModuleType, steps: int) -> float:
    """CPU seconds per step of the timer's own calls, with no training around them."""
    timer = train.timing.StepTimer("cpu")
    log_every = train.LOG_EVERY
    started = time.process_time()
    for step, _batch in enumerate(timer.batches(range(steps)), start=1):
        with timer.forward():
            pass
        if step % log_every == 0:
            timer.window()
    return (time.process_time() - started) / steps


def main() -> int:
    """Render the CPU demo, run the A/B pairs, print the figures against the < 1% goal."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=16, help="A/B pairs of epochs")
    parser.add_argument("--trial-samples", type=int, default=TRIAL_SAMPLES)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks that it runs (figures mean nothing)")
    args = parser.parse_args()
    micro_steps = MICRO_STEPS
    if args.smoke:
        args.pairs, args.trial_samples, micro_steps = 1, SMOKE_SAMPLES, 2000
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="npu-wizard-bench-") as folder:
        scratch = Path(folder)
        train = load_train_module(render_project(scratch / "demo", 1, args.trial_samples, 1))
        with group_of_one():
            trainer_epoch(train, scratch, True, args.trial_samples)  # warm-up
            wall, cpu, step_s = [], [], []
            for pair in range(args.pairs):
                order = (True, False) if pair % 2 == 0 else (False, True)
                run = {timed: trainer_epoch(train, scratch, timed, args.trial_samples) for timed in order}
                wall.append(run[True][0] / run[False][0] - 1)
                cpu.append(run[True][1] / run[False][1] - 1)
                step_s.append(run[False][1] / run[False][2])
        alone = statistics.median(timer_alone(train, micro_steps) for _ in range(3))
    step = statistics.median(step_s)
    print(f"CPU demo Trainer (MLP, batch {BATCH_SIZE}, world size 1), {args.pairs} A/B pairs of epochs")
    print(f"  step, timing off (median, CPU time)   {step * 1e6:10.1f} us")
    print(f"  timer's own calls per step (CPU time) {alone * 1e6:10.2f} us")
    verdict = "meets" if alone / step < TARGET else "MISSES"
    print(f"  cost, timer alone / step              {alone / step * 100:+9.2f}%  {verdict} the < 1% goal")
    for label, values in (("A/B, CPU time, median of pairs", cpu), ("A/B, wall time, median of pairs", wall)):
        shown = (
            f"{statistics.median(values) * 100:+9.2f}%  (pairs {min(values) * 100:+.1f}% .. {max(values) * 100:+.1f}%)"
        )
        print(f"  {label:<38}{shown}")
    print(f"total {time.perf_counter() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
