"""What does a profile window (`npu-wizard run --profile A:B`) cost the steps outside it? One run, on and off.

The loop is the CPU demo's step (examples/cpu-demo.yaml: the MLP, 64 features,
batch 32, SGD with momentum) calling `profile_window.step(step)` after each
step, as the generated train.py does, under an open EventWriter. Rounds
alternate between profiling off (no NPU_WIZARD_PROFILE: the call returns at
once) and a window in the middle of the steps (torch.profiler, CPU activities,
its wait and warm-up step before it). Each step is timed; the figures compare,
step for step, the median time of:

- the steps before the profiler starts and after the window (the trace written):
  the cost outside the window, which should be none;
- the step whose end writes the trace (the chrome trace JSON export);
- the window's own steps (recorded: the profiler's cost while on).

against the same steps of the rounds with profiling off; beside them, the
off rounds against each other (the noise floor of a busy machine).

    python benchmarks/profile_overhead.py [--rounds 6] [--steps 300] [--window 100:120]
    python benchmarks/profile_overhead.py --smoke   # tiny (tests/test_benchmarks_smoke.py)
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from runtime import events, profile_window  # noqa: E402

BATCH_SIZE = 32  # the CPU demo's
FEATURES, CLASSES = 64, 10


def demo_model() -> nn.Module:
    """The CPU demo's MLP."""
    return nn.Sequential(
        nn.Flatten(), nn.Linear(FEATURES, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, CLASSES)
    )


def arm(window: str | None) -> None:
    """Profiling on with `window` (A:B, every rank), or off; the module reads its variables when loaded."""
    os.environ.pop(profile_window.ENV_PROFILE, None)
    os.environ.pop(profile_window.ENV_PROFILE_RANKS, None)
    if window is not None:
        os.environ[profile_window.ENV_PROFILE] = window
        os.environ[profile_window.ENV_PROFILE_RANKS] = "all"
    importlib.reload(profile_window)


def one_run(steps: int, run_dir: Path) -> list[float]:
    """Seconds of each step (the step call included) of one run of `steps` steps."""
    torch.manual_seed(0)
    features, labels = torch.randn(steps * BATCH_SIZE, FEATURES), torch.randint(0, CLASSES, (steps * BATCH_SIZE,))
    model = demo_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    times = []
    writer = events.EventWriter(run_dir, 0)
    try:
        for step in range(1, steps + 1):
            started = time.perf_counter()
            batch = slice((step - 1) * BATCH_SIZE, step * BATCH_SIZE)
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(features[batch]), labels[batch]).backward()
            optimizer.step()
            profile_window.step(step)
            times.append(time.perf_counter() - started)
        profile_window.close()
    finally:
        writer.close()
    return times


def median_of(times: list[list[float]], steps: list[int]) -> float:
    """The median, over the runs, of each run's median time of `steps` (1-based), in milliseconds."""
    return 1000 * statistics.median(statistics.median(run[step - 1] for step in steps) for run in times)


def main() -> int:
    """Run the rounds and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--window", default="100:120")
    parser.add_argument("--smoke", action="store_true", help="tiny: 1 round of 40 steps, window 15:20")
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.steps, args.window = 1, 40, "15:20"
    torch.set_num_threads(1)  # one rank's share of a busy machine: no thread pool spinning against the others
    first, last = profile_window.parse_window(args.window)
    starts = first - profile_window.WAIT - profile_window.WARMUP  # the step whose end starts the profiler
    before = list(range(2, starts + 1))  # step 1 holds the model's first allocations
    window = list(range(first + 1, last))  # the last one's end writes the trace
    after = list(range(last + 1, args.steps + 1))
    off: list[list[float]] = []
    again: list[list[float]] = []
    on: list[list[float]] = []
    with tempfile.TemporaryDirectory() as scratch:
        arm(None)
        one_run(min(args.steps, 20), Path(scratch) / "warm-up")
        for index in range(args.rounds):
            for mode, into in (("off", off), ("on", on), ("again", again)):
                arm(args.window if mode == "on" else None)
                into.append(one_run(args.steps, Path(scratch) / f"{mode}-{index}"))
        arm(None)
        traces = list(Path(scratch).glob("on-*/profile/rank-0/*.pt.trace.json"))
        size = statistics.median(path.stat().st_size for path in traces) if traces else 0
    print(f"{args.rounds} round(s) of {args.steps} steps, window {args.window} (torch.profiler, CPU activities)")
    print(f"trace per window: {size / 1e6:.2f} MB (chrome trace JSON)")
    rows = [
        ("steps before the profiler starts", before),
        ("steps after the window", after),
        ("the step that writes the trace", [last]),
        ("the window's recorded steps", window),
    ]
    for name, steps in rows:
        if not steps:
            continue
        base, with_window, floor = median_of(off, steps), median_of(on, steps), median_of(again, steps)
        print(
            f"{name}: off {base:.3f} ms, with a window {with_window:.3f} ms ({with_window / base - 1:+.1%}); "
            f"off again {floor:.3f} ms ({floor / base - 1:+.1%}, the noise floor)"
        )
    outside = median_of(on, before + after) / median_of(off, before + after) - 1
    floor = median_of(again, before + after) / median_of(off, before + after) - 1
    print(f"outside the window: {outside:+.1%} against off (noise floor {floor:+.1%}); target: within the noise")
    return 0


if __name__ == "__main__":
    sys.exit(main())
