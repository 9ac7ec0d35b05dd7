"""What does `report.step` cost a user's own training loop? The same CPU demo loop with and without it, in one run.

The loop is the CPU demo's step (examples/cpu-demo.yaml: the MLP, 64 features,
batch 32, SGD with momentum) written as a user writes it. Epochs alternate
between the bare loop and the same loop calling `report.step(step, loss=loss,
samples=32)` once per step under an open EventWriter (a real events file,
heartbeats on: what runtime.userscript sets up), so both see the same machine.
The figures: the time spent inside the calls, timed in the loop, per call and
as a share of a step (the target: under 2%, the budget of the generated
train.py's event stream); the wall and CPU time of the epochs with the calls
against bare ones (median of rounds); and, beside it, bare against bare, the
noise floor of a busy machine, which the A/B difference must be read against.

    python benchmarks/report_hook_overhead.py [--rounds 12] [--samples 8192]
    python benchmarks/report_hook_overhead.py --smoke   # tiny (tests/test_benchmarks_smoke.py)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from runtime import events, report  # noqa: E402

BATCH_SIZE = 32  # the CPU demo's
FEATURES, CLASSES = 64, 10
TARGET = 0.02


def demo_model() -> nn.Module:
    """The CPU demo's MLP."""
    return nn.Sequential(
        nn.Flatten(), nn.Linear(FEATURES, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, CLASSES)
    )


def epoch(samples: int, reporting: bool) -> tuple[float, float, float, int]:
    """(wall, CPU, seconds inside report.step, steps) of one epoch of `samples`."""
    torch.manual_seed(0)
    features, labels = torch.randn(samples, FEATURES), torch.randint(0, CLASSES, (samples,))
    model = demo_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    inside, steps = 0.0, 0
    wall, cpu = time.perf_counter(), time.process_time()
    for start in range(0, samples - BATCH_SIZE + 1, BATCH_SIZE):
        inputs, targets = features[start : start + BATCH_SIZE], labels[start : start + BATCH_SIZE]
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
        steps += 1
        if reporting:
            called = time.perf_counter()
            report.step(steps, loss=loss, samples=BATCH_SIZE)
            inside += time.perf_counter() - called
    return time.perf_counter() - wall, time.process_time() - cpu, inside, steps


def measure(samples: int, rounds: int, scratch: Path) -> dict[str, float]:
    """A/B and A/A rounds and the in-loop timing, with an EventWriter open as under the shim.

    Each round runs three epochs in a rotating order: with the calls, bare, and
    bare again; the bare-to-bare difference is the machine's noise floor.
    """
    writer = events.EventWriter(scratch, 0)
    writer.started(local_rank=0, node=0, device="cpu", world_size=1)
    writer.start_heartbeat(events.heartbeat_interval())
    modes = ("report", "bare", "again")
    try:
        epoch(samples, True)  # warm-up
        figures: dict[str, list[float]] = {name: [] for name in ("wall", "cpu", "noise_wall", "noise_cpu")}
        share, per_call, step_s = [], [], []
        for round_ in range(rounds):
            order = modes[round_ % 3 :] + modes[: round_ % 3]
            timed = {mode: epoch(samples, mode == "report") for mode in order}
            (with_wall, with_cpu, inside, steps), bare = timed["report"], timed["bare"]
            figures["wall"].append(with_wall / bare[0] - 1)
            figures["cpu"].append(with_cpu / bare[1] - 1)
            figures["noise_wall"].append(timed["again"][0] / bare[0] - 1)
            figures["noise_cpu"].append(timed["again"][1] / bare[1] - 1)
            share.append(inside / with_wall)
            per_call.append(inside / steps)
            step_s.append(bare[0] / steps)
        written = len(events.read_rank_events(writer.path))
    finally:
        writer.close()
    found = {name: statistics.median(values) for name, values in figures.items()}
    return {
        **found,
        "share": statistics.median(share),
        "per_call_s": statistics.median(per_call),
        "step_s": statistics.median(step_s),
        "events": written,
    }


def main() -> int:
    """Measure and print the overhead per step and as a share of a step."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12, help="rounds of three epochs: report, bare, bare again")
    parser.add_argument("--samples", type=int, default=8192, help="samples per epoch (the demo has 4096 x 2 epochs)")
    parser.add_argument("--smoke", action="store_true", help="tiny: checks that it runs (the figures mean nothing)")
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.samples = 1, 512
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="npu-wizard-bench-") as folder:
        found = measure(args.samples, args.rounds, Path(folder))
    verdict = "meets" if found["share"] < TARGET else "MISSES"
    print(f"CPU demo step, bare loop: {found['step_s'] * 1e6:,.0f} us (median of {args.rounds} epochs)")
    print(f"report.step per call, timed in the loop: {found['per_call_s'] * 1e6:.2f} us")
    print(f"time inside report.step, share of a step: {found['share'] * 100:.3f}%  {verdict} the < 2% target")
    print(f"A/B, wall time, median of rounds: {found['wall'] * 100:+.2f}%")
    print(f"A/B, CPU time, median of rounds: {found['cpu'] * 100:+.2f}%")
    print(
        f"A/A noise floor (bare vs bare): wall {found['noise_wall'] * 100:+.2f}%, CPU {found['noise_cpu'] * 100:+.2f}%"
    )
    print(f"events written (throttled to one step event per {report.DEFAULT_REPORT_S:g}s): {found['events']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
