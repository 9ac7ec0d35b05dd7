"""The run report at scale: `npu-wizard report` on a run folder of 4096 simulated ranks, against 16 in the same run.

The run folder holds what a run of status_stream_scale's simulated ranks leaves when node 0's runner records it:
per rank a `started` event (16 ranks per node), then per report interval a heartbeat and a step (loss, the job's
samples per second, learning rate, and the straggler timing `forward_s`/`data_s`), a checkpoint by each node's
local rank 0 every 100 steps, and `finished`; run.json and summary.json as the runner writes them, with one
straggling node. Each report runs as `npu-wizard report RUN` in a child process; the figures are its wall time
and its peak resident memory (VmHWM, read from /proc before it exits).

    python benchmarks/report_scale.py [--ranks 4096] [--steps 600] [--baseline-ranks 16]
    python benchmarks/report_scale.py --smoke   # 32 ranks, 40 steps (tests/test_benchmarks_smoke.py)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RANKS_PER_NODE = 16
INTERVAL_S = 1.0
GOAL_S, GOAL_MIB = 10.0, 200.0


def make_run(folder: Path, ranks: int, steps: int, *, start: float = 1.7e9) -> Path:
    """Write a finished run folder of `ranks` simulated ranks that logged `steps` steps each; return it."""
    events = folder / "events"
    events.mkdir(parents=True)
    nodes = max(1, -(-ranks // RANKS_PER_NODE))
    slow_node = nodes - 1 if nodes > 1 else None
    slow_from, slow_to = start + steps * 0.4 * INTERVAL_S, start + steps * 0.7 * INTERVAL_S
    for rank in range(ranks):
        node = rank // RANKS_PER_NODE
        lines = [
            f'{{"schema": 1, "event": "started", "time": {start + rank * 1e-4}, "rank": {rank}, '
            f'"local_rank": {rank % RANKS_PER_NODE}, "node": {node}, "host": "sim-{node}", '
            f'"device": "npu:{rank % RANKS_PER_NODE}", '
            f'"pid": {100000 + rank}, "world_size": {ranks}, "resumed_step": 0, "total_steps": {steps}}}'
        ]
        for step in range(1, steps + 1):
            at = start + step * INTERVAL_S + rank * 1e-4
            slow = node == slow_node and slow_from <= at <= slow_to
            forward = 0.010 * (1.4 if slow else 1.0) * (1 + 0.02 * math.sin(rank + step))
            loss = 2.3 * math.exp(-step / (steps / 3)) + 0.05 * math.sin(rank * 7 + step)
            lines.append(
                f'{{"schema": 1, "event": "heartbeat", "time": {at - 0.5}, "rank": {rank}, "step": {step}, "epoch": 0}}'
            )
            lines.append(
                f'{{"schema": 1, "event": "step", "time": {at}, "rank": {rank}, "step": {step}, "epoch": 0, '
                f'"loss": {loss:.6f}, "samples_per_s": {1000.0 * ranks * (0.8 if slow else 1.0):.1f}, "lr": 0.1, '
                f'"data_s": {0.002 * (1 + 0.1 * math.cos(rank)):.6f}, "forward_s": {forward:.6f}}}'
            )
            if step % 100 == 0 and rank % RANKS_PER_NODE == 0:
                lines.append(
                    f'{{"schema": 1, "event": "checkpoint", "time": {at + 0.01}, "rank": {rank}, "step": {step}, '
                    f'"path": "/ckpt/node-{node}/step-{step}.pt"}}'
                )
        end = start + (steps + 1) * INTERVAL_S
        lines.append(f'{{"schema": 1, "event": "finished", "time": {end}, "rank": {rank}, "step": {steps}}}')
        (events / f"rank-{rank}.jsonl").write_text("\n".join(lines) + "\n")
    ended = start + (steps + 2) * INTERVAL_S
    (folder / "run.json").write_text(
        json.dumps(
            {"world_size": ranks, "node_count": nodes, "started_at": start, "engine": "manual", "launcher": "torchrun"}
        )
    )
    summary = {
        "outcome": "finished",
        "world_size": ranks,
        "started_at": start,
        "ended_at": ended,
        "wall_s": ended - start,
        "time_to_first_step_s": INTERVAL_S,
        "samples_per_s": 1000.0 * ranks,
        "final_loss": 0.1,
        "steps": steps,
        "restarts": 0,
        "ranks": {
            str(r): {
                "node": r // RANKS_PER_NODE,
                "state": "finished",
                "step": steps,
                "loss": 0.1,
                "samples_per_s": 1000.0,
                "restarts": 0,
            }
            for r in range(ranks)
        },
        "failure": None,
        "warnings": [],
        "stragglers": []
        if slow_node is None
        else [
            {
                "rank": None,
                "node": slow_node,
                "phase": "forward",
                "start": slow_from,
                "end": slow_to,
                "gap_pct": 40.0,
                "lost_pct": 12.0,
            }
        ],
    }
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def measure(run_dir: Path) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds and peak resident MiB of `npu-wizard report RUN_DIR` in a child process."""
    probe = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from wizard.cli import main\n"
        "code = main(['report', sys.argv[1]])\n"
        "peak = next(l for l in Path('/proc/self/status').read_text().splitlines() if l.startswith('VmHWM:'))\n"
        "print('PEAK', int(peak.split()[1]))\n"
        "sys.exit(code)\n"
    )
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", probe, str(run_dir)], capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    if done.returncode != 0:
        raise SystemExit(f"npu-wizard report failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    peak_kib = int(next(line for line in done.stdout.splitlines() if line.startswith("PEAK")).split()[1])
    return wall, cpu, peak_kib / 1024


def main() -> None:
    """Build both run folders, report each, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=600, help="step events per rank (status_stream_scale: 600)")
    parser.add_argument("--baseline-ranks", type=int, default=16)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks that it runs and prints (seconds)")
    args = parser.parse_args()
    if args.smoke:
        args.ranks, args.steps, args.baseline_ranks = 32, 40, 4
    work = Path(tempfile.mkdtemp(prefix="report-scale-"))
    try:
        rows = []
        for ranks in (args.baseline_ranks, args.ranks):
            began = time.perf_counter()
            run_dir = make_run(work / f"run-{ranks}", ranks, args.steps)
            made = time.perf_counter() - began
            size = sum(p.stat().st_size for p in (run_dir / "events").iterdir()) / 2**20
            wall, cpu, peak = measure(run_dir)
            rows.append((ranks, size, made, wall, cpu, peak, (run_dir / "report.html").stat().st_size / 1024))
        load = Path("/proc/loadavg").read_text().split()[0]
        print(f"npu-wizard report, {args.steps} step events per rank (and as many heartbeats); load {load}")
        print(f"{'ranks':>6} {'events':>9} {'report wall':>11} {'CPU':>7} {'peak RSS':>9} {'report.html':>11}")
        for ranks, size, _, wall, cpu, peak, page in rows:
            print(f"{ranks:6d} {size:8.1f}M {wall:10.2f}s {cpu:6.2f}s {peak:8.1f}M {page:10.0f}K")
        ranks, _, _, wall, cpu, peak, _ = rows[-1]
        verdict = "yes" if wall < GOAL_S and peak < GOAL_MIB else "NO"
        cores = os.cpu_count()
        print(
            f"{ranks} ranks under {GOAL_S:g} s and {GOAL_MIB:g} MiB: {verdict} (wall {wall:.1f} s at load {load} "
            f"on {cores} cores; CPU {cpu:.1f} s, which a loaded machine stretches least)"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
