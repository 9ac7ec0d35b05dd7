"""Where the test suite's time goes: per test file and per fixture, in wall and CPU seconds.

Record a run, then sum it:

    NPU_WIZARD_TEST_COSTS=/tmp/costs make test
    python benchmarks/suite_costs.py /tmp/costs [--top 30] [--against /tmp/costs-before]

With --against, each file's figures are printed beside those of an earlier recording (the baseline), so one
command shows what a change to the suite saved. A test's setup includes the fixtures it set up first; the
fixture table shows them apart (a session fixture is paid once per worker that sets it up).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SMOKE_TESTS = ["tests/test_port_docs.py", "tests/test_leaks.py::test_a_run_that_leaves_nothing_passes"]
"""--smoke records these (a few seconds, one of them starts a pytest of its own) and sums them."""


def record_smoke(folder: Path) -> None:
    """Record a tiny pytest run into `folder`, as `NPU_WIZARD_TEST_COSTS=folder make test` records the suite."""
    env = {**os.environ, "NPU_WIZARD_TEST_COSTS": str(folder)}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SMOKE_TESTS]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        sys.exit(f"suite_costs --smoke: the recorded tests failed:\n{result.stdout[-3000:]}{result.stderr[-2000:]}")


def read(folder: Path) -> tuple[dict[str, list[float]], dict[str, list[float]], int]:
    """Per file [wall, cpu, tests, own, unknown], per fixture [wall, cpu, set-ups, own, unknown], and the test count.

    cpu counts the worker process (all its threads) and the child processes it reaped during the phase; own the
    worker alone, so that cpu - own is what children cost: CLI runs, linters, probes. unknown counts the records
    without own (made before it was recorded, perhaps appended to in the same folder): their own is not known.
    """
    files: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0, 0.0, 0])
    fixtures: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0, 0.0, 0])
    tests: set[str] = set()
    for path in sorted(folder.glob("costs-*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            if record["phase"] == "fixture":
                entry = fixtures[f"{record['fixture']} ({record['scope']})"]
                entry[2] += 1
            else:
                entry = files[record["test"].split("::")[0]]
                if record["phase"] == "call":
                    entry[2] += 1
                    tests.add(record["test"])
            entry[0] += record["wall"]
            entry[1] += record["cpu"]
            entry[3] += record.get("own", 0.0)
            entry[4] += "own" not in record
    return files, fixtures, len(tests)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, nargs="?", help="the folder NPU_WIZARD_TEST_COSTS named")
    parser.add_argument("--top", type=int, default=30, help="rows per table (default 30)")
    parser.add_argument("--against", type=Path, help="an earlier recording to compare each file with")
    parser.add_argument("--smoke", action="store_true", help="record a tiny pytest run and sum it (does it work?)")
    args = parser.parse_args(argv)
    if args.smoke:
        with tempfile.TemporaryDirectory(prefix="npu-wizard-costs-") as scratch:
            record_smoke(Path(scratch))
            return main([scratch, "--top", str(args.top)])
    if args.folder is None:
        parser.error("name the folder NPU_WIZARD_TEST_COSTS wrote into (or --smoke)")
    if not any(args.folder.glob("costs-*.jsonl")):
        print(f"suite_costs: no costs-*.jsonl in {args.folder}", file=sys.stderr)
        return 1
    files, fixtures, count = read(args.folder)
    before = read(args.against)[0] if args.against else {}
    total_wall = sum(entry[0] for entry in files.values())
    total_cpu = sum(entry[1] for entry in files.values())
    total_own = sum(entry[3] for entry in files.values())
    known = not any(entry[4] for entry in files.values())
    split = f" ({total_own:.0f} in the test processes, {total_cpu - total_own:.0f} in the processes they reaped)"
    print(f"{count} tests, {total_wall:.0f} test-seconds of wall time, {total_cpu:.0f} CPU seconds", end="")
    print(split if known else " (own not recorded for all: see the own column)")

    def own_column(own: float, unknown: int) -> str:
        """own, or - where a record of the entry has none."""
        return f"{own:7.0f}" if not unknown else f"{'-':>7}"

    if args.against:
        old = read(args.against)
        print(
            f"baseline: {old[2]} tests, {sum(e[0] for e in old[0].values()):.0f} test-seconds of wall time, "
            f"{sum(e[1] for e in old[0].values()):.0f} CPU seconds"
        )
    print(f"\nthe {args.top} costliest files (wall s, CPU s, CPU s in the test process, tests)")
    header = f"{'file':<44} {'wall':>7} {'cpu':>7} {'own':>7} {'tests':>5}"
    print(header + ("   baseline wall    cpu" if before else ""))
    ranked = sorted(files.items(), key=lambda item: -item[1][0])
    for name, (wall, cpu, tests, own, unknown) in ranked[: args.top]:
        line = f"{name.removeprefix('tests/'):<44} {wall:7.0f} {cpu:7.0f} {own_column(own, unknown)} {tests:5d}"
        if before:
            old_wall, old_cpu = before.get(name, [0.0, 0.0])[:2]
            line += f"   {old_wall:13.0f} {old_cpu:6.0f}"
        print(line)
    print(f"\nthe {args.top} costliest fixtures (wall s, CPU s, CPU s in the test process, set-ups)")
    for name, (wall, cpu, setups, own, unknown) in sorted(fixtures.items(), key=lambda item: -item[1][0])[: args.top]:
        print(f"{name:<44} {wall:7.0f} {cpu:7.0f} {own_column(own, unknown)} {setups:5d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
