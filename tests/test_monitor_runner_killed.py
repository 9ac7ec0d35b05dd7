"""`npu-wizard monitor` of a run whose runner was killed -9 while its ranks trained on (issue 36 item 39).

A real 1 x 2 CPU job (shell launcher, gloo): the launch script lives in a
process group of its own, so killing the runner leaves the ranks training.
The monitor must say so and follow them to their end, not call the run
abandoned.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runs import clean_up, node_env, render_cpu, run_dirs, start_runner, started_pid, wait_for

pytestmark = pytest.mark.slow

START_S = 180  # a loaded two-core machine takes a while to start torch processes


def test_monitor_follows_the_ranks_of_a_killed_runner_to_their_end_and_says_the_runner_is_gone(
    tmp_path: Path,
) -> None:
    project = render_cpu(tmp_path, "shell", samples=16384, epochs=1)  # 512 steps a rank: still training when killed
    runner = start_runner(project, "--interval", "1")
    stopped: list[int] = []
    try:
        run_dir = wait_for(lambda: run_dirs(project), 60, "the run folder")[0]
        stopped = [
            wait_for(lambda r=rank: started_pid(run_dir, r), START_S, f"rank {rank} to train") for rank in (0, 1)
        ]
        # the ranks wait (SIGSTOP) until the monitor has looked: on a loaded machine they could otherwise finish
        # between the kill and the monitor's start, and there would be no ranks left to follow
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        os.kill(runner.pid, signal.SIGKILL)
        runner.wait(timeout=60)
        said_file = tmp_path / "monitor-output.txt"
        with said_file.open("w") as said_to:
            monitor = subprocess.Popen(
                [sys.executable, "-m", "wizard", "monitor", str(run_dir), "--plain", "--interval", "1"],
                env=node_env(run_dir),
                stdout=said_to,
                stderr=subprocess.STDOUT,
                text=True,
            )
        # its first line is out: it has opened the run folder and is about to look at the runner and the ranks
        wait_for(lambda: "\n" in said_file.read_text(), START_S, "the monitor's first line")
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        monitor.wait(timeout=2 * START_S)
        watched = subprocess.CompletedProcess(monitor.args, monitor.returncode, said_file.read_text(), "")
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        clean_up(project, runner)
    output = watched.stdout
    assert watched.returncode == 0, output + watched.stderr
    said = [line for line in output.splitlines() if line.startswith("warning: the runner of this run")]
    assert len(said) == 1, output
    assert said[0].startswith(f"warning: the runner of this run (pid {runner.pid}) is gone (killed?), but the ranks ")
    assert said[0].endswith("following their own events; nothing supervises them or stops them at a failure or a hang")
    assert "outcome: finished" in output.splitlines(), output
    assert "abandoned" not in output
