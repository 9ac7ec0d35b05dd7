"""Watching a user's own script: what the monitor knows of ranks that send no steps, or steps through report.

Real processes: torchrun starts tests/user_scripts/*.py through runtime.userscript
(as the launch scripts of a project with training.script do), and the monitor's
state, progress line and summary are read from what the ranks wrote. Such scripts
run through `npu-wizard run` end to end in tests/test_user_script.py.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.events import read_events
from tests.runs import free_port, kinds, wait_for
from wizard.monitor.attach import RunFolder, watch_plain
from wizard.monitor.state import FINISHED, RUNNING, STALLED, JobState
from wizard.monitor.summary_text import failure_report, format_summary, progress_line, summarize

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
    assert "rank 1 (node 0): finished (exit 0), step 16, loss " in words


TALKER = """
import os, pathlib, sys, time

def wait(name):
    deadline = time.monotonic() + 120
    while not pathlib.Path(name).exists() and time.monotonic() < deadline:
        time.sleep(0.05)

rank = int(os.environ["RANK"])
print(f"rank {rank} up", flush=True)
if rank == 1:
    wait("stop")  # silent, alive: a rank stuck in its own code
else:
    while not pathlib.Path("stop").exists():
        print("working", flush=True)
        time.sleep(0.1)
"""


def start_shim_ranks(folder: Path, script: str, world_size: int, **env: str) -> list[subprocess.Popen[bytes]]:
    """`python -m runtime.userscript script.py` once per rank, as a launcher starts them (run folder folder/run)."""
    (folder / "script.py").write_text(script)
    return [
        subprocess.Popen(
            [sys.executable, "-m", "runtime.userscript", "script.py"],
            cwd=folder,
            env={
                **os.environ,
                "NPU_WIZARD_RUN_DIR": str(folder / "run"),
                "NPU_WIZARD_HEARTBEAT_S": "0.2",
                "PYTHONPATH": str(REPO),
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(world_size),
                "LOCAL_WORLD_SIZE": str(world_size),
                **env,
            },
            stdout=subprocess.DEVNULL,
        )
        for rank in range(world_size)
    ]


def test_a_script_without_steps_is_judged_by_when_it_last_printed(tmp_path: Path) -> None:
    ranks = start_shim_ranks(tmp_path, TALKER, 2)
    try:
        wait_for(lambda: (tmp_path / "run" / "events" / "rank-1.jsonl").is_file(), 60, "rank 1's events")
        folder = RunFolder(tmp_path / "run", hang_after=1.0)

        def rank_1_stalled_rank_0_long_up() -> float | None:
            folder.tick()
            started = folder.state.ranks[0].started_at  # wall time, as the rank stamped it
            long_up = started is not None and folder.clock() - started > 1.5
            now = folder.state.now()  # silences are judged on the state's own (monotonic) clock
            return now if long_up and folder.state.state(1, now) == STALLED else None

        now = wait_for(rank_1_stalled_rank_0_long_up, 60, "rank 1, silent, to be stalled")
        # rank 0 sent no step either, for longer than the hang timeout, but it prints: it runs
        assert folder.state.state(0, now) == RUNNING
        assert "ranks 1 are alive but printed nothing for 1s" in folder.state.hang_report(now)
        line = progress_line(folder.state, 3.0, now)
        assert "2 ranks: running 1, stalled 1 | no steps reported; quietest: rank 1, printed " in line
    finally:
        (tmp_path / "stop").touch()
        codes = [rank.wait(timeout=60) for rank in ranks]
    assert codes == [0, 0]
    out = io.StringIO()
    watch_plain(RunFolder(tmp_path / "run"), out=out, poll=0.05)
    words = out.getvalue()
    assert "outcome: finished" in words
    assert "  rank 0 (node 0): finished (exit 0), no step reported, last printed " in words
    assert "  rank 1 (node 0): finished (exit 0), no step reported, last printed " in words
    assert "stragglers: not judged: no rank reported a step" in words  # never "no straggler"


# A script that sends its steps as the call does, without total_steps (with a loss, or with none).
STEPPER = """
from runtime import report

