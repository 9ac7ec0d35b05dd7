"""What the flight recorder costs the training loop: step time with it on and off, A/B pairs of runs.

At a hang the runner reads each rank's last collectives from torch's flight
recorder (runtime/stacks.py), which records only when TORCH_FR_BUFFER_SIZE is
set before the process group is made (RECORDER_ENTRIES: 2000 entries, a ring).
torch reads that variable once per process, so each trial is a process of its
own: the rendered CPU demo's own Trainer (the default MLP on synthetic data,
batch 32: the shortest steps, the largest relative cost) in a gloo group of
two processes (rank 0 measured), whose DDP all_reduces every step, for one epoch of --trial-samples, with
TORCH_FR_BUFFER_SIZE=2000 (on) or 0 (off); the two alternate, and each trial
checks that the recorder held entries exactly when on. The cost is the median
over adjacent pairs of (step on / step off - 1), in CPU time and in wall time.

    python benchmarks/recorder_cost.py [--pairs 8]
    python benchmarks/recorder_cost.py --smoke   # tiny sizes: does it run? (tests/test_benchmarks_smoke.py)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
TRIAL_SAMPLES = 16384  # one epoch of 512 steps
SMOKE_SAMPLES = 512
TARGET = 0.01  # "no measurable slowdown": under 1% of the step


def trial(project: Path, recorder_on: bool, samples: int) -> dict[str, float]:
    """One epoch in two fresh processes (a gloo group of two) with the recorder on or off: rank 0's step."""
    from training_throughput import free_port

    base = {**os.environ, "TORCH_FR_BUFFER_SIZE": "2000" if recorder_on else "0", "OMP_NUM_THREADS": "1"}
    base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2")
    ranks = [
        subprocess.Popen(
            [sys.executable, __file__, "--trial", str(project), "--trial-samples", str(samples)],
            env={**base, "RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    said = [rank.communicate(timeout=1200) for rank in ranks]
    for rank, (out, err) in zip(ranks, said, strict=True):
        if rank.returncode != 0:
            raise SystemExit(f"a trial failed:\n{out[-3000:]}{err[-3000:]}")
    return json.loads(said[0][0].strip().splitlines()[-1])


def trainer_epoch(train: ModuleType, scratch: Path, samples: int) -> tuple[float, float, int]:
    """(wall, CPU seconds, steps) of one epoch of the rendered Trainer, this process one rank of a group of two."""
    import torch

    rank = torch.distributed.get_rank()
    features, labels = train.data.synthetic_tensors(samples, train.INPUT_SHAPE, 10, train.SEED)
    batches = train.data.TensorBatches(features, labels, 32, rank=rank, world_size=2, seed=train.SEED)
    torch.manual_seed(train.SEED)
    model = train.build_model(train.data.DataSpec(train.INPUT_SHAPE, 10))
    lr_schedule = train.learning_rate(2, len(batches), len(batches) * train.EPOCHS)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr_schedule.lr_at(0), momentum=0.9)
    writer = train.events.EventWriter(scratch / "run", rank)
    where = train.distributed.RankInfo(rank, rank, 2, 2, 0, "torchrun")
    trainer = train.Trainer(model, batches, None, optimizer, lr_schedule, where, torch.device("cpu"), writer, scratch)
    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
        wall, cpu = time.perf_counter(), time.process_time()
        trainer.train(1, 0)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    writer.close()
    return wall, cpu, len(batches)


def run_trial(project: Path, samples: int) -> None:
    """In a trial's rank: one Trainer epoch; print wall and CPU seconds per step, and the recorder's count."""
    import torch

    sys.path.insert(0, str(HERE))
    from training_throughput import load_train_module

    torch.set_num_threads(1)
    train = load_train_module(project)
    train.stacks.enable_recorder()  # as the rank does: only where the user set no size
    torch.distributed.init_process_group("gloo", init_method="env://")
    try:
        with tempfile.TemporaryDirectory(prefix="npu-wizard-bench-") as scratch:
            wall, cpu, steps = trainer_epoch(train, Path(scratch), samples)
        collectives, _ = train.stacks.recorder_entries()
    finally:
        torch.distributed.destroy_process_group()
    recorded = collectives.get("last_entered") or 0  # the newest collective's sequence number
    on = os.environ["TORCH_FR_BUFFER_SIZE"] != "0"
    assert (recorded > steps) == on, f"the recorder must hold every step's all_reduce exactly when on: {recorded}"
    print(json.dumps({"wall": wall / steps, "cpu": cpu / steps, "recorded": recorded}))


def main() -> int:
    """Render the CPU demo, run the A/B pairs, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=8, help="A/B pairs of trials")
    parser.add_argument("--trial-samples", type=int, default=TRIAL_SAMPLES)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks that it runs (figures mean nothing)")
    parser.add_argument("--trial", metavar="PROJECT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trial:
        run_trial(Path(args.trial), args.trial_samples)
        return 0
    if args.smoke:
        args.pairs, args.trial_samples = 1, SMOKE_SAMPLES
    sys.path.insert(0, str(HERE))
    from training_throughput import render_project

    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="npu-wizard-bench-") as folder:
        project = render_project(Path(folder) / "demo", 1, args.trial_samples, 1)
        wall, cpu, off_steps = [], [], []
        for pair in range(args.pairs):
            order = (True, False) if pair % 2 == 0 else (False, True)
            got = {on: trial(project, on, args.trial_samples) for on in order}
            wall.append(got[True]["wall"] / got[False]["wall"] - 1)
            cpu.append(got[True]["cpu"] / got[False]["cpu"] - 1)
            off_steps.append(got[False]["cpu"])
    print(f"CPU demo Trainer (MLP, batch 32, gloo group of two, DDP), {args.pairs} A/B pairs of one-epoch trials")
    print(f"  step, recorder off (median, CPU time)  {statistics.median(off_steps) * 1e6:10.1f} us")
    print(f"  collectives recorded per trial (on)    {got[True]['recorded']:10d} (the ring keeps the newest 2000)")
    for label, values in (("A/B, CPU time, median of pairs", cpu), ("A/B, wall time, median of pairs", wall)):
        median = statistics.median(values)
        verdict = "within" if median < TARGET else "OVER"
        print(
            f"  {label:<38}{median * 100:+9.2f}%  (pairs {min(values) * 100:+.1f}% .. {max(values) * 100:+.1f}%)"
            f"  {verdict} the 1% goal"
        )
    print(f"total {time.perf_counter() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
