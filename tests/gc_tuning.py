"""The test processes' garbage collector: what is loaded before the first test is never traversed again, and
the young generation is collected ten times less often.

A worker of `make test-fast` spent 8-10 of its 45 CPU seconds in the cyclic garbage collector (a gc.callbacks
recording over a whole run): the TUI's tests make hundreds of thousands of short-lived objects, every 700 of
them start a young collection, and each of the twenty-odd full collections walked every object of the modules
collection had imported (torch, Textual, jinja2, the tests themselves: about 370,000 of them). Frozen after
collection (`gc.freeze`) and with a young generation of 10,000, the same run spent 2-3 s a worker in it.
`benchmarks/suite_gc.py` measures it: the same tests with and without this plugin, in one run.

Nothing a test checks depends on it: garbage is still collected, only later, and the processes a test starts
(CLI runs, ranks, launchers) keep Python's defaults. `-p no:tests.gc_tuning` turns it off.
"""

from __future__ import annotations

import gc

import pytest

YOUNG_THRESHOLD = 10_000
"""Container objects allocated (net) before a young collection; Python's default is 700. The two older
generations keep their default of 10 collections of the generation below."""


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Once the test modules are imported: collect what collection left, freeze the rest, enlarge gen 0."""
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, oldest)
