"""What each test and each fixture costs, in wall and CPU seconds: a pytest plugin, on when asked.

`NPU_WIZARD_TEST_COSTS=FOLDER pytest ...` writes one JSON line per test phase (setup, call, teardown) and per
fixture set-up into FOLDER/costs-<worker>.jsonl. CPU seconds are the worker's own and those of the children it
waited for (a training process, a runner, a shell script), which is what a test makes the machine do; daemons a
test started and never reaped (slurmd, sshd) are not counted. "own" is the worker's part alone (all its threads):
the rest is what the child processes it reaped during the phase cost. `python benchmarks/suite_costs.py FOLDER`
sums them per file and per fixture.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.wizard_forks import forks_cpu

FOLDER = os.environ.get("NPU_WIZARD_TEST_COSTS", "")


def _cpu() -> tuple[float, float]:
    """CPU seconds so far: this process's and its waited-for children's together (the command-line processes
    tests.wizard_forks's server forked and waited for on its behalf among them), and this process's own."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    mine = own.ru_utime + own.ru_stime
    return mine + children.ru_utime + children.ru_stime + forks_cpu(), mine


class _Recorder:
    def __init__(self, folder: Path, worker: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.out = (folder / f"costs-{worker}.jsonl").open("a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self.out.write(json.dumps(record) + "\n")
        self.out.flush()


_recorder: _Recorder | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _recorder
    if FOLDER:
        _recorder = _Recorder(Path(FOLDER), os.environ.get("PYTEST_XDIST_WORKER", "main"))


def _measured(record: dict[str, Any]) -> Iterator[None]:
    began, wall, (cpu, own) = time.time(), time.monotonic(), _cpu()
    yield
    if _recorder is not None:
        cpu_now, own_now = _cpu()
        spent = {"wall": round(time.monotonic() - wall, 3), "began": round(began, 3)}
        spent |= {"cpu": round(cpu_now - cpu, 3), "own": round(own_now - own, 3)}
        _recorder.write({**record, **spent})


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    yield from _measured({"test": item.nodeid, "phase": "setup"})


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    yield from _measured({"test": item.nodeid, "phase": "call", "slow": item.get_closest_marker("slow") is not None})


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    yield from _measured({"test": item.nodeid, "phase": "teardown"})


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest) -> Iterator[None]:
    yield from _measured(
        {"fixture": fixturedef.argname, "scope": fixturedef.scope, "test": request.node.nodeid, "phase": "fixture"}
    )
