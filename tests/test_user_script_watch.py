"""Watching a user's own script: what the monitor and `run` know of ranks that send no steps, or steps through report.

Real processes: torchrun starts tests/user_scripts/*.py through runtime.userscript
(as the launch scripts of a project with training.script do), and the monitor's
state, progress line and summary are read from what the ranks wrote.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.events import read_events
from tests.runs import free_port, kinds
from wizard.monitor.report import format_summary, progress_line, summarize
from wizard.monitor.state import FINISHED, JobState

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent / "user_scripts"
TORCHRUN = str(Path(sys.executable).parent / "torchrun")


def torchrun_script(
    folder: Path, script: str, *args: str, nproc: int = 2, **env: str
) -> subprocess.CompletedProcess[str]:
    """torchrun -m runtime.userscript SCRIPT ARGS in `folder` (a copy of the script there), run folder folder/run."""
    (folder / script).write_text((SCRIPTS / script).read_text())
    return subprocess.run(
        [
            TORCHRUN,
            "--nnodes=1",
            f"--nproc-per-node={nproc}",
            "--master-addr=127.0.0.1",
            f"--master-port={free_port()}",
            "-m",
            "runtime.userscript",
            script,
            *args,
        ],
        cwd=folder,
        env={
            **os.environ,
            "NPU_WIZARD_RUN_DIR": str(folder / "run"),
            "NPU_WIZARD_HEARTBEAT_S": "0.2",
            "PYTHONPATH": str(REPO),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_the_report_calls_give_the_monitor_steps_loss_throughput_eta_and_checkpoints(tmp_path: Path) -> None:
    # every call is written (NPU_WIZARD_REPORT_S=0), so the ETA has its window of steps
    result = torchrun_script(
        tmp_path, "ddp_tutorial_report.py", "--epochs", "2", "--checkpoint-dir", str(tmp_path), NPU_WIZARD_REPORT_S="0"
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    found = read_events(tmp_path / "run")
    assert [e["step"] for e in kinds(found[0], "step")] == list(range(1, 17))  # 256 samples / 2 ranks / 16, x 2
    # mid-run, as the monitor saw it after step 8 of rank 0 and rank 1
    mid = JobState(2)
    for rank in (0, 1):
        upto = next(i for i, e in enumerate(found[rank]) if e.get("event") == "step" and e["step"] == 8)
        mid.ingest_all(found[rank][: upto + 1])
    line = progress_line(mid, 5.0, now=kinds(found[0], "step")[7]["time"])
    assert "2 ranks: running 2 | step 8/16 loss " in line
    assert mid.throughput() > 0 and mid.eta() is not None and "ETA ?" not in line
    # at the end: the summary has the steps, the loss, the throughput and the checkpoint
    state = JobState(2)
    state.ingest_all(found)
    assert [state.state(rank) for rank in (0, 1)] == [FINISHED, FINISHED]
    summary = summarize(state, started_at=0.0, ended_at=1.0, outcome="finished")
    assert summary["steps"] == 16 and summary["final_loss"] == kinds(found[0], "step")[-1]["loss"]
    assert summary["samples_per_s"] > 0
    assert summary["checkpoint"] == {"rank": 0, "step": 16, "path": f"{tmp_path}/epoch-1.pt"}
    words = format_summary(summary)
    assert f"last checkpoint: step 16, {tmp_path}/epoch-1.pt (rank 0)" in words
    assert "rank 1 (node 0): finished, step 16, loss " in words
