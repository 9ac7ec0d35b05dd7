"""Saving before being stopped: SIGUSR1 or SIGTERM makes every rank save at the same step and exit 75.

Real processes: a 2 x 2 CPU job of the generated train.py under `npu-wizard run`
(manual engine), one rank of which gets SIGUSR1; then `npu-wizard run` again
resumes from that checkpoint and trains exactly the planned steps.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.preemption import PREEMPTED_EXIT
from tests.runs import (
    clean_up,
    events_of,
    kinds,
    leftover_processes,
    node_env,
    npu_wizard_run_plain,
    render_cpu,
    render_own_one_rank,
    run_dirs,
    start_runner,
    started_pid,
    wait_for,
)

ROOT = Path(__file__).resolve().parent.parent
START_S = 180
# 1024 samples / (16 x 4 ranks) = 16 steps an epoch; 16 epochs: 256 steps, still training when signalled
EPOCHS = 16
PLANNED_STEPS = 16 * EPOCHS


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def preempted_events(run_dir: Path) -> dict[int, list[dict]]:
    return {rank: kinds(found, "preempted") for rank, found in events_of(run_dir).items()}


@pytest.mark.slow
@pytest.mark.xdist_group("preempted-2x2-run")
def test_sigusr1_to_one_rank_saves_every_rank_at_one_step_and_a_second_run_resumes_there(tmp_path: Path) -> None:
    project = render_cpu(tmp_path, "shell", nodes=2, epochs=EPOCHS, checkpoint_every=0)
    runner = start_runner(project, "--interval", "1")
    try:
        run_dir = wait_for(lambda: run_dirs(project), 60, "the run folder")[0]
        victim = wait_for(lambda: started_pid(run_dir, 3), START_S, "rank 3 to train")
        os.kill(victim, signal.SIGUSR1)  # only rank 3 hears it: the others learn it at the window's all_reduce
        output, _ = runner.communicate(timeout=120)
        assert not leftover_processes(project)
    finally:
        clean_up(project, runner)
    assert runner.returncode == PREEMPTED_EXIT, output
    preempted = preempted_events(run_dir)
    steps = {found[-1]["step"] for found in preempted.values() if found}
    assert sorted(rank for rank, found in preempted.items() if found) == [0, 1, 2, 3], output
    assert len(steps) == 1, preempted  # every rank stopped at the same step
    (step,) = steps
    assert 0 < step < PLANNED_STEPS and step % 4 == 0  # a logged step (log_every 4), before the end
    assert {found[-1]["signal"] for found in preempted.values()} == {"SIGUSR1"}
    for saver in (0, 2):  # local rank 0 of each node saves, before any rank exits
        (saved,) = [found for found in kinds(events_of(run_dir)[saver], "checkpoint") if found["step"] == step]
        assert Path(saved["path"]).is_file()
    summary = summary_of(run_dir)
    assert summary["outcome"] == "preempted"
    assert summary["preempted"] == {"step": step, "signal": "SIGUSR1"}
    assert f"preempted at step {step} (SIGUSR1), checkpoint saved" in output
    assert f"preempted: every rank saved a checkpoint at step {step} and exited" in output
    node_log = (run_dir / "logs" / "node-1.log").read_text()
    assert f"node 1: ranks 2-3 preempted at step {step}, checkpoint saved; exiting with code 75" in node_log

    again = npu_wizard_run_plain(project)
    assert again.returncode == 0, again.stdout + again.stderr
    newest = run_dirs(project)[-1]
    resumed = events_of(newest)
    for rank in range(4):
        assert kinds(resumed[rank], "started")[-1]["resumed_step"] == step
        assert kinds(resumed[rank], "finished")[-1]["step"] == PLANNED_STEPS
    assert summary_of(newest)["outcome"] == "finished"


ASKING_SCRIPT = """\
import sys, time
from pathlib import Path
from runtime import report

step = 0
while True:
    step += 1
    time.sleep(0.05)
    report.step(step, loss=1.0 / step, samples=8)
    if report.should_stop():
        saved = Path("mine-checkpoint.txt")
        saved.write_text(str(step))
        report.checkpoint(step, saved)
        print(f"saved at step {step}", flush=True)
        sys.exit(report.PREEMPTED_EXIT)
"""


@pytest.mark.slow
def test_a_users_script_asking_report_should_stop_saves_and_ends_preempted(tmp_path: Path) -> None:
    project = render_own_one_rank(tmp_path, "own-stop", "mine.py", ASKING_SCRIPT)
    runner = start_runner(project, "--interval", "1")
    try:
        run_dir = wait_for(lambda: run_dirs(project), 60, "the run folder")[0]
        victim = wait_for(lambda: started_pid(run_dir, 0), START_S, "the script to report a step")
        os.kill(victim, signal.SIGUSR1)
        output, _ = runner.communicate(timeout=120)
    finally:
        clean_up(project, runner)
    assert runner.returncode == PREEMPTED_EXIT, output
    saved_step = int((project / "mine-checkpoint.txt").read_text())
    (said,) = kinds(events_of(run_dir)[0], "preempted")
    assert (said["step"], said["signal"], said["exit_code"]) == (saved_step, "SIGUSR1", PREEMPTED_EXIT)
    assert summary_of(run_dir)["preempted"] == {"step": saved_step, "signal": "SIGUSR1"}
    assert f"preempted at step {saved_step} (SIGUSR1), checkpoint saved" in output


def _user_script(tmp_path: Path, text: str) -> subprocess.Popen[str]:
    """`python -m runtime.userscript mine.py` as the launch scripts start it, for one rank."""
    (tmp_path / "mine.py").write_text(text)
    env = {**node_env(tmp_path / "run"), "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.Popen(
        [sys.executable, "-m", "runtime.userscript", "mine.py"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1], ids=["TERM", "USR1"])
def test_a_users_script_that_never_asks_still_dies_of_the_signal(tmp_path: Path, sig: signal.Signals) -> None:
    script = _user_script(tmp_path, "import time\nprint('up', flush=True)\ntime.sleep(120)\n")
    try:
        assert script.stdout is not None and script.stdout.readline() == "up\n"
        script.send_signal(sig)
        script.wait(timeout=30)
    finally:
        script.kill()
        script.communicate()
    assert script.returncode == -sig  # as before npu-wizard installed anything


def test_a_users_own_handler_for_sigterm_is_kept(tmp_path: Path) -> None:
    text = (
        "import signal, sys, time\n"
        "from runtime import report\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))\n"
        "report.should_stop()\n"
        "print('up', flush=True)\n"
        "time.sleep(120)\n"
    )
    script = _user_script(tmp_path, text)
    try:
        assert script.stdout is not None and script.stdout.readline() == "up\n"
        script.send_signal(signal.SIGTERM)
        script.wait(timeout=30)
    finally:
        script.kill()
        script.communicate()
    assert script.returncode == 7  # the script's handler ran, not npu-wizard's
