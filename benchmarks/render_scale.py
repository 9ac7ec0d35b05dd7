"""How rendering grows with the node count: 64, 512 and 4096 nodes against 8, in one run.

Each render is `npu-wizard --answers FILE -o DIR` in a fresh process, as a user
runs it, from an answers file with one host IP per node. Prints per node
count the median wall time, the project's size and file count, the growth
against the 8-node render next to the growth in nodes, and a filesystem
baseline: how long this folder takes to create as many small files with plain
Python (a slow or busy disk shows there too), and the render's CPU time,
which disk waits do not inflate. Targets: 4096 nodes
under 5 s and under 20 MB; time and size linear in nodes.

    python benchmarks/render_scale.py [--repeat 3] [--nodes 8 64 512 4096] [--dir FOLDER, e.g. /dev/shm]
    python benchmarks/render_scale.py --smoke   # 8 and 16 nodes once: does it run? (tests/test_benchmarks_smoke.py)
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

TARGET_SECONDS, TARGET_MB = 5.0, 20.0


def answers_file(folder: Path, nodes: int) -> Path:
    """An answers file for `nodes` Atlas A3 servers with distinct addresses."""
    ips = [f"10.{node // 65536}.{node // 256 % 256}.{node % 256}" for node in range(1, nodes + 1)]
    document = {
        "schema": 1,
        "project_name": f"scale-{nodes}",
        "hardware": "atlas-a3",
        "nodes": nodes,
        "devices_per_node": 16,
        "launcher": "torch-npu-run",
        "network": {"host_ips": ips, "master_addr": ips[0], "connect_timeout": 1200},
    }
    path = folder / f"answers-{nodes}.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def render_once(answers: Path, scratch: Path) -> tuple[float, float, int, int]:
    """Wall seconds, CPU seconds, bytes and files of one fresh-process render into a new folder `scratch`."""
    os.sync()  # earlier runs' writes and deletions are flushed before the clock starts
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "wizard", "--answers", str(answers), "-o", str(scratch)], check=True, capture_output=True
    )
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    files = [p for p in scratch.rglob("*") if p.is_file()]
    return seconds, cpu, sum(p.stat().st_size for p in files), len(files)


def write_files_baseline(scratch: Path, count: int, size: int) -> float:
    """Seconds to create `count` files of `size` bytes here with plain Python."""
    scratch.mkdir(parents=True)
    os.sync()
    start = time.perf_counter()
    for index in range(count):
        (scratch / f"file{index}.sh").write_bytes(b"#" * size)
    return time.perf_counter() - start


def main() -> int:
    """Render at each node count and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--nodes", type=int, nargs="+", default=[8, 64, 512, 4096])
    parser.add_argument("--dir", type=Path, default=None, help="where to render (default: a temporary folder)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks that it runs and prints (seconds)")
    args = parser.parse_args()
    warm_ups = 1
    if args.smoke:  # no warm-up render either: the smoke run's figures mean nothing, 2 processes fewer
        args.repeat, args.nodes, warm_ups = 1, [8, 16], 0
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        root = Path(folder)
        rows = []
        for nodes in args.nodes:
            answers = answers_file(root, nodes)
            # a fresh folder each time; the first run warms the caches
            runs = [render_once(answers, root / f"out-{nodes}-{run}") for run in range(args.repeat + warm_ups)]
            runs = runs[warm_ups:]
            seconds = statistics.median(run[0] for run in runs)
            cpu = statistics.median(run[1] for run in runs)
            _, _, size, files = runs[-1]
            baseline = write_files_baseline(root / f"baseline-{nodes}", files, max(1, size // files))
            rows.append((nodes, seconds, cpu, size, files, baseline))
    base_nodes, base_seconds, base_cpu, base_size, _, _ = rows[0]
    print(f"npu-wizard --answers, median of {args.repeat} fresh processes; baseline: the {base_nodes}-node render")
    print("  nodes   wall s    CPU s   size MB   files   x nodes   x wall   x CPU   x size   same files, plain Python")
    for nodes, seconds, cpu, size, files, baseline in rows:
        print(
            f"  {nodes:5d}   {seconds:6.2f}   {cpu:6.2f}   {size / 1e6:7.2f}   {files:5d}   {nodes / base_nodes:7.0f}"
            f"   {seconds / base_seconds:6.1f}   {cpu / base_cpu:5.1f}   {size / base_size:6.1f}   {baseline:6.2f} s"
        )
    largest_nodes, largest_seconds, _, largest_size, *_ = rows[-1]
    added = [(nodes - base_nodes, size - base_size, cpu - base_cpu) for nodes, _, cpu, size, _, _ in rows[1:]]
    print(f"bytes per added node: {', '.join(f'{b / n:.0f}' for n, b, _ in added)} (constant: linear size)")
    print(f"CPU ms per added node: {', '.join(f'{c / n * 1000:.2f}' for n, _, c in added)} (constant: linear time)")
    time_ok = "meets" if largest_seconds < TARGET_SECONDS else "MISSES"
    size_ok = "meets" if largest_size / 1e6 < TARGET_MB else "MISSES"
    print(
        f"{largest_nodes} nodes: {largest_seconds:.2f} s wall ({time_ok} the {TARGET_SECONDS:g} s target), "
        f"{largest_size / 1e6:.1f} MB ({size_ok} the {TARGET_MB:g} MB target)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
