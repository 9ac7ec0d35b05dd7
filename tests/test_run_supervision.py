"""`npu-wizard run` supervising real CPU jobs: kills, hangs, Ctrl-C, a remote node, restarts.

Real processes on 127.0.0.1, gloo on the CPU. Each test bounds every wait and
kills whatever of its job is left, whatever happens.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
from pathlib import Path

import pytest

from tests.runs import (
    RunEnded,
    clean_up,
    events_of,
    kinds,
    leftover_processes,
    node_env,
    processes_in,
    render_cpu,
    run_dirs,
    start_runner,
    started_pid,
    wait_for,
)

pytestmark = pytest.mark.slow

START_S = 180  # a loaded two-core machine takes a while to start four torch processes
LONG_RUN = {"samples": 65536, "epochs": 2}  # 2048 steps a rank: still running when the test acts


def summary_of(run_dir: Path) -> dict:
    """The summary.json the runner wrote at the end."""
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.xdist_group("finished-2x2-run")
def test_a_normal_run_writes_a_correct_summary(finished_2x2_run: RunEnded) -> None:
    run = finished_2x2_run  # tests/conftest.py: npu-wizard run of a 2 x 2 torchrun project, to its end
    assert run.code == 0, run.stdout + run.stderr
    run_dir, output = run.run_dir, run.stdout
    summary = summary_of(run_dir)
    steps = 1024 // 16 // 4 * 2  # samples / batch / world size x epochs
    assert summary["outcome"] == "finished"
    assert summary["world_size"] == 4
    assert summary["steps"] == steps
    assert {rank: info["state"] for rank, info in summary["ranks"].items()} == dict.fromkeys("0123", "finished")
    assert [info["node"] for info in summary["ranks"].values()] == [0, 0, 1, 1]
    assert 0 < summary["time_to_first_step_s"] < summary["wall_s"]
    assert summary["samples_per_s"] == pytest.approx(sum(i["samples_per_s"] for i in summary["ranks"].values()))
    first_loss = kinds(events_of(run_dir)[0], "step")[0]["loss"]
    assert summary["final_loss"] < first_loss
    assert summary["restarts"] == 0 and summary["failure"] is None
    assert "outcome: finished" in output and "per rank:" in output
    assert "npu-wizard bundle" not in output  # the bundle command is printed only after a failure or a hang


def test_kill_9_of_a_rank_stops_the_job_and_names_that_rank(tmp_path: Path) -> None:
    # No bound in seconds (a loaded machine stretches any): the runner must stop every process itself and name
    # the rank; how fast a stop is belongs to benchmarks/.
    project = render_cpu(tmp_path, "torchrun", nodes=2, **LONG_RUN)
    runner = start_runner(project, "--interval", "1")
    try:
        run_dir = wait_for(lambda: run_dirs(project), 60, "the run folder")[0]
        victim = wait_for(lambda: started_pid(run_dir, 3), START_S, "rank 3 to train")
        os.kill(victim, signal.SIGKILL)
        output, _ = runner.communicate(timeout=120)
        assert not leftover_processes(project)
    finally:
        clean_up(project, runner)
    assert runner.returncode == 3, output
    assert f"root cause: rank 3 (node 1): its process {victim} vanished" in output
    assert summary_of(run_dir)["failure"]["rank"] == 3


def test_a_stopped_rank_is_flagged_hung_and_abort_on_hang_ends_the_job(tmp_path: Path) -> None:
    project = render_cpu(tmp_path, "shell", nodes=2, **LONG_RUN)
    runner = start_runner(project, "--interval", "1", "--hang-after", "4", "--abort-on-hang")
    try:
        run_dir = wait_for(lambda: run_dirs(project), 60, "the run folder")[0]
        victim = wait_for(lambda: started_pid(run_dir, 2), START_S, "rank 2 to train")
        os.kill(victim, signal.SIGSTOP)
        output, _ = runner.communicate(timeout=60)
        assert not leftover_processes(project)
    finally:
        clean_up(project, runner)
    assert "HUNG: rank 2 (node 1) is hung: no heartbeat or step for" in output
    assert runner.returncode == 3, output
    summary = summary_of(run_dir)
    assert summary["outcome"] == "hung"
    assert summary["failure"]["rank"] == 2
    assert f"for whoever must help: npu-wizard bundle {run_dir}\n" in output  # after a hang, as after a failure


@pytest.mark.xdist_group("interrupted-2x2-run")
def test_sigint_to_the_runner_has_every_rank_save_then_stops_every_process_and_exits_130(
    interrupted_2x2_run: RunEnded,
) -> None:
    run = interrupted_2x2_run  # tests/conftest.py: npu-wizard run of a long 2 x 2 job, Ctrl-C once rank 0 trains
    assert run.alive_before  # the job ran when SIGINT came
    assert run.left == []  # and nothing of it was left when the runner returned
    assert run.code == 130, run.stdout
    summary = summary_of(run.run_dir)
    assert summary["outcome"] == "preempted"  # the ranks were sent SIGTERM first, and saved
    step = summary["preempted"]["step"]
    assert summary["preempted"]["signal"] == "SIGTERM"
    assert "stopping: every rank was sent SIGTERM to save a checkpoint at its next logged step; what still runs " in (
        run.stdout
    )
    assert f"interrupted: every rank saved a checkpoint at step {step} and exited" in run.stdout


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)], ids=["TERM", "HUP"])
def test_sigterm_or_sighup_to_the_runner_stops_every_process_like_ctrl_c(
    tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    # one node of two ranks under torchrun, which passes the signal on: the runner stops every node alike whatever
    # stopped it (job.stop), and two nodes stopped by Ctrl-C are test_sigint_to_the_runner_has_every_rank_save...'s
    project = render_cpu(tmp_path, "torchrun", **LONG_RUN)
    runner = start_runner(project, "--interval", "1")
    try:
        run_dir = wait_for(lambda: run_dirs(project), 60, "the run folder")[0]
        wait_for(lambda: started_pid(run_dir, 1), START_S, "rank 1 to train")
        assert len(processes_in(project)) >= 4  # the launch script, torchrun's agent, 2 ranks (and tees)
        runner.send_signal(sig)
        output, _ = runner.communicate(timeout=60)
        assert not processes_in(project)
    finally:
        clean_up(project, runner)
    assert runner.returncode == code, output
    step = summary_of(run_dir)["preempted"]["step"]  # torchrun passed the TERM on; each rank saved, then exited
    assert f"stopped by {sig.name}: every rank saved a checkpoint at step {step} and exited" in output
    assert summary_of(run_dir)["outcome"] == "preempted"
    assert "outcome: preempted" in output
    assert f"preempted at step {step} (SIGTERM), checkpoint saved" in output


def test_node_0_sees_a_stopped_rank_of_node_1_through_the_status_stream(tmp_path: Path) -> None:
    project = render_cpu(tmp_path, "torchrun", nodes=2, **LONG_RUN)
    # both runners hand their ranks the same run token, as every node's runner must
    env = node_env(tmp_path / "unused", NPU_WIZARD_STATUS_TOKEN=secrets.token_hex(16))
    node0 = start_runner(project, "--node", "0", "--interval", "1", "--hang-after", "4", "--abort-on-hang", env=env)
    wait_for(lambda: run_dirs(project), 60, "node 0's run folder")
    # node 1 sees its stopped rank too, later: node 0 must tell first
    node1 = start_runner(project, "--node", "1", "--interval", "1", "--hang-after", "15", "--abort-on-hang", env=env)
    try:
        node0_dir = run_dirs(project)[0]
        node1_dir = wait_for(lambda: run_dirs(project)[1:], 60, "node 1's run folder")[0]
        victim = wait_for(lambda: started_pid(node1_dir, 3), START_S, "rank 3 to train")
        assert not (node0_dir / "events" / "rank-3.jsonl").exists()  # node 0 can learn of rank 3 only by the stream
        os.kill(victim, signal.SIGSTOP)
        output, _ = node0.communicate(timeout=60)
        node1.communicate(timeout=60)
        assert not leftover_processes(project)
    finally:
        clean_up(project, node0, node1)
    assert "HUNG: rank 3 (node 1) is hung" in output
    assert node0.returncode == 3, output
    summary = summary_of(node0_dir)
    assert summary["ranks"]["3"]["node"] == 1
    assert summary["failure"]["rank"] == 3


# torch-npu-run falls back to torchrun here (no torch_npu): the restart takes the same path
@pytest.mark.parametrize("launcher", ["torchrun", "torch-npu-run"])
def test_max_restarts_resumes_from_the_checkpoint_after_a_kill(tmp_path: Path, launcher: str) -> None:
    # 128 steps an epoch: still running when the first checkpoint (step 32) lands, few left to train after the restart
    project = render_cpu(tmp_path, launcher, nodes=1, samples=4096, epochs=2, checkpoint_every=32)
    runner = start_runner(project, "--interval", "2", "--max-restarts", "1")
    try:
        run_dir = wait_for(lambda: run_dirs(project), 60, "the run folder")[0]
        saved = wait_for(lambda: kinds(events_of(run_dir).get(0, []), "checkpoint"), START_S, "a checkpoint")
        os.kill(kinds(events_of(run_dir)[1], "started")[-1]["pid"], signal.SIGKILL)
        output, _ = runner.communicate(timeout=300)
    finally:
        clean_up(project, runner)
    assert runner.returncode == 0, output
    restarted = kinds(events_of(run_dir)[0], "started")
    assert len(restarted) == 2
    assert restarted[1]["resumed_step"] >= saved[0]["step"] > 0
    summary = summary_of(run_dir)
    assert summary["outcome"] == "finished" and summary["restarts"] == 1


def test_a_node_that_never_joins_is_named_at_the_start_up_deadline(tmp_path: Path) -> None:
    project = render_cpu(tmp_path, "shell", nodes=2, **LONG_RUN)
    # node 1 is never started: node 0's ranks wait at init for ever, heartbeat-less "starting"
    args = ("--node", "0", "--interval", "1", "--hang-after", "20", "--abort-on-hang", "--start-timeout", "20")
    node0 = start_runner(project, *args)
    try:
        output, _ = node0.communicate(timeout=300)
        assert not leftover_processes(project)
    finally:
        clean_up(project, node0)
    assert node0.returncode == 3, output
    # on a loaded machine node 0's own ranks may still be importing torch: they are named too, first
    assert "START-UP DEADLINE: " in output
    assert "\nnode 1 never joined: no status from its ranks 2, 3 within 20s" in output.replace("DEADLINE: ", "\n")
    assert "root cause: the job: start-up deadline passed: " in output
    summary = summary_of(run_dirs(project)[0])
    # node 0's ranks are listed too where they were still importing torch at the deadline (a loaded machine)
    assert summary["outcome"] == "hung" and summary["never_reported"] in ([2, 3], [0, 1, 2, 3], [0, 2, 3], [1, 2, 3])


def test_a_node_this_runner_started_whose_ranks_never_connect_is_not_said_to_never_join(tmp_path: Path) -> None:
    project = render_cpu(tmp_path, "torchrun", nodes=1)
    # the ranks stall before they import anything (a user's slow import, a hung mount): torchrun runs on
    train = project / "train.py"
    train.write_text("import time\n\ntime.sleep(3600)\n" + train.read_text())
    args = ("--interval", "1", "--hang-after", "20", "--abort-on-hang", "--start-timeout", "10")
    runner = start_runner(project, *args)
    try:
        output, _ = runner.communicate(timeout=300)
        wait_for(lambda: not leftover_processes(project), 30, "every process of the job to end")
    finally:
        clean_up(project, runner)
    assert runner.returncode == 3, output
    (run_dir,) = run_dirs(project)
    assert "never joined" not in output
    said = (
        "node 0: no status from its ranks 0, 1 within 10s; its launch script is running but its ranks never "
        f"connected to this runner; see {run_dir / 'logs' / 'node-0.log'}"
    )
    assert f"START-UP DEADLINE: {said}" in output
    assert f"root cause: the job: start-up deadline passed: {said}" in output
