"""The test processes' garbage collector: what is loaded before the first test is never traversed again, and a
young collection starts after 10,000 new objects instead of Python's 700.

A worker of `make test-fast` spent 8-10 of its 45 CPU seconds in the cyclic garbage collector (a gc.callbacks
clock, as benchmarks/suite_gc.py keeps one, over a whole run): the TUI's tests make hundreds of thousands of
short-lived objects, every 700 of them started a young collection, and each of the twenty-odd full collections
walked every object of the modules collection had imported (torch, Textual, jinja2, the tests themselves:
366,887 objects in that run's workers). Frozen after collection (`gc.freeze`) and with the larger young
generation, the same run spent 2.4-3.4 s a worker in it. `python benchmarks/suite_gc.py` measures it: the same tests
with and without this plugin, taking turns.

Garbage is still collected, only later, and the processes a test starts (CLI runs, ranks, launchers) keep
Python's defaults. A test that measures the memory its own process allocates (tracemalloc) asks for Python's
thresholds while it runs: `@pytest.mark.usefixtures("python_gc_defaults")`. `-p no:tests.gc_tuning` turns the
plugin off.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

YOUNG_THRESHOLD = 10_000
"""Container objects allocated (net) before a young collection. The two older generations keep Python's
setting (10 collections of the generation below)."""

PYTHON_DEFAULTS = gc.get_threshold()
"""The thresholds this interpreter started with (700, 10, 10 on CPython 3.10-3.13)."""


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Once the test modules are imported: collect what collection left, freeze the rest, enlarge gen 0."""
    gc.collect()
    gc.freeze()
    _, middle, oldest = PYTHON_DEFAULTS
    gc.set_threshold(YOUNG_THRESHOLD, middle, oldest)


@pytest.fixture
def python_gc_defaults() -> Iterator[None]:
    """Python's own thresholds for one test: a memory peak it measures in its own process is the one a user's
    process would have."""
    tuned = gc.get_threshold()
    gc.set_threshold(*PYTHON_DEFAULTS)
    try:
        yield
    finally:
        gc.set_threshold(*tuned)
