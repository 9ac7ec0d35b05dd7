"""Does watching a job slow it down? The same CPU job with and without `npu-wizard run`, in one run.

Renders a 2-node x 2-process CPU project (--nodes, --devices), then alternates: the launch scripts
started bare (no monitor), and the same job under `npu-wizard run --plain`
(status stream, event following, hang checks). Training throughput comes from
the ranks' own step events (steady-state windows, the first skipped). The
runner's CPU time and peak memory are sampled from /proc. Target: the
monitored job keeps at least 98% of the bare job's throughput.

    python benchmarks/monitor_overhead.py [--rounds 2] [--samples 65536]
    python benchmarks/monitor_overhead.py --smoke   # one round, 1 node x 1 process (tests/test_benchmarks_smoke.py)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.runs import events_of, kinds, node_env, render_cpu, run_dirs, start_nodes, wait_nodes  # noqa: E402


def steady_throughput(run_dir: Path) -> float:
    """The job's samples/s: the median of rank 0's logged windows after the first two."""
    rates = [event["samples_per_s"] for event in kinds(events_of(run_dir)[0], "step")][2:]
    return statistics.median(rates)


def bare_run(project: Path, run_dir: Path) -> float:
    """The launch scripts alone; return the throughput."""
    for node, (code, output) in enumerate(wait_nodes(start_nodes(project, node_env(run_dir)), 600)):
        if code != 0:
            raise SystemExit(f"bare node {node} exited {code}:\n{output[-2000:]}")
    return steady_throughput(run_dir)


def rss_bytes(pid: int) -> int:
    """A process's resident memory now, from /proc (what psutil's memory_info().rss reads)."""
    for row in Path(f"/proc/{pid}/status").read_text().splitlines():
        if row.startswith("VmRSS:"):
            return int(row.split()[1]) * 1024
    return 0


def cpu_seconds(pid: int) -> float:
    """A process's user + system CPU seconds so far, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def monitored_run(project: Path) -> tuple[float, float, float, float]:
    """Under `npu-wizard run`; return throughput, runner CPU seconds, wall seconds and peak RSS (MiB)."""
    before = set(run_dirs(project))
    started = time.monotonic()
    runner = subprocess.Popen(
        [sys.executable, "-m", "wizard", "run", str(project), "--plain", "--interval", "2"],
        env=node_env(project / "runs" / "unused"),
        stdout=subprocess.DEVNULL,
    )
    peak, cpu = 0, 0.0
    while runner.poll() is None:
        try:
            peak = max(peak, rss_bytes(runner.pid))
            cpu = cpu_seconds(runner.pid)
        except (FileNotFoundError, ProcessLookupError):
            break
        time.sleep(0.2)
    wall = time.monotonic() - started
    if runner.returncode != 0:
        raise SystemExit(f"monitored run exited {runner.returncode}")
    (run_dir,) = [d for d in run_dirs(project) if d not in before]
    return steady_throughput(run_dir), cpu, wall, peak / 2**20


def main() -> None:
    """Alternate bare and monitored runs; print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--samples", type=int, default=65536)
    parser.add_argument("--nodes", type=int, default=2, help="simulated nodes")
    parser.add_argument("--devices", type=int, default=2, help="CPU processes per simulated node")
    parser.add_argument("--launcher", default="torchrun", help="the project's launcher")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks that it runs and prints (seconds)")
    args = parser.parse_args()
    if args.smoke:
        # the fewest torch processes, one rank per run and no torchrun beside it (the shell launcher starts the
        # rank itself): the suite runs it; the rank still logs the 64 steps (16 windows) of the 2-process smoke run
        args.rounds, args.samples, args.nodes, args.devices, args.launcher = 1, 1024, 1, 1, "shell"
        # torchrun gives each of 2+ ranks a node OMP_NUM_THREADS=1: the lone rank would take a thread per core
        # (runtime/device.py), and on the suite's two busy cores its tiny steps would spin, not train
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        project = render_cpu(
            Path(tmp),
            args.launcher,
            nodes=args.nodes,
            devices_per_node=args.devices,
            samples=args.samples,
            epochs=1,
            checkpoint_every=0,
        )
        bare, watched, cpus, walls, peaks = [], [], [], [], []
        for round_ in range(args.rounds):
            for checkpoint in (project / "checkpoints").glob("*.pt"):
                checkpoint.unlink()
            bare.append(bare_run(project, Path(tmp) / f"bare-{round_}"))
            for checkpoint in (project / "checkpoints").glob("*.pt"):
                checkpoint.unlink()
            rate, cpu, wall, peak = monitored_run(project)
            watched.append(rate)
            cpus.append(cpu)
            walls.append(wall)
            peaks.append(peak)
            print(f"round {round_ + 1}: bare {bare[-1]:,.0f} samples/s, monitored {rate:,.0f} samples/s", flush=True)
    ratio = statistics.mean(watched) / statistics.mean(bare)
    print(
        f"cores: {os.cpu_count()}, job: {args.nodes} node(s) x {args.devices} CPU processes, "
        f"{args.samples} samples, 1 epoch"
    )
    print(f"throughput without monitor: {statistics.mean(bare):,.0f} samples/s")
    print(f"throughput with monitor:    {statistics.mean(watched):,.0f} samples/s ({ratio:.1%}; target >= 98%)")
    print(
        f"monitor (npu-wizard run): {statistics.mean(cpus):.2f} CPU s over {statistics.mean(walls):.1f} s wall "
        f"({statistics.mean(cpus) / statistics.mean(walls):.1%} of one core), peak RSS {max(peaks):.0f} MiB"
    )


if __name__ == "__main__":
    main()
