"""benchmarks/suite_costs.py on hand-made recordings: a test's own CPU apart from its children's, and old records."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SUITE_COSTS = Path(__file__).resolve().parent.parent / "benchmarks" / "suite_costs.py"


def record(test: str, phase: str, wall: float, cpu: float, own: float | None = None) -> dict[str, object]:
    """One line as tests/costs.py writes it; own None: a line recorded before own was."""
    line: dict[str, object] = {"test": test, "phase": phase, "wall": wall, "cpu": cpu, "began": 0.0}
    return line if own is None else {**line, "own": own}


def summed(folder: Path, *lines: dict[str, object]) -> list[str]:
    """suite_costs's output for a folder holding `lines` (in one worker's file)."""
    with (folder / "costs-gw0.jsonl").open("a", encoding="utf-8") as out:
        out.writelines(json.dumps(line) + "\n" for line in lines)
    done = subprocess.run([sys.executable, str(SUITE_COSTS), str(folder)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def row(lines: list[str], name: str) -> list[str]:
    """The figures of the table row named `name` (the first table that has it)."""
    return next(line.split()[1:] for line in lines if line.split()[:1] == [name])


def test_own_is_the_test_process_part_and_the_rest_is_its_childrens(tmp_path: Path) -> None:
    lines = summed(
        tmp_path,
        record("tests/test_a.py::one", "setup", 1.0, 2.0, 0.5),
        record("tests/test_a.py::one", "call", 10.0, 6.0, 1.5),
        record("tests/test_b.py::two", "call", 4.0, 3.0, 3.0),
    )
    assert lines[0] == (
        "2 tests, 15 test-seconds of wall time, 11 CPU seconds "
        "(5 in the test processes, 6 in the processes they reaped)"
    )
    assert row(lines, "test_a.py") == ["11", "8", "2", "1"]  # wall, cpu, own, tests
    assert row(lines, "test_b.py") == ["4", "3", "3", "1"]


def test_records_without_own_show_no_own_even_beside_newer_ones(tmp_path: Path) -> None:
    old = summed(tmp_path, record("tests/test_a.py::one", "call", 10.0, 6.0))
    assert (
        old[0] == "1 tests, 10 test-seconds of wall time, 6 CPU seconds (own not recorded for all: see the own column)"
    )
    assert row(old, "test_a.py") == ["10", "6", "-", "1"]
    # a newer run appends to the same folder: the old file's own stays unknown, not 0
    mixed = summed(tmp_path, record("tests/test_b.py::two", "call", 4.0, 3.0, 2.0))
    assert mixed[0].endswith("(own not recorded for all: see the own column)")
    assert row(mixed, "test_a.py") == ["10", "6", "-", "1"]
    assert row(mixed, "test_b.py") == ["4", "3", "2", "1"]
