"""A `preempted` event counts only for the attempt that wrote it, and only the time limit's SIGUSR1 requeues.

The events files of runs/latest grow across Slurm's requeues: an earlier attempt's
`preempted` must not make a later attempt whose ranks died before `started` look
saved (requeued for ever). The launch script and the batch script run for real
under bash, with stand-ins for torchrun, srun, scancel and scontrol.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from runtime import events
from runtime.preemption import main
from tests.test_launch_scripts import alive, render_project, run_node, script_env, wait_for
from tests.test_runtime_preemption import render_slurm, write_events

ROOT = Path(__file__).resolve().parent.parent


def old_preemption(run_dir: Path, ranks: range) -> None:
    """An earlier attempt's ending: started, then preempted at step 100 (at time 1.0), then nothing."""
    for rank in ranks:
        write_events(run_dir, rank, {"event": "started"}, {"event": "preempted", "step": 100})


def test_a_preempted_event_from_before_the_attempt_started_does_not_count(tmp_path: Path) -> None:
    old_preemption(tmp_path, range(2))
    done = subprocess.run(
        [sys.executable, "-m", "runtime.preemption", str(tmp_path), "0", "2", "--since", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert (done.returncode, done.stdout) == (1, "")
    assert main([str(tmp_path), "0", "2", "--since", "1"]) == 0  # written when this attempt started: counts


def test_since_needs_a_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path), "0", "2", "--since", "now"]) == 2
    assert capsys.readouterr().err == "runtime.preemption: --since needs a time in unix seconds\n"


def fake_launcher(folder: Path, body: str) -> Path:
    """A torchrun stand-in running `body` in folder/fakebin."""
    fakes = folder / "fakebin"
    fakes.mkdir(exist_ok=True)
    path = fakes / "torchrun"
    path.write_text(f"#!/usr/bin/env bash\n{body}\n")
    path.chmod(0o755)
    return fakes


def test_a_failed_launcher_is_not_preempted_by_an_earlier_attempts_events(tmp_path: Path) -> None:
    project = render_project(tmp_path / "p", launcher="torchrun")
    run_dir, record = tmp_path / "run", tmp_path / "record"
    record.mkdir()
    old_preemption(run_dir, range(2))
    env = script_env(record, fake_launcher(tmp_path, "exit 1"), NPU_WIZARD_RUN_DIR=str(run_dir))
    result = run_node(project, 0, env)
    assert result.returncode == 1, result.stdout + result.stderr  # was 75: "ranks 0-1 preempted at step 100"
    assert "preempted" not in result.stdout


def test_a_launcher_whose_ranks_saved_in_this_attempt_is_preempted(tmp_path: Path) -> None:
    project = render_project(tmp_path / "p", launcher="torchrun")
    run_dir, record = tmp_path / "run", tmp_path / "record"
    record.mkdir()
    old_preemption(run_dir, range(2))
    save = "".join(
        f'printf \'{{"event": "preempted", "step": 7, "time": %s}}\\n\' "$(date +%s.%N)" >>{shlex.quote(str(path))}\n'
        for path in (events.events_path(run_dir, rank) for rank in range(2))
    )
    env = script_env(record, fake_launcher(tmp_path, save + "exit 1"), NPU_WIZARD_RUN_DIR=str(run_dir))
    result = run_node(project, 0, env)
    assert result.returncode == 75, result.stdout + result.stderr
    assert "node 0: ranks 0-1 preempted at step 7, checkpoint saved; exiting with code 75 (preempted)" in result.stdout


