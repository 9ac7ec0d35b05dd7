"""The rendered projects train for real: every launcher on two nodes of two processes, every AMP setting.

CPU and gloo, real processes, nodes simulated on 127.0.0.1. Each run is
bounded in time; the ranks must end with identical weights and a falling loss.
A launcher's run has two nodes of two processes: the launcher's local ranks
(one node, two processes) and the node scripts, the rendezvous across nodes and
the rank numbering (two nodes) in one run, as the rendered scripts are the
same for either, only their numbers differ. Where the launcher is not the
point (resuming, a corrupt checkpoint) a run is one node of two processes under
the shell launcher: no launcher agent importing torch beside the ranks (issue 35).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from tests.doubles.torch_npu_double import install_torch_npu_double
from tests.runs import (
    events_of,
    kill_groups,
    kinds,
    node_env,
    render_cpu,
    run_project,
    start_nodes,
    started_pid,
    wait_for,
    wait_nodes,
)

pytestmark = pytest.mark.slow

DIGEST = "weights_sha256"

# (launcher, amp): every launcher on two nodes of two processes, every AMP setting more than once (torch-npu-run's
# run, through a release's torch_npu_run, is test_a_releases_torch_npu_run_parses_the_scripts_flags_and_trains; its
# torchrun fallback trains in test_script_launch and test_run_supervision)
RUNS = [("shell", "fp16"), ("mp-spawn", "bf16"), ("torch-launch", "off"), ("torchrun", "fp16")]


def assert_trained(project: Path, run_dir: Path, world_size: int, per_node: int | None = None) -> None:
    """Every rank started and finished, agrees on the weights, the loss fell, a checkpoint exists.

    `per_node`: each node's processes; given, every rank must say the node and local rank its launcher gave it.
    """
    events = events_of(run_dir)
    assert sorted(events) == list(range(world_size))
    for rank, rank_events in events.items():
        assert kinds(rank_events, "started"), f"rank {rank} never started"
        assert kinds(rank_events, "finished"), f"rank {rank} never finished"
        if per_node is not None:
            started = kinds(rank_events, "started")[0]
            where = (started["node"], started["local_rank"], started["world_size"])
            assert where == (rank // per_node, rank % per_node, world_size), f"rank {rank}: {started}"
    digests = {rank: kinds(rank_events, "finished")[-1][DIGEST] for rank, rank_events in events.items()}
    assert len(set(digests.values())) == 1, digests
    losses = [event["loss"] for event in kinds(events[0], "step")]
    assert len(losses) >= 4
    assert sum(losses[-2:]) < sum(losses[:2]), losses
    assert list((project / "checkpoints").glob("*.pt")), "no checkpoint written"


# The first run of a resume test is held at each rank's 40th step, past its first checkpoint (step 32), by a
# rehearsed hang (docs/rehearse.md): killed there, it cannot have finished first, however slowly the test's loop
# sees the checkpoint (once, with both cores busy beside the suite, a job of 128 steps ran to its end before it did).
# The second run, without it, trains to the end.
HELD = {"NPU_WIZARD_REHEARSE": "hang:*:40"}


def kill_once(
    start: Callable[[BinaryIO], list[subprocess.Popen[bytes]]], saved: Callable[[], Any], tmp_path: Path
) -> Any:
    """Start the nodes, writing to first.log (nothing reads a pipe while this polls); SIGKILL their process groups
    once `saved()` holds (600 s at most, a safety net); return what it gave."""
    with (tmp_path / "first.log").open("wb") as log:
        nodes = start(log)
        try:
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline and not saved():
                time.sleep(0.05)
        finally:
            kill_groups(nodes)
    found = saved()
    said = (tmp_path / "first.log").read_text(errors="replace")[-3000:]
    assert found, f"no checkpoint before the deadline; the nodes said:\n{said}"
    return found


@pytest.mark.parametrize(("launcher", "amp"), RUNS, ids=[f"{name}-{amp}" for name, amp in RUNS])
def test_launch_scripts_train_two_nodes_of_two_processes_to_the_end(launcher: str, amp: str, tmp_path: Path) -> None:
    project = render_cpu(tmp_path, launcher, nodes=2, amp=amp, devices_per_node=2)
    results = run_project(project, tmp_path / "run")
    for node, (code, output) in enumerate(results):
        assert code == 0, f"node {node} exited {code}:\n{output[-3000:]}"
    assert_trained(project, tmp_path / "run", world_size=4, per_node=2)


def test_a_releases_torch_npu_run_parses_the_scripts_flags_and_trains(tmp_path: Path) -> None:
    # The torch_npu double's torch_npu_run (2.9.0.post6, the default) parses the flags as that
    # release does, then runs the workers through torchrun with the environment its agent sets: torch-npu-run's
    # launch scripts train two nodes of two processes to the end.
    project = render_cpu(tmp_path, "torch-npu-run", nodes=2, devices_per_node=2, amp="bf16")
    double = install_torch_npu_double(tmp_path, "2.9.0.post6")
    env = double.env(node_env(tmp_path / "run"), TORCH_NPU_DOUBLE_RUN="torchrun")
    extra = {name: env[name] for name in ("PATH", "PYTHONPATH", "TORCH_NPU_DOUBLE_RECORD", "TORCH_NPU_DOUBLE_RUN")}
    for node, (code, output) in enumerate(run_project(project, tmp_path / "run", **extra)):
        assert code == 0, f"node {node} exited {code}:\n{output[-3000:]}"
        assert "torch_npu_run not found" not in output
    assert sorted(run["argv"][:6] for run in double.runs()) == [
        ["--nnodes", "2", "--node-rank", str(n), "--nproc-per-node", "2"] for n in (0, 1)
    ]
    assert all(run["worker_env"]["TORCH_NPU_USE_PARALLEL_TCPSTORE"] == "True" for run in double.runs())
    assert_trained(project, tmp_path / "run", world_size=4, per_node=2)


@pytest.mark.parametrize(("exec_timeout", "process_group"), [(0, 604800), (3600, 3720)])
def test_the_process_group_outwaits_hccl_exec_timeout(tmp_path: Path, exec_timeout: int, process_group: int) -> None:
    # HCCL_EXEC_TIMEOUT=0 (never) must not leave PyTorch's 30-minute default in force
    answers = {"network.exec_timeout": exec_timeout}
    project = render_cpu(tmp_path, "torchrun", devices_per_node=1, epochs=1, samples=64, answers=answers)
    [(code, output)] = run_project(project, tmp_path / "run")
    assert code == 0, output[-3000:]
    rank0 = (tmp_path / "run" / "logs" / "rank-0.log").read_text().splitlines()
    assert f"collectives time out after {process_group} s" in rank0


def test_a_single_process_job_trains_without_ddp(tmp_path: Path) -> None:
    project = render_cpu(tmp_path, "torchrun", devices_per_node=1)
    for node, (code, output) in enumerate(run_project(project, tmp_path / "run")):
        assert code == 0, f"node {node} exited {code}:\n{output[-3000:]}"
    assert_trained(project, tmp_path / "run", world_size=1)


def test_a_killed_job_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    # 64 steps an epoch, a checkpoint every 32: the first run is held past its first checkpoint and killed there;
    # the second trains the rest. Resuming is the ranks' own: one node of two under the shell launcher resumes as
    # any launcher's ranks do.
    project = render_cpu(tmp_path, "shell", samples=2048, epochs=2, checkpoint_every=32)
    first_run = tmp_path / "first"
    saved = kill_once(
        lambda log: start_nodes(project, node_env(first_run, **HELD), output=log),
        lambda: first_run.exists() and kinds(events_of(first_run).get(0, []), "checkpoint"),
        tmp_path,
    )
    assert not kinds(events_of(first_run)[0], "finished")

    second_run = tmp_path / "second"
    for node, (code, output) in enumerate(wait_nodes(start_nodes(project, node_env(second_run)), 600)):
        assert code == 0, f"node {node} exited {code}:\n{output[-3000:]}"
    resumed = kinds(events_of(second_run)[0], "started")[0]
    assert resumed["resumed_step"] >= saved[0]["step"]
    first_step = kinds(events_of(second_run)[0], "step")[0]["step"]
    assert first_step > resumed["resumed_step"]
    assert_trained(project, second_run, world_size=2)


def test_a_rank_that_crashes_leaves_every_threads_python_stack_in_its_log(tmp_path: Path) -> None:
    # SIGABRT, as a native library's failed check raises it, to a rank past its first logged step (step 4) and held
    # at its 6th by a rehearsed hang, so that it cannot end first: faulthandler writes where each thread was into
    # the rank's log (wherever the signal finds the main thread, train.py is on its stack)
    project = render_cpu(tmp_path, "shell", devices_per_node=1, samples=256)
    run_dir = tmp_path / "run"
    env = node_env(run_dir, NPU_WIZARD_REHEARSE="hang:0:6")
    log = run_dir / "logs" / "rank-0.log"
    with (tmp_path / "node.log").open("wb") as output:
        [node] = start_nodes(project, env, output=output)
        try:
            os.kill(wait_for(lambda: started_pid(run_dir, 0), 600, "rank 0's first step"), signal.SIGABRT)
            assert node.wait(timeout=600) != 0
        finally:
            kill_groups([node])
    # the rank's tee (a session of its own) may still be copying the report: its last line ends it
    wait_for(lambda: "\nExtension modules:" in log.read_text(), 60, "faulthandler's report in the rank's log")
    said = log.read_text()
    crash = said.split("Fatal Python error: Aborted", 1)[-1]
    assert "Fatal Python error: Aborted" in said and f'File "{project / "train.py"}"' in crash, said[-3000:]
    assert "Thread 0x" in crash and "(most recent call first)" in crash, crash


def test_nodes_without_shared_storage_each_keep_checkpoints_and_resume(tmp_path: Path) -> None:
    # 64 steps an epoch: still running when both nodes' first checkpoint (step 32) lands
    project = render_cpu(tmp_path, "shell", nodes=2, devices_per_node=1, samples=2048, epochs=2, checkpoint_every=32)
    folders = [tmp_path / "node0-checkpoints", tmp_path / "node1-checkpoints"]

    def start(run_dir: Path, output: Any = subprocess.PIPE, **extra: str) -> list[subprocess.Popen[bytes]]:
        return [
            subprocess.Popen(
                ["bash", str(project / "launch" / f"node{node}.sh")],
                env=node_env(run_dir, NPU_WIZARD_CHECKPOINT_DIR=str(folder), **extra),
                start_new_session=True,
                stdout=output,
                stderr=subprocess.STDOUT,
            )
            for node, folder in enumerate(folders)
        ]

    kill_once(  # each node's first rank saves its own checkpoint
        lambda log: start(tmp_path / "first", log, **HELD),
        lambda: all(list(folder.glob("step-*.pt")) for folder in folders),
        tmp_path,
    )

    for node, (code, output) in enumerate(wait_nodes(start(tmp_path / "second"), 600)):
        assert code == 0, f"node {node} exited {code}:\n{output[-3000:]}"
    resumed = {rank: kinds(e, "started")[0]["resumed_step"] for rank, e in events_of(tmp_path / "second").items()}
    assert len(set(resumed.values())) == 1 and min(resumed.values()) > 0, resumed
    assert_trained_without_checkpoint_folder(tmp_path / "second", world_size=2)


def test_fsdp2_without_a_folder_every_rank_reaches_saves_the_whole_state_per_node_and_resumes_from_it(
    tmp_path: Path,
) -> None:
    # two hosts keep their own copies of the project (no folder every rank reaches): the train.py rendered for them
    # gathers the whole state onto each node's first rank at every save. Here both nodes run on 127.0.0.1, each
    # with its own checkpoint folder, from that very train.py
    answers = {"samples": 2048, "epochs": 2, "checkpoint_every": 32, "parallelism": "fsdp2"}
    project = render_cpu(tmp_path / "here", "shell", nodes=2, devices_per_node=1, **answers)
    hosts = {"project_name": project.name, "network.host_ips": ["10.0.0.1", "10.0.0.2"]}
    apart = render_cpu(tmp_path / "apart", "shell", nodes=2, devices_per_node=1, answers=hosts, **answers)
    train = (apart / "train.py").read_text()
    assert "SHARDED_CHECKPOINTS = False" in train and "SHARDED_CHECKPOINTS = True" in (project / "train.py").read_text()
    (project / "train.py").write_text(train)
    folders = [tmp_path / "node0-checkpoints", tmp_path / "node1-checkpoints"]

    def start(run_dir: Path, output: Any = subprocess.PIPE, **extra: str) -> list[subprocess.Popen[bytes]]:
        return [
            subprocess.Popen(
                ["bash", str(project / "launch" / f"node{node}.sh")],
                env=node_env(run_dir, NPU_WIZARD_CHECKPOINT_DIR=str(folder), **extra),
                start_new_session=True,
                stdout=output,
                stderr=subprocess.STDOUT,
            )
            for node, folder in enumerate(folders)
        ]

    kill_once(
        lambda log: start(tmp_path / "first", log, **HELD),
        lambda: all(list(folder.glob("step-*.pt")) for folder in folders),
        tmp_path,
    )
    for folder in folders:  # one whole file per node, no step folder of shards
        assert list(folder.glob("step-*.pt")) and not list(folder.glob("step-*[0-9]")), list(folder.iterdir())

    for node, (code, output) in enumerate(wait_nodes(start(tmp_path / "second"), 600)):
        assert code == 0, f"node {node} exited {code}:\n{output[-3000:]}"
    resumed = {rank: kinds(e, "started")[0]["resumed_step"] for rank, e in events_of(tmp_path / "second").items()}
    assert len(set(resumed.values())) == 1 and min(resumed.values()) >= 32, resumed
    assert_trained_without_checkpoint_folder(tmp_path / "second", world_size=2)


def assert_trained_without_checkpoint_folder(run_dir: Path, world_size: int) -> None:
    """Every rank finished with the same weights (checkpoints live outside the project here)."""
    events = events_of(run_dir)
    assert sorted(events) == list(range(world_size))
    digests = {rank: kinds(rank_events, "finished")[-1][DIGEST] for rank, rank_events in events.items()}
    assert len(set(digests.values())) == 1, digests


def test_a_corrupt_newest_checkpoint_is_set_aside_and_the_job_resumes_from_the_one_before(tmp_path: Path) -> None:
    # 16 steps an epoch, a checkpoint every 8 steps, 2 kept; one node of two ranks that share the checkpoint folder
    project = render_cpu(tmp_path, "shell", samples=512)
    for node, (code, output) in enumerate(run_project(project, tmp_path / "first")):
        assert code == 0, f"node {node} exited {code}:\n{output[-3000:]}"
    newest = project / "checkpoints" / "step-000000032.pt"
    newest.write_bytes(newest.read_bytes()[:1000])  # truncated, as a full disk or a killed copy leaves it

    results = run_project(project, tmp_path / "second")
    for node, (code, output) in enumerate(results):
        assert code == 0, f"node {node} exited {code}:\n{output[-3000:]}"
    [(_, output)] = results  # whichever rank renames the shared file says so, on the node's output
    assert f"checkpoint {newest} cannot be loaded; kept aside as {newest}.unreadable" in output
    assert f"resuming from {project / 'checkpoints' / 'step-000000024.pt'}: epoch 2, step 24" in output
    assert (project / "checkpoints" / "step-000000032.pt.unreadable").stat().st_size == 1000
    started = {rank: kinds(e, "started")[0]["resumed_step"] for rank, e in events_of(tmp_path / "second").items()}
    assert started == dict.fromkeys(range(2), 24)