for step in range(1, 9):
    report.step(step, {loss}samples=4)
"""


@pytest.mark.parametrize("loss", ["loss=1.0 / step, ", ""], ids=["loss", "no-loss"])
def test_steps_sent_without_their_total_say_how_to_get_an_eta(tmp_path: Path, loss: str) -> None:
    (rank,) = start_shim_ranks(tmp_path, STEPPER.format(loss=loss), 1, NPU_WIZARD_REPORT_S="0")
    assert rank.wait(timeout=120) == 0
    found = read_events(tmp_path / "run")[0]
    assert [e["step"] for e in kinds(found, "step")] == list(range(1, 9))
    # mid-run, as the monitor saw it after step 8
    last = max(i for i, e in enumerate(found) if e.get("event") == "step")
    state = JobState(1)
    state.ingest_all(found[: last + 1])
    line = progress_line(state, 5.0, now=found[last]["time"])
    assert "1 ranks: running 1 | step 8" in line and "step 8/" not in line
    assert line.endswith(" | ETA: pass total_steps= to report.step"), line


@pytest.mark.slow
def test_the_summary_names_the_failing_rank_and_quotes_its_traceback(tmp_path: Path) -> None:
    result = torchrun_script(tmp_path, "ddp_tutorial.py", "--epochs", "3", "--fail-rank", "1")
    assert result.returncode != 0
    out = io.StringIO()
    watch_plain(RunFolder(tmp_path / "run"), out=out, poll=0.05)
    words = out.getvalue()
    assert "outcome: failed" in words
    assert "failure: rank 1 (node 0): RuntimeError: rank 1: the loss went wrong after epoch 0" in words
    assert "  rank 1 (node 0): failed (exit 1), no step reported, last printed " in words
    # the last lines of rank 1's log: its traceback as python printed it (torch >= 2.2 puts [rank1]: before each line)
    quoted = words.split("last lines of rank 1's log:\n", 1)[1]
    assert 'File "ddp_tutorial.py", line ' in quoted
    assert quoted.rstrip().endswith("RuntimeError: rank 1: the loss went wrong after epoch 0")


SELF_KILLER = """
import os, pathlib, signal, time

rank = int(os.environ["RANK"])
print(f"rank {rank} up", flush=True)
if rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would: no word from the rank itself
deadline = time.monotonic() + 120
while time.monotonic() < deadline:  # until torchrun stops it
    time.sleep(0.1)
"""


@pytest.mark.slow
def test_a_killed_rank_is_reported_with_the_signal_its_launcher_saw(tmp_path: Path) -> None:
    (tmp_path / "run" / "logs").mkdir(parents=True)
    (tmp_path / "killer.py").write_text(SELF_KILLER)
    # torchrun's own output into the node's log, as launch/run-node.sh keeps it
    with (tmp_path / "run" / "logs" / "node-0.log").open("wb") as node_log:
        code = subprocess.run(
            [TORCHRUN, "--standalone", "--nproc-per-node=2", "-m", "runtime.userscript", "killer.py"],
            cwd=tmp_path,
            env={**os.environ, "NPU_WIZARD_RUN_DIR": str(tmp_path / "run"), "PYTHONPATH": str(REPO)},
            stdout=node_log,
            stderr=subprocess.STDOUT,
            timeout=300,
        ).returncode
    assert code != 0
    state = JobState(2, nodes=1)
    state.ingest_all(read_events(tmp_path / "run"))
    assert not kinds(read_events(tmp_path / "run")[1], "error")  # SIGKILL leaves the rank no last word
    state.vanished(1, state.ranks[1].last_seen or 0.0)  # what `run` does when rank 1's pid is gone
    failure = state.root_cause()
    assert failure is not None and (failure.rank, failure.kind) == (1, "vanished")
    report = failure_report(failure, tmp_path / "run")
    assert "root cause: rank 1 (node 0): its process " in report
    expected = "its launcher saw it end with signal 9 (SIGKILL: kill -9 or the OOM killer (dmesg says which))"
    assert f"{expected} (logs/node-0.log)" in report