def test_a_save_grace_that_is_no_number_is_noted_and_the_signal_still_stops_the_launcher(tmp_path: Path) -> None:
    project = render_project(tmp_path / "p", launcher="torchrun")
    record = tmp_path / "record"
    record.mkdir()
    pid_file = record / "torchrun.pid"
    fakes = fake_launcher(tmp_path, f"echo $$ >{shlex.quote(str(pid_file))}\nexec sleep 60")
    env = script_env(record, fakes, NPU_WIZARD_RUN_DIR=str(tmp_path / "run"), NPU_WIZARD_SAVE_GRACE="60s")
    script = subprocess.Popen(
        ["bash", str(project / "launch" / "node0.sh")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(lambda: pid_file.exists() and pid_file.read_text().strip() != "")
        script.send_signal(signal.SIGTERM)
        out, _ = script.communicate(timeout=20)
    finally:
        if script.poll() is None:
            script.kill()
    assert "node 0: NOTE: NPU_WIZARD_SAVE_GRACE=60s is not a whole number of seconds: using 60" in out.splitlines()
    # was "(SIGTERM; killed after 60ss)", then "60s: value too great for base" ended the trap before
    # its grace and KILL (a launcher ignoring TERM was never killed) and its preempted check
    assert "node 0: got SIGTERM; asking 1 process(es) to save a checkpoint and stop (SIGTERM; killed after 60s)" in out
    assert "value too great" not in out
    assert script.returncode == 143, out
    assert not alive(int(pid_file.read_text()))


# ---- the Slurm batch script, with srun, scancel and scontrol stood in for ----------------

SRUN = """\
#!/usr/bin/env bash
# srun passes a SIGTERM of its own on to the ranks, which save and exit: here they are told to end
trap 'touch "$FAKE_RECORD/go"' TERM
touch "$FAKE_RECORD/srun.started"
until [[ -e "$FAKE_RECORD/go" ]]; do sleep 0.05; done
exit "$FAKE_SRUN_EXIT"
"""
SCANCEL = '#!/usr/bin/env bash\nprintf \'%s\\n\' "$@" >"$FAKE_RECORD/scancel.argv"\ntouch "$FAKE_RECORD/go"\n'
SCONTROL = '#!/usr/bin/env bash\nprintf \'%s\\n\' "$@" >>"$FAKE_RECORD/scontrol.argv"\n'


def start_batch(
    tmp_path: Path, srun_exit: int, earlier: bool = False, session: bool = False
) -> tuple[subprocess.Popen[str], Path]:
    """Start slurm/job.sbatch of a 2x2 project (after an earlier attempt's preemption); (process, record folder).
    Its TMPDIR is tmp_path/tmp."""
    project = render_slurm(tmp_path / "p")
    record, run_dir, fakes = tmp_path / "record", tmp_path / "run", tmp_path / "fakebin"
    for folder in (record, fakes, tmp_path / "tmp"):
        folder.mkdir()
    for name, text in (("srun", SRUN), ("scancel", SCANCEL), ("scontrol", SCONTROL)):
        (fakes / name).write_text(text)
        (fakes / name).chmod(0o755)
    if earlier:
        old_preemption(run_dir, range(4))
    env = script_env(
        record,
        fakes,
        SLURM_SUBMIT_DIR=str(project),
        SLURM_JOB_ID="42",
        NPU_WIZARD_RUN_DIR=str(run_dir),
        FAKE_SRUN_EXIT=str(srun_exit),
        TMPDIR=str(tmp_path / "tmp"),
    )
    batch = subprocess.Popen(
        ["bash", str(project / "slurm" / "job.sbatch")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=session,  # a process group of its own, which the test may signal whole
    )
    return batch, record


def finish(batch: subprocess.Popen[str]) -> str:
    try:
        out, _ = batch.communicate(timeout=30)
    finally:
        if batch.poll() is None:
            batch.kill()
    return out


def test_the_time_limits_usr1_requeues_a_job_whose_ranks_saved(tmp_path: Path) -> None:
    batch, record = start_batch(tmp_path, 75)
    wait_for(lambda: (record / "srun.started").exists())
    batch.send_signal(signal.SIGUSR1)  # the stand-in scancel lets srun end, with 75 (every node saved)
    out = finish(batch)
    assert batch.returncode == 75, out
    assert (record / "scontrol.argv").read_text().split() == ["requeue", "42"]


def test_a_plain_scancel_term_is_not_requeued(tmp_path: Path) -> None:
    batch, record = start_batch(tmp_path, 75)
    wait_for(lambda: (record / "srun.started").exists())
    batch.send_signal(signal.SIGTERM)
    (record / "go").touch()  # Slurm's TERM to the step: the ranks saved, every node exits 75
    out = finish(batch)
    # was "srun exited with code -1" and 255 in about 1 run of 20 on a busy machine: bash lost srun's code where
    # the TERM's trap interrupted the wait as srun exited; the job running srun now writes its code to a file
    assert "job 42: srun exited with code 75\n" in out
    assert batch.returncode == 75, out
    assert not (record / "scontrol.argv").exists(), out  # was requeued: back in the queue after scancel
    assert "not requeued" in out
    assert list((tmp_path / "tmp").iterdir()) == []  # the file srun's code went through is removed


def test_scancels_term_to_every_process_of_the_batch_step_keeps_the_code_srun_exits_with(tmp_path: Path) -> None:
    batch, record = start_batch(tmp_path, 75, session=True)
    wait_for(lambda: (record / "srun.started").exists())
    os.killpg(batch.pid, signal.SIGTERM)  # as scancel signals the batch step: the script, the job running srun, srun
    out = finish(batch)
    assert "job 42: srun exited with code 75\n" in out  # the job running srun waits for it, and keeps its code
    assert batch.returncode == 75, out
    assert not (record / "scontrol.argv").exists(), out
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_later_attempt_dying_before_started_is_not_requeued_on_the_last_attempts_events(tmp_path: Path) -> None:
    batch, record = start_batch(tmp_path, 1, earlier=True)
    wait_for(lambda: (record / "srun.started").exists())
    batch.send_signal(signal.SIGUSR1)  # the time limit again; the ranks hung in init and never saved: srun fails
    out = finish(batch)
    assert batch.returncode == 1, out  # was 75 and requeued: for ever
    assert not (record / "scontrol.argv").exists(), out


def test_the_readmes_say_no_rank_can_save_on_a_stop_signal_while_a_peer_is_dead(tmp_path: Path) -> None:
    from tests.factories import answers
    from wizard.render.render import render

    project = render(answers(), tmp_path / "p").project_dir
    root = Path(__file__).resolve().parents[1]
    for readme in (root / "docs" / "restarts.md", project / "README.md"):
        text = " ".join(readme.read_text().split())
        assert "No rank can save while a peer is dead" in text, readme
        assert "HCCL_EXEC_TIMEOUT" in text, readme
