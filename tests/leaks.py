"""No test leaves a process behind: a pytest plugin that finds, ends and reports the suite's leftovers.

Every process the suite starts inherits two variables from the process that started it:
NPU_WIZARD_TEST_SESSION (one value for the whole run, set before xdist starts its workers) and
NPU_WIZARD_TEST_NODE (the test whose code started it; session and module fixtures run before it is set, so
what they start carries the session's mark only). After each test the processes with its mark get a while to
end by themselves (a runner's ranks may still be on their way out); those still alive then are killed, by PID,
and the test errors with their pids and command lines. When the whole run ends, the controller does the same for
every process with the session's mark (a shared run, a daemon a fixture started) and fails the run.

A process that clears its environment (a login shell over ssh, a Slurm step with --export=NONE) carries no mark
and is the business of the fixture that made its host: the namespace hosts and the Slurm cluster are stopped by
PID when their fixtures end.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

SESSION = "NPU_WIZARD_TEST_SESSION"
NODE = "NPU_WIZARD_TEST_NODE"
END_S = float(os.environ.get("NPU_WIZARD_TEST_LEAK_WAIT_S", "30"))
"""How long leftovers get to end by themselves before they are killed: a safety net, not a wait (the check
returns as soon as none is left). tests/test_leaks.py shortens it for the runs it makes."""


HELPERS = ("from multiprocessing.resource_tracker import main", "from multiprocessing.forkserver import main")
"""multiprocessing's own helper processes: started once for the process that uses a spawn context (a test's
torch.multiprocessing ranks), they live as long as it does and end with it, so they are no test's leftover while
that process (this worker) runs; at the end of the run they are gone with their worker."""


def marked(name: str, value: str) -> dict[int, str]:
    """Live processes (zombies excluded) whose environment has name=value, each with its command line."""
    needle = f"{name}={value}".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        state, parent = fields[0], int(fields[1])
        if state in ("Z", "X") or (parent == os.getpid() and any(helper in command for helper in HELPERS)):
            continue
        found[int(entry.name)] = command[:300]
    return found


def end_leftovers(name: str, value: str, within: float = END_S) -> dict[int, str]:
    """Wait up to `within` seconds for the marked processes to end; kill those left; return them."""
    deadline = time.monotonic() + within
    left = marked(name, value)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = marked(name, value)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return left


def describe(left: dict[int, str]) -> str:
    return "\n".join(f"  pid {pid}: {command}" for pid, command in sorted(left.items()))


def pytest_configure(config: pytest.Config) -> None:
    """Mark the run (in the controller, or a run without xdist); workers inherit the mark."""
    if SESSION not in os.environ:
        os.environ[SESSION] = uuid.uuid4().hex
        config._npu_wizard_owns_session_mark = True  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def _no_process_left_behind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Mark what this test starts; error the test if any of it outlives it."""
    mark = uuid.uuid4().hex
    monkeypatch.setenv(NODE, mark)
    yield
    left = end_leftovers(NODE, mark)
    if left:
        pytest.fail(f"{request.node.nodeid} left {len(left)} process(es) behind (now killed):\n{describe(left)}")


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> Iterator[None]:
    """After the workers ended: anything with the session's mark still alive is a leak; kill it and fail."""
    yield
    if not getattr(session.config, "_npu_wizard_owns_session_mark", False):
        return
    left = end_leftovers(SESSION, os.environ[SESSION])
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        text = f"the suite left {len(left)} process(es) behind (now killed):\n{describe(left)}"
        if reporter is not None:
            reporter.write_line(text, red=True)
        else:
            print(text)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
