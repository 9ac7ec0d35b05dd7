"""Fixtures shared by several test modules."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

# tests.costs: NPU_WIZARD_TEST_COSTS=FOLDER records what each test and fixture costs (benchmarks/suite_costs.py sums
# it); tests.leaks: no test leaves a process behind (each is killed by PID and the test or the run fails);
# tests.bytecode: the project's modules compiled once for every process the suite starts, test modules rewritten once;
# tests.gc_tuning: the test processes' garbage collector leaves the modules alone and collects less often
pytest_plugins = ["tests.wizard_forks", "tests.costs", "tests.leaks", "tests.bytecode", "tests.gc_tuning"]

if TYPE_CHECKING:
    from tests.runs import RunEnded
    from wizard.monitor.hang_records import HangFolder

# A suite started in the background by a non-interactive shell (CI, nohup ... &) inherits
# SIGINT ignored, and so would every process it starts: bash cannot trap a signal ignored
# at entry and Python raises no KeyboardInterrupt. Ctrl-C tests need the terminal's default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# One CPU thread per rank in the training runs the suite starts, as torchrun gives its workers: several xdist
# workers share two cores, so a rank of the shell launcher (runtime/device.py gives it cpu_count // local ranks
# threads) or of two simulated nodes on one host would only contend for them. A run that is about threads sets its own.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Renders keep compiled templates in a cache of the suite's own (wizard/render/template_cache.py), not the user's:
# a private folder (mode 0700) made for this run, never a predictable path another local user could make first.
# Set before the tests are collected, so that xdist's workers and every process a test starts inherit it.
_OWN_CACHE: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    """Give the run a private template cache, unless the one who started it named one, and a record of the ports
    tests.runs.free_port gives (in that folder: every worker reads and adds to the same one)."""
    from tests.runs import PORTS_GIVEN

    if "NPU_WIZARD_CACHE_DIR" not in os.environ:
        _OWN_CACHE.append(tempfile.mkdtemp(prefix="npu-wizard-tests-cache-"))
        os.environ["NPU_WIZARD_CACHE_DIR"] = _OWN_CACHE[0]
    if PORTS_GIVEN not in os.environ:
        _OWN_CACHE.append(tempfile.mkdtemp(prefix="npu-wizard-tests-ports-"))
        os.environ[PORTS_GIVEN] = os.path.join(_OWN_CACHE[-1], "given")


def pytest_unconfigure(config: pytest.Config) -> None:
    """Delete the run's cache and ports folders (xdist's workers leave the ones their controller made)."""
    for folder in _OWN_CACHE:
        shutil.rmtree(folder, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests marked `waits` first, the others in their order. `--dist loadgroup` hands out the xdist groups
    first (the largest first), then the other tests in this order: a test that mostly waits (14 s for a hang
    deadline, CPU 1 s) overlaps the tests that need the cores instead of running last on one worker while the
    others have finished (in the test-fast run fast7 one worker ended 15 s after the other three, on
    test_vanished_rank_wait.py)."""
    items.sort(key=lambda item: item.get_closest_marker("waits") is None)


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port some other program listens on (127.0.0.1), as a leftover run would; the ports beside it are free.

    It lies below the kernel's ephemeral range: there, a connection of a neighbouring test could be given the port
    beside the held one at any moment, and a check of a range around it would rightly name both.
    """
    from tests.runs import free_port

    for _ in range(20):
        port = free_port(count=3) + 1
        holder = socket.socket()
        try:
            holder.bind(("127.0.0.1", port))
        except OSError:  # taken since free_port looked
            holder.close()
            continue
        with holder:
            holder.listen()
            yield port
        return
    raise RuntimeError("no port with free neighbours below the ephemeral range")


@pytest.fixture(autouse=True)
def _no_animations(monkeypatch: pytest.MonkeyPatch) -> None:
    """Textual animations off in every test: a screen is drawn in its final state however busy the machine is."""
    # The variable reaches apps started in a subprocess; App() reads the constant when it is made.
    monkeypatch.setenv("TEXTUAL_ANIMATIONS", "none")
    try:
        import textual.constants
    except ImportError:  # the runtime-only venv of the oldest torch has no Textual
        return
    monkeypatch.setattr(textual.constants, "TEXTUAL_ANIMATIONS", "none")


# ---- real runs that several tests only read ----------------------------------------------------------
# A session fixture is made once per xdist worker: the tests that read one carry its xdist_group mark, so that
# `make test` (--dist loadgroup) runs them all on one worker, after one run.


@pytest.fixture(scope="session")
def finished_2x2_run(tmp_path_factory: pytest.TempPathFactory) -> RunEnded:
    """`npu-wizard run --report` of the 2 x 2 torchrun CPU project (2 epochs of 16 steps, TensorBoard on), to its end.

    Mark its readers @pytest.mark.xdist_group("finished-2x2-run"). They only read it; the report test draws its
    page again (`report --png`), which no other reads.
    """
    from tests.runs import render_cpu, run_to_its_end

    project = render_cpu(tmp_path_factory.mktemp("finished-2x2"), "torchrun", nodes=2, tensorboard=True)
    return run_to_its_end(project, "--interval", "1", "--report")


@pytest.fixture(scope="session")
def interrupted_2x2_run(tmp_path_factory: pytest.TempPathFactory) -> RunEnded:
    """`npu-wizard run --report` of a long 2 x 2 torchrun CPU job, stopped by SIGINT (Ctrl-C) once rank 0 trains.

    Mark its readers @pytest.mark.xdist_group("interrupted-2x2-run"); none may change its folders.
    """
    from tests.runs import interrupt_once_training, render_cpu

    project = render_cpu(tmp_path_factory.mktemp("interrupted-2x2"), "torchrun", nodes=2, samples=65536, epochs=2)
    return interrupt_once_training(project, "--interval", "1", "--report")


# ---- real gloo ranks left where a hang leaves them (tests/hang_ranks.py), their records read back ------------
# Mark their readers @pytest.mark.xdist_group("interrupted-2x2-run") (test_hang_report also reads that run).


@pytest.fixture(scope="session")
def hang_jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, HangFolder]:
    """The three jobs of tests/hang_ranks.py's HANG_JOBS, run at once, each one's hang/ folder read back."""
    from tests.hang_ranks import run_hang_jobs

    return run_hang_jobs(tmp_path_factory.mktemp("hang-jobs"))


@pytest.fixture(scope="session")
def late_and_stopped(hang_jobs: dict[str, HangFolder]) -> HangFolder:
    """Ranks 0, 1 in all_reduce #4; rank 2 late in load_batch; rank 3 in all_reduce #4, then SIGSTOPped."""
    return hang_jobs["late_and_stopped"]


@pytest.fixture(scope="session")
def mismatched(hang_jobs: dict[str, HangFolder]) -> HangFolder:
    """Ranks 0, 1 all_reduce 1000 floats at #4; rank 2 a barrier; rank 3 all_reduce 2000 floats, entered last."""
    return hang_jobs["mismatched"]


@pytest.fixture(scope="session")
def loading(hang_jobs: dict[str, HangFolder]) -> HangFolder:
    """Ranks 0, 1 wait in load_batch; ranks 2, 3, without a flight recorder, in the all_reduce after it; rank 4
    is stuck in load_batch holding the GIL (it cannot answer: its record holds its faulthandler dump)."""
    return hang_jobs["loading"]
