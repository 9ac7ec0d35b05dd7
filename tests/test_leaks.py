"""tests/leaks.py: a process a test leaves behind is killed and fails that test; one left by the run fails the run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_pytest(folder: Path, source: str) -> tuple[subprocess.CompletedProcess[str], list[int]]:
    """pytest on one test file that uses tests.leaks; its result and the pids its tests wrote down."""
    (folder / "conftest.py").write_text('pytest_plugins = ["tests.leaks"]\n')
    (folder / "test_left.py").write_text(textwrap.dedent(source))
    env = {k: v for k, v in os.environ.items() if not k.startswith("NPU_WIZARD_TEST_")}
    env["PYTHONPATH"] = str(ROOT)
    env["NPU_WIZARD_TEST_LEAK_WAIT_S"] = "1"  # the sleepers never end by themselves
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", str(folder)],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    pids = [int(line) for line in (folder / "pids").read_text().split()] if (folder / "pids").exists() else []
    return result, pids


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def test_a_process_a_test_leaves_is_killed_and_that_test_errors(tmp_path: Path) -> None:
    result, pids = run_pytest(
        tmp_path,
        """
        import subprocess
        from pathlib import Path

        def test_leaves_a_sleeper():
            sleeper = subprocess.Popen(["sleep", "600"], start_new_session=True)
            Path("pids").write_text(f"{sleeper.pid}\\n")

        def test_cleans_up():
            sleeper = subprocess.Popen(["sleep", "600"])
            sleeper.kill()
            sleeper.wait()
        """,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "2 passed, 1 error" in output, output
    assert "test_left.py::test_leaves_a_sleeper left 1 process(es) behind (now killed)" in output, output
    assert f"pid {pids[0]}: sleep 600" in output, output
    assert not alive(pids[0])


def test_a_process_a_session_fixture_leaves_fails_the_run(tmp_path: Path) -> None:
    result, pids = run_pytest(
        tmp_path,
        """
        import subprocess
        from pathlib import Path

        import pytest

        @pytest.fixture(scope="session")
        def daemon():
            sleeper = subprocess.Popen(["sleep", "600"], start_new_session=True)
            Path("pids").write_text(f"{sleeper.pid}\\n")
            return sleeper  # never stopped

        def test_uses_it(daemon):
            assert daemon.poll() is None
        """,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "1 passed" in output and "the suite left 1 process(es) behind (now killed)" in output, output
    assert not alive(pids[0])


def test_a_run_that_leaves_nothing_passes(tmp_path: Path) -> None:
    result, _ = run_pytest(
        tmp_path,
        """
        import subprocess

        def test_waits_for_its_child():
            assert subprocess.run(["true"]).returncode == 0
        """,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_multiprocessings_own_helper_is_no_leftover_of_the_test_that_started_it(tmp_path: Path) -> None:
    """A spawn context's semaphore starts multiprocessing's resource tracker, which lives as long as the worker."""
    result, _ = run_pytest(
        tmp_path,
        """
        import multiprocessing
        from pathlib import Path

        def test_makes_a_spawn_lock():
            lock = multiprocessing.get_context("spawn").Lock()
            from multiprocessing import resource_tracker
            Path("pids").write_text(f"{resource_tracker._resource_tracker._pid}\\n")
            del lock
        """,
    )
    assert result.returncode == 0, result.stdout + result.stderr
