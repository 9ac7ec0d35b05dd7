"""What a rank warns about reaches `npu-wizard run`'s output, plain and live, and the summary.

A real `npu-wizard run` of a rendered CPU project (the shell launcher, 1 node x 2 ranks)
whose newest checkpoint is damaged: the ranks set it aside and resume from
the one before, and say so on the runner's output, not only in their logs.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.runs import render_cpu, run_dirs
from tests.test_run_command import npu_wizard_run
from wizard.monitor.app import MonitorApp
from wizard.monitor.attach import RunFolder


@pytest.mark.slow
def test_a_set_aside_checkpoint_and_the_resume_step_reach_the_output_and_the_summary(tmp_path: Path) -> None:
    project = render_cpu(tmp_path, "shell", samples=256)  # 8 steps an epoch, 2 epochs: checkpoints at 8 and 16
    assert npu_wizard_run(project, tmp_path).returncode == 0
    newest = project / "checkpoints" / "step-000000016.pt"
    newest.write_bytes(newest.read_bytes()[:100])  # torn
    older = project / "checkpoints" / "step-000000008.pt"

    again = npu_wizard_run(project, tmp_path, "--epochs", "3")

    assert again.returncode == 0, again.stdout + again.stderr
    aside = f"{newest}.unreadable"
    live = [line for line in again.stdout.splitlines() if line.startswith("WARNING from ")]
    set_aside = f": checkpoint {newest} cannot be loaded; kept aside as {aside}"
    assert any(line.endswith(set_aside) for line in live), live  # said by the rank that moved it
    assert f"WARNING from rank 0: resuming from {older}: epoch 1, step 8" in live
    summary_part = again.stdout.split("warnings:", 1)[1]
    assert f"  rank 0: resuming from {older}: epoch 1, step 8" in summary_part
    run_dir = run_dirs(project)[-1]
    summary = json.loads((run_dir / "summary.json").read_text())
    kinds = {warning["kind"] for warning in summary["warnings"]}
    assert {"checkpoint", "resume"} <= kinds

    async def alert_of_the_live_view() -> str:
        app = MonitorApp(RunFolder.open(run_dir), title="run", owns_job=False, tick_s=0)
        async with app.run_test(size=(160, 40)):
            return str(app.query_one("#alert").render())

    shown = asyncio.run(alert_of_the_live_view())
    assert f"warning from rank 0: resuming from {older}" in shown.replace("\n", "")


@pytest.mark.slow
def test_what_amp_does_on_this_device_reaches_the_output(tmp_path: Path) -> None:
    project = render_cpu(tmp_path, "shell", amp="fp16", samples=128)

    result = npu_wizard_run(project, tmp_path)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING from rank 0: AMP fp16 on the CPU: torch " in result.stdout
    assert "  rank 0: AMP fp16 on the CPU: torch " in result.stdout.split("warnings:", 1)[1]
