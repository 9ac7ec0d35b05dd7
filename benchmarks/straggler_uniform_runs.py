"""Uniform runs and the straggler detector: how many flags do N runs in a row raise? Goal: none.

Each run is the 2 x 2 CPU job of tests/test_stragglers.py (--nodes; shell launcher,
nodes simulated on 127.0.0.1, the default MLP, a window every 40 steps) under
`npu-wizard run --plain`, with no rank slowed: it trains for --seconds after
every rank logged its first windows, then is stopped (SIGTERM, which the runner takes as Ctrl-C), and its
summary.json's `stragglers` are read. Printed per run: the flags (who, gap,
how long), the windows judged and the spread of the ranks' compute time
around the median of the others (the share of rank-windows 15% or more
above it, and the 95th percentile), so a flag can be told apart from a
machine whose cores are unevenly loaded. The machine's load average is
printed with each run: on a small machine shared with other work, CPU ranks
are genuinely unequal, and the detector says so.

    python benchmarks/straggler_uniform_runs.py [--runs 10] [--seconds 60] [--nodes 2] [--keep DIR]
    python benchmarks/straggler_uniform_runs.py --smoke   # one short run, 1 x 2 (tests/test_benchmarks_smoke.py)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runtime.events import read_events  # noqa: E402
from tests.runs import clean_up, render_cpu, run_dirs, start_runner, wait_for  # noqa: E402
from wizard.monitor.stragglers import THRESHOLD, describe  # noqa: E402

JOB = {"samples": 1 << 20, "epochs": 1, "batch_size": 16, "log_every": 40, "checkpoint_every": 0}
# --smoke: 2048 steps a rank, more than it trains before it is stopped; making JOB's 1 << 20 samples takes each rank a
# CPU second
SMOKE_SAMPLES = 1 << 16
START_S = 400  # four torch processes and their first windows, on a loaded two-core machine


def timed_windows(run_dir: Path) -> dict[int, dict[int, float]]:
    """Each rank's compute time (data_s + forward_s) per logged step."""
    return {
        rank: {e["step"]: e["data_s"] + e["forward_s"] for e in events if e.get("event") == "step" and "forward_s" in e}
        for rank, events in read_events(run_dir).items()
    }


def spread(windows: dict[int, dict[int, float]]) -> tuple[int, float, float]:
    """(windows, share of rank-windows >= THRESHOLD above the others' median, 95th percentile gap)."""
    steps = sorted(set.intersection(*(set(by_step) for by_step in windows.values())))[1:]  # the warm-up left out
    gaps = []
    for step in steps:
        compute = {rank: by_step[step] for rank, by_step in windows.items()}
        for rank, value in compute.items():
            others = statistics.median(v for r, v in compute.items() if r != rank)
            gaps.append(value / others - 1)
    if not gaps:
        return 0, 0.0, 0.0
    gaps.sort()
    return len(steps), sum(gap >= THRESHOLD for gap in gaps) / len(gaps), gaps[int(0.95 * (len(gaps) - 1))]


def one_run(
    folder: Path, seconds: float, keep: Path | None = None, nodes: int = 2, samples: int = JOB["samples"]
) -> tuple[list[dict], int, float, float, float]:
    """Run the job once; (its flags, windows judged, share over the threshold, p95 gap, its end time)."""
    project = render_cpu(folder, "shell", nodes=nodes, **{**JOB, "samples": samples})
    ranks = 2 * nodes
    runner = start_runner(project, "--interval", "30")
    try:
        run_dir = wait_for(lambda: run_dirs(project), 60, "the run folder")[0]

        def ready() -> bool:
            windows = timed_windows(run_dir)
            return len(windows) == ranks and all(len(w) >= 2 for w in windows.values())

        wait_for(ready, START_S, "every rank's first windows", step=0.5)
        began = time.monotonic()
        wait_for(lambda: time.monotonic() - began >= seconds, seconds + 5, "the run's length", step=0.5)
        runner.send_signal(signal.SIGTERM)  # as Ctrl-C; a benchmark started with & ignores SIGINT, and so its runner
        runner.communicate(timeout=60)
    finally:
        clean_up(project, runner)
        for kept in run_dirs(project) if keep is not None else []:  # for a look after the temporary folder is gone
            shutil.copytree(kept, keep / folder.name, ignore=shutil.ignore_patterns("checkpoints"))
    summary = json.loads((run_dir / "summary.json").read_text())
    count, over, p95 = spread(timed_windows(run_dir))
    return summary["stragglers"], count, over, p95, summary["ended_at"]


def main() -> int:
    """Run the uniform job --runs times in a row and print the flags of each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=60.0, help="training time of each run after its start")
    parser.add_argument("--nodes", type=int, default=2, help="simulated nodes of 2 CPU ranks each")
    parser.add_argument("--keep", type=Path, help="copy each run folder (events, logs, summary) into this folder")
    parser.add_argument("--smoke", action="store_true", help="one short run: checks that it runs")
    args = parser.parse_args()
    if args.smoke:
        # a few windows of each rank: enough to print every figure; one node of 2 ranks, half the torch processes
        # of the 2 x 2 job training on the suite's two cores, judges the ranks against each other the same way;
        # a second after them is as good as three for that
        args.runs, args.seconds, args.nodes = 1, 1.0, 1
    samples = SMOKE_SAMPLES if args.smoke else JOB["samples"]
    flagged = done = 0
    with tempfile.TemporaryDirectory(prefix="npu-wizard-bench-") as folder:
        for run in range(1, args.runs + 1):
            load = os.getloadavg()[0]
            try:
                flags, windows, over, p95, ended_at = one_run(
                    Path(folder) / f"run-{run}", args.seconds, args.keep, args.nodes, samples
                )
            except AssertionError as error:  # a start too slow for the machine's load: no figure, say so
                print(f"run {run}: not counted, {error} (load {load:.1f})", flush=True)
                continue
            done += 1
            flagged += bool(flags)
            print(
                f"run {run}: {len(flags)} flag(s), {windows} windows, load {load:.1f}, "
                f"rank-windows >= {THRESHOLD:.0%} above the others: {over:.0%}, p95 gap {p95:+.0%}",
                flush=True,
            )
            for entry in flags:
                print(f"  {describe(entry, until=ended_at)}", flush=True)
    verdict = "meets" if flagged == 0 else "MISSES"
    print(f"uniform runs with a flag: {flagged} of {done}  {verdict} the goal of none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
