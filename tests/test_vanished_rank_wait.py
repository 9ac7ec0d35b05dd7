"""A rank that ends with exit code 0 without a word while the other ranks hang.

Its launcher never exits (the shell launcher waits for every rank), so the
runner, which waits for that launcher's word on the vanished rank, must still
end the job under --abort-on-hang. Real processes: the shell launcher, 2 ranks.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.runs import clean_up, free_port, run_dirs, start_runner
from wizard.answers.model import resolve
from wizard.render.render import render

# Mostly waiting (on a deadline, a socket, another process), little CPU: run early (tests/conftest.py)
pytestmark = pytest.mark.waits

SCRIPT = """\
import ctypes
import os
import time

if os.environ.get("RANK") == "0":
    time.sleep(1)
    ctypes.CDLL(None)._exit(0)  # exit code 0, no word: a C library's exit
time.sleep(900)  # rank 1 hangs (it would wait for rank 0 in its next collective)
"""


def test_abort_on_hang_ends_a_job_whose_vanished_rank_launcher_never_exits(tmp_path: Path) -> None:
    raw = {
        "project_name": "vanish",
        "device": "cpu",
        "nodes": 1,
        "devices_per_node": 2,
        "launcher": "shell",
        "amp": "off",
        "network.master_port": free_port(),
        "training.script": "mine.py",
    }
    project = render(resolve(raw), tmp_path).project_dir
    (project / "mine.py").write_text(SCRIPT)
    runner = start_runner(project, "--interval", "1", "--abort-on-hang", "--hang-after", "3")
    try:
        output, _ = runner.communicate(timeout=240)  # before: it ran until rank 1's 900 s were over
    except subprocess.TimeoutExpired:
        output = "the runner still waited after 240 s"
    finally:
        clean_up(project, runner)
    assert runner.returncode == 3, output
    (run_dir,) = run_dirs(project)
    assert json.loads((run_dir / "summary.json").read_text())["outcome"] == "hung", output
