"""One run of a project at a time, and no update under a live run: real runners, real updates, real locks.

The project runs a script of the user's (the shell launcher, one rank on the
CPU) that waits for a `gate` file in the project, so a run stays alive until
the test opens the gate.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.runs import clean_up, npu_wizard_run_plain, render_own_one_rank, run_dirs, start_runner, wait_for
from tests.test_update import edit_answers, files_of, kill, start_paused_update, update

GATED_SCRIPT = """\
import time
from pathlib import Path

print("waiting for the gate", flush=True)
while not Path("gate").exists():
    time.sleep(0.05)
print("through the gate", flush=True)
"""
START_S = 120


def render_gated(tmp_path: Path) -> Path:
    """One rank on the CPU running the user's `gated.py` (tests/runs.py's render_own_one_rank)."""
    return render_own_one_rank(tmp_path, "gated", "gated.py", GATED_SCRIPT)


def npu_wizard_run(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`npu-wizard run PROJECT --plain ARGS` to its end."""
    return npu_wizard_run_plain(project, *args, timeout=START_S)


def rank_waiting(project: Path) -> Path | None:
    """The run folder whose rank 0 is waiting at the gate, once it is."""
    for run_dir in run_dirs(project):
        log = run_dir / "logs" / "rank-0.log"
        if log.is_file() and "waiting for the gate" in log.read_text():
            return run_dir
    return None


@pytest.fixture
def live_run(tmp_path: Path):  # noqa: ANN201 - a generator fixture
    """A gated project and its runner, alive with its rank waiting at the gate; cleaned up whatever happens."""
    project = render_gated(tmp_path)
    runner = start_runner(project, "--interval", "1")
    try:
        run_dir = wait_for(lambda: rank_waiting(project) or runner.poll() is not None, START_S, "the rank at the gate")
        assert runner.poll() is None, runner.communicate()
        yield project, runner, run_dir
    finally:
        clean_up(project, runner)


def test_a_second_run_is_refused_naming_the_live_one_and_runs_once_it_ended(live_run) -> None:  # noqa: ANN001
    project, runner, run_dir = live_run
    second = npu_wizard_run(project)
    assert second.returncode == 1, second.stdout + second.stderr
    assert second.stderr == (
        f"npu-wizard: a run of {project} is alive (npu-wizard run, pid {runner.pid}, run folder "
        f"runs/{run_dir.name}), so nothing was started: one run of a project at a time (a second would resume "
        "from the same checkpoint and write into the same checkpoints/); wait for it to end, or stop it (Ctrl-C in "
        "its terminal, or kill -INT its pid), then run again\n"
    )
    assert run_dirs(project) == [run_dir]  # no second run folder, no second job

    (project / "gate").touch()
    output, _ = runner.communicate(timeout=START_S)
    assert runner.returncode == 0, output
    third = npu_wizard_run(project)  # the lock went with its runner
    assert third.returncode == 0, third.stdout + third.stderr
    assert len(run_dirs(project)) == 2


def test_a_runner_killed_with_sigkill_leaves_no_lock_behind(live_run) -> None:  # noqa: ANN001
    project, runner, run_dir = live_run
    runner.send_signal(signal.SIGKILL)
    runner.wait(timeout=30)
    clean_up(project)  # its job, orphaned: what the user would stop by hand
    (project / "gate").touch()
    again = npu_wizard_run(project)
    assert again.returncode == 0, again.stdout + again.stderr
    assert len(run_dirs(project)) == 2


def test_a_run_is_refused_while_the_jobs_processes_outlive_their_runner(live_run) -> None:  # noqa: ANN001
    project, runner, run_dir = live_run
    runner.send_signal(signal.SIGKILL)  # the lock goes with the runner; its rank still waits at the gate
    runner.wait(timeout=30)
    refused = npu_wizard_run(project)  # before: a second job started beside the first
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert refused.stderr.startswith(
        f"npu-wizard: a job of {project} still runs without its runner (runs/{run_dir.name}: pid "
    )
    assert run_dirs(project) == [run_dir]


def test_an_update_is_refused_while_a_run_is_alive_and_changes_nothing(live_run) -> None:  # noqa: ANN001
    project, runner, run_dir = live_run
    edit_answers(project, training__script_args=["--lr", "0.5"])
    before = files_of(project, skip=("runs/",))
    refused = update(project)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert refused.stderr == (
        f"npu-wizard: a run of {project} is alive (npu-wizard run, pid {runner.pid}, run folder "
        f"runs/{run_dir.name}), so nothing was changed: the update would change files under it; wait for it to end, "
        "or stop it (Ctrl-C in its terminal, or kill -INT its pid), then run again\n"
    )
    assert files_of(project, skip=("runs/",)) == before
    assert update(project, "--dry-run").returncode == 0  # a dry run writes nothing: not refused

    (project / "gate").touch()
    runner.communicate(timeout=START_S)
    assert runner.returncode == 0
    done = update(project)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "program=(-m runtime.userscript gated.py --lr 0.5)" in (project / "launch" / "run-node.sh").read_text()


def test_an_update_is_refused_while_the_jobs_processes_outlive_their_runner(live_run) -> None:  # noqa: ANN001
    project, runner, run_dir = live_run
    runner.send_signal(signal.SIGKILL)  # the lock goes with the runner; its rank still waits at the gate
    runner.wait(timeout=30)
    edit_answers(project, training__script_args=["--lr", "0.5"])
    refused = update(project)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert refused.stderr.startswith(f"npu-wizard: a run of {project} is alive (runs/{run_dir.name}: ")
    assert "process(es) of its job, pid " in refused.stderr


def test_a_run_is_refused_while_an_update_is_at_work_or_was_interrupted_half_way(tmp_path: Path) -> None:
    project = render_gated(tmp_path)
    (project / "gate").touch()
    edit_answers(project, training__script_args=["--lr", "0.5"])
    working = start_paused_update(project, "before-commit", tmp_path / "paused")
    try:
        refused = npu_wizard_run(project)
    finally:
        kill(working)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert refused.stderr == (
        f"npu-wizard: an npu-wizard update of {project} is at work (held by pid {working.pid}: npu-wizard update "
        f"{project}), so nothing was started: wait for it to finish, then run again\n"
    )
    assert run_dirs(project) == []

    kill(start_paused_update(project, "after-first-move", tmp_path / "paused-again"))
    journal = project / ".npu-wizard" / "update" / "journal.json"
    assert journal.is_file()
    half = npu_wizard_run(project)
    assert half.returncode == 1, half.stdout + half.stderr
    assert half.stderr == (
        f"npu-wizard: an update of {project} was interrupted half way (its journal {journal} is there), so nothing "
        f"was started: run npu-wizard update {project} to finish it, then run again\n"
    )
    assert run_dirs(project) == []
    assert update(project).returncode == 0
    ran = npu_wizard_run(project)
    assert ran.returncode == 0, ran.stdout + ran.stderr


def test_the_run_lock_is_not_inherited_by_the_jobs_processes(live_run) -> None:  # noqa: ANN001
    project, runner, run_dir = live_run
    lock = os.path.realpath(project / ".npu-wizard" / "run-node-0.lock")
    holders = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            targets = [os.readlink(fd) for fd in (entry / "fd").iterdir()]
        except OSError:
            continue
        if lock in targets:
            holders.append(int(entry.name))
    assert holders == [runner.pid]
