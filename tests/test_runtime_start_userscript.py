"""The runtime started from its file (runtime/start_userscript.py) leaves the name `runtime` to the user's package."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from runtime.events import read_events

REPO = Path(__file__).resolve().parent.parent
USERS_SCRIPT = """\
import sys

import runtime
from runtime.helpers import WHOSE
from npu_wizard_runtime import report

print("user's runtime:", WHOSE, runtime.__file__)
print("first on sys.path:", sys.path[0])
report.step(1, loss=0.5)
"""


def test_a_users_own_runtime_package_imports_beside_npu_wizards_runtime(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "runtime").mkdir(parents=True)
    (repo / "runtime" / "__init__.py").write_text("")
    (repo / "runtime" / "helpers.py").write_text("WHOSE = 'mine'\n")
    (repo / "train.py").write_text(textwrap.dedent(USERS_SCRIPT))
    env = {**os.environ, "NPU_WIZARD_RUN_DIR": str(tmp_path / "run"), "PYTHONPATH": ""}
    result = subprocess.run(
        [sys.executable, str(REPO / "runtime" / "start_userscript.py"), "train.py"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    log = (tmp_path / "run" / "logs" / "rank-0.log").read_text()
    assert f"user's runtime: mine {repo / 'runtime' / '__init__.py'}" in log
    assert f"first on sys.path: {repo}" in log  # the script's folder, as `python train.py` gives
    kinds = [event["event"] for event in read_events(tmp_path / "run")[0]]
    assert kinds[0] == "started" and kinds[-1] == "finished" and "step" in kinds
