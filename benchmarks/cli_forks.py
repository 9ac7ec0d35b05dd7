"""What running the tests' `python -m wizard` commands as forks of one server (tests/wizard_forks.py) saves,
against real subprocesses.

Two figures, each taking turns between the two ways:
1. One command, many times: `npu-wizard --answers examples/cpu-demo.yaml -o DIR` into a new folder each time.
   CPU seconds per call (user + system, the child's: this process waits for a subprocess, the server for a fork)
   and wall seconds per call. The server's own start (its imports) is in the first fork's wall seconds and in
   neither CPU column.
2. Test files in one pytest process (no xdist), with NPU_WIZARD_TEST_FORKS=0 (every call a subprocess: the
   baseline) and without it: the pytest process's CPU seconds (its children and the server's forks included)
   and wall seconds, medians over the rounds.

    python benchmarks/cli_forks.py [--calls 20] [--rounds 3] [tests/test_render_into.py ...]
    python benchmarks/cli_forks.py --smoke   # 3 calls, one round of one small test file
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import wizard_forks  # noqa: E402  (the repository's root first)

EXAMPLE = ROOT / "examples" / "cpu-demo.yaml"
DEFAULT_FILES = ["tests/test_render_into.py", "tests/test_bad_input.py", "tests/test_update.py"]
SMOKE_FILES = ["tests/test_cluster_answers.py"]


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_call(forked: bool, out: Path) -> tuple[float, float]:
    """One render into `out`: its CPU and wall seconds."""
    cpu, forks, began = children_cpu(), wizard_forks.forks_cpu(), time.perf_counter()
    args = ["--answers", str(EXAMPLE), "-o", str(out)]
    if forked:
        done = wizard_forks.run_module("wizard", args, forked=True, timeout=300)
    else:
        command = [sys.executable, "-m", "wizard", *args]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    wall = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"the render failed ({'forked' if forked else 'subprocess'}):\n{done.stderr}")
    return children_cpu() - cpu + wizard_forks.forks_cpu() - forks, wall


def calls(count: int, scratch: Path) -> None:
    spent: dict[str, list[tuple[float, float]]] = {"subprocess": [], "forked": []}
    for index in range(count):
        order = ("subprocess", "forked") if index % 2 == 0 else ("forked", "subprocess")
        for kind in order:
            spent[kind].append(one_call(kind == "forked", scratch / f"{kind}-{index}"))
    wizard_forks.stop()  # the server's CPU (its start, its imports) is this process's child's from here
    print(f"{count} renders of examples/cpu-demo.yaml each way, taking turns")
    for kind, figures in spent.items():
        cpu = statistics.median(c for c, _ in figures)
        wall = statistics.median(w for _, w in figures)
        print(f"  {kind:<10} median {cpu:.3f} CPU s and {wall:.3f} wall s a call (first call {figures[0][1]:.3f} s)")
    base = sum(c for c, _ in spent["subprocess"])
    forks = sum(c for c, _ in spent["forked"])
    print(f"  CPU s in all: subprocess {base:.2f}, forked {forks:.2f} (the server's start not included)")


def run_files(files: list[str], forked: bool) -> tuple[float, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_") and k != "NPU_WIZARD_TEST_COSTS"}
    if not forked:
        env["NPU_WIZARD_TEST_FORKS"] = "0"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-m", "not slow"]
    cpu, began = children_cpu(), time.perf_counter()
    done = subprocess.run([*command, *files], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"the tests failed ({'forked' if forked else 'subprocess'}):\n{done.stdout[-3000:]}")
    return children_cpu() - cpu, wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", help=f"test files (default: {' '.join(DEFAULT_FILES)})")
    parser.add_argument("--calls", type=int, default=20, help="renders each way (default 20)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of the test files each way (default 3)")
    parser.add_argument("--smoke", action="store_true", help="3 renders, one round of one small test file")
    args = parser.parse_args(argv)
    files = args.files or (SMOKE_FILES if args.smoke else DEFAULT_FILES)
    rounds = 1 if args.smoke else args.rounds
    with tempfile.TemporaryDirectory(prefix="npu-wizard-forks-bench-") as folder:
        calls(3 if args.smoke else args.calls, Path(folder))
    runs: dict[str, list[tuple[float, float]]] = {"subprocess": [], "forked": []}
    for round_ in range(rounds):
        order = ("subprocess", "forked") if round_ % 2 == 0 else ("forked", "subprocess")
        for kind in order:
            runs[kind].append(run_files(files, kind == "forked"))
            cpu, wall = runs[kind][-1]
            print(f"round {round_ + 1}: {kind:<10} {cpu:6.1f} CPU s, {wall:6.1f} wall s", flush=True)
    median = {
        kind: (statistics.median(c for c, _ in r), statistics.median(w for _, w in r)) for kind, r in runs.items()
    }
    (base_cpu, base_wall), (fork_cpu, fork_wall) = median["subprocess"], median["forked"]
    print(f"\n{' '.join(files)} (not slow), median of {rounds} round(s)")
    print(f"every call a subprocess (NPU_WIZARD_TEST_FORKS=0): {base_cpu:.1f} CPU s, {base_wall:.1f} wall s")
    print(f"forked from the server: {fork_cpu:.1f} CPU s, {fork_wall:.1f} wall s")
    saved = base_cpu - fork_cpu
    print(f"CPU s saved: {saved:+.1f} ({saved / base_cpu:.0%}); wall s saved: {base_wall - fork_wall:+.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
