"""What the suite's compiled Python (tests/bytecode.py) saves, with PYTHONDONTWRITEBYTECODE set as on this machine.

Two copies of the repository's tracked files: one as a clean clone is (no bytecode of the project's own, the
plugin blocked: the baseline), one with tests/bytecode.py at work (its modules compiled as checked-hash
bytecode, the test modules' rewrites cached by an earlier collection). Taking turns, each copy runs

- `python -m wizard --answers examples/cpu-demo.yaml`, a render in a fresh process as the suite starts hundreds;
- `pytest --collect-only -m "not slow"`, what every xdist worker does before its first test.

The figures are CPU seconds of the child (user + system), medians over the runs.

    python benchmarks/suite_bytecode.py [--runs 5]
    python benchmarks/suite_bytecode.py --smoke   # one run each, one test file collected
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.bytecode import compile_checked  # noqa: E402  (the repository's root first)


def copy_tracked(into: Path) -> Path:
    """The repository's tracked files (as they are in the work tree) copied under `into`."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        source, target = ROOT / name, into / name
        if source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return into


def cpu_of(command: list[str], cwd: Path) -> float:
    """CPU seconds (user + system) of `command`, run to its end in `cwd` with bytecode writing off."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(cwd)}
    env.pop("PYTHONPYCACHEPREFIX", None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, cwd=cwd, env=env, check=True, capture_output=True, timeout=600)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="runs of each command in each copy (default 5)")
    parser.add_argument("--smoke", action="store_true", help="one run each, one test file collected")
    args = parser.parse_args(argv)
    runs = 1 if args.smoke else args.runs
    selection = ["tests/test_answers.py"] if args.smoke else []
    with tempfile.TemporaryDirectory(prefix="npu-wizard-bytecode-") as scratch:
        bare = copy_tracked(Path(scratch) / "bare")
        compiled = copy_tracked(Path(scratch) / "compiled")
        print(f"compiled {len(compile_checked(compiled))} modules of the copy as checked-hash bytecode")
        python = sys.executable
        collect = [python, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "not slow"]
        # the bare copy never gets the plugin; the other collects once first, as a worker's first run does
        commands = {
            "bare": (bare, [*collect, "-p", "no:tests.bytecode", *selection]),
            "compiled": (compiled, [*collect, *selection]),
        }
        cpu_of(commands["compiled"][1], compiled)
        renders: dict[str, list[float]] = {"bare": [], "compiled": []}
        collections: dict[str, list[float]] = {"bare": [], "compiled": []}
        for run in range(runs):
            for kind, (copy, collect_command) in commands.items():
                answers = copy / "examples" / "cpu-demo.yaml"
                out = Path(scratch) / f"out-{kind}-{run}"
                renders[kind].append(cpu_of([python, "-m", "wizard", "--answers", str(answers), "-o", str(out)], copy))
                collections[kind].append(cpu_of(collect_command, copy))
        if any((bare / "wizard" / "__pycache__").glob("*.pyc")):
            print("the bare copy got bytecode of its own: the baseline is not one", file=sys.stderr)
            return 1
    for what, figures in (("a render in a fresh process", renders), ("a collection (not slow)", collections)):
        before, after = statistics.median(figures["bare"]), statistics.median(figures["compiled"])
        print(f"{what}: baseline (no bytecode) {before:.3f} CPU s, with tests/bytecode.py {after:.3f} CPU s")
        print(f"  {what}: {before - after:+.3f} CPU s saved ({(before - after) / before:.0%}), {runs} run(s) each")
    return 0


if __name__ == "__main__":
    sys.exit(main())
