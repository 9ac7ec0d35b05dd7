"""A user's own DDP script, run for real through `npu-wizard run` on every engine this machine can host.

The script (tests/user_scripts/ddp_tutorial.py) is written as the PyTorch DDP
tutorial teaches: env:// ranks, its own model, data and loop, gloo on the CPU,
no npu-wizard import. The project names it as training.script; the launch
scripts start it through runtime/userscript.py. Engines: manual (2 simulated
nodes x 2 ranks on 127.0.0.1), ssh (the two network-namespace hosts of
tests/ssh_hosts.py) and Slurm (the two-node cluster of tests/slurm_cluster.py).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from tests.runs import (
    clean_up,
    events_of,
    free_port,
    kinds,
    leftover_processes,
    node_env,
    run_dirs,
    start_runner,
    wait_for,
)
from wizard.answers.model import resolve
from wizard.render.render import render

SCRIPTS = Path(__file__).resolve().parent / "user_scripts"
SCRIPT = "src/ddp_tutorial.py"
START_S = 240  # four torch processes on a loaded two-core machine
EPOCHS = 2


def render_own(tmp_path: Path, *, script: str = "ddp_tutorial.py", args: tuple[str, ...] = (), **raw: Any) -> Path:
    """2 nodes x 2 ranks on the CPU (torchrun, gloo) running the user's `script` as src/ddp_tutorial.py."""
    answers: dict[str, Any] = {
        "project_name": "own-ddp",
        "device": "cpu",
        "nodes": 2,
        "devices_per_node": 2,
        "launcher": "torchrun",
        "amp": "off",
        "network.host_ips": ["127.0.0.1", "127.0.0.1"],
        "network.master_port": free_port(),
        "training.script": SCRIPT,
        "training.script_args": ["--epochs", str(EPOCHS), *args],
        **raw,
    }
    project = render(resolve(answers), tmp_path).project_dir
    (project / "src").mkdir()
    shutil.copyfile(SCRIPTS / script, project / SCRIPT)
    return project


class Ended(NamedTuple):
    """How `npu-wizard run` ended, and what of the job was still alive right then."""

    code: int
    output: str
    run_dir: Path
    left: list[int]  # live processes of the job when run returned, before the test's clean-up killed any


def run_to_the_end(project: Path, env: dict[str, str], timeout: float = START_S + 300) -> Ended:
    """`npu-wizard run PROJECT --plain` to its end."""
    runner = start_runner(project, "--interval", "2", env=env)
    try:
        output, _ = runner.communicate(timeout=timeout)
        left = leftover_processes(project)
    finally:
        clean_up(project, runner)
    found = run_dirs(project)
    assert len(found) == 1, output  # one run folder (none: the runner stopped before its run began)
    return Ended(runner.returncode, output, found[0], left)


def assert_trained_to_the_end(run_dir: Path, output: str, nodes: int = 2) -> dict:
    """Every rank of the `nodes` x 2 job ran the user's script to its last epoch; the summary says finished."""
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "finished", output
    assert [info["node"] for info in summary["ranks"].values()] == [0, 0, 1, 1][: 2 * nodes]
    for rank in range(2 * nodes):
        log = (run_dir / "logs" / f"rank-{rank}.log").read_text()
        assert f"[rank {rank}] epoch {EPOCHS - 1} loss " in log, log
    return summary


@pytest.mark.slow
def test_a_tutorial_style_script_trains_to_the_end_through_the_manual_engine(tmp_path: Path) -> None:
    project = render_own(tmp_path)
    code, output, run_dir, _ = run_to_the_end(project, node_env(project / "runs" / "unused"))
    assert code == 0, output
    summary = assert_trained_to_the_end(run_dir, output)
    assert all(info["exit_code"] == 0 and not info["steps_reported"] for info in summary["ranks"].values())


@pytest.mark.slow
def test_the_copy_with_report_calls_shows_steps_loss_and_checkpoint_in_the_summary(tmp_path: Path) -> None:
    # one node of two ranks under the shell launcher: what the script reports is the point, not who started it
    one_node = {"nodes": 1, "network.host_ips": ["127.0.0.1"], "launcher": "shell"}
    project = render_own(tmp_path, script="ddp_tutorial_report.py", **one_node)
    code, output, run_dir, _ = run_to_the_end(project, node_env(project / "runs" / "unused"))
    assert code == 0, output
    summary = assert_trained_to_the_end(run_dir, output, nodes=1)
    steps = 256 // 2 // 16 * EPOCHS  # samples / world size / batch x epochs
    final_loss = kinds(events_of(run_dir)[0], "step")[-1]["loss"]
    assert (summary["steps"], summary["final_loss"]) == (steps, final_loss)
    assert f"{steps} steps" in output and f"final loss {final_loss:.4f}" in output
    assert f"last checkpoint: step {steps}, {project / f'epoch-{EPOCHS - 1}.pt'} (rank 0)" in output, output
    for rank in range(2):
        assert f"  rank {rank} (node 0): finished (exit 0), step {steps}, loss " in output


@pytest.mark.slow
def test_a_script_whose_rank_3_raises_exits_3_naming_it_quoting_its_traceback_leaving_nothing_running(
    tmp_path: Path,
) -> None:
    project = render_own(tmp_path, args=("--fail-rank", "3"))
    code, output, run_dir, left = run_to_the_end(project, node_env(project / "runs" / "unused"))
    assert code == 3, output
    assert left == []  # run stopped every process of the job itself
    assert "root cause: rank 3 (node 1): RuntimeError: rank 3: the loss went wrong after epoch 0" in output
    # lines only the traceback has, quoted from rank 3's log (torch >= 2.2 puts [rank3]: before each line)
    quoted = output.split(f"last lines of {run_dir / 'logs' / 'rank-3.log'}:\n", 1)[1]
    assert f'File "{SCRIPT}", line ' in quoted
    assert 'raise RuntimeError(f"rank {self.rank}: the loss went wrong after epoch {epoch}")' in quoted
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["failure"]["rank"], summary["failure"]["kind"]) == (3, "error")
    assert summary["ranks"]["3"]["exit_code"] == 1


# os._exit: runtime.userscript records the end on the way out; the C library's _exit says nothing, and
# the launcher's exit code 0 is believed
@pytest.mark.parametrize("end", ["os._exit", "libc._exit"])
@pytest.mark.slow
def test_a_script_ending_every_rank_with_exit_0_skipping_pythons_exit_finishes_as_torchrun_saw_it(
    tmp_path: Path, end: str
) -> None:
    """Before, each rank said nothing on its way out, and run named the first "vanished ... kill -9?" (exit 3)."""
    # one node of two ranks: how a rank ends is the point, not how many nodes end so
    one_node = {"nodes": 1, "network.host_ips": ["127.0.0.1"]}
    project = render_own(tmp_path, args=("--end-with", end), **one_node)
    code, output, run_dir, _ = run_to_the_end(project, node_env(project / "runs" / "unused"))
    assert code == 0, output
    summary = assert_trained_to_the_end(run_dir, output, nodes=1)
    assert summary["failure"] is None
    assert [info["exit_code"] for info in summary["ranks"].values()] == [0, 0]


# torchrun notices a dead worker within its monitor interval (0.1 s) and logs its signal only after stopping the
# others; PET_MONITOR_INTERVAL=2 makes it notice 2 s late, so `run` sees the rank gone first, every time
@pytest.mark.parametrize(
    ("launcher", "env"), [("torchrun", {"PET_MONITOR_INTERVAL": "2"}), ("shell", {})], ids=["torchrun", "shell"]
)
@pytest.mark.slow
def test_a_rank_killed_with_sigkill_is_the_root_cause_with_the_signal_its_launcher_saw(
    tmp_path: Path, launcher: str, env: dict[str, str]
) -> None:
    one_node = {"nodes": 1, "network.host_ips": ["127.0.0.1"], "launcher": launcher}
    project = render_own(tmp_path, args=("--epochs", "1000000"), **one_node)  # trains until killed
    runner = start_runner(project, "--interval", "2", env=node_env(project / "runs" / "unused", **env))
    try:
        run_dir = wait_for(lambda: run_dirs(project), 60, "the run folder")[0]
        log = run_dir / "logs" / "rank-1.log"
        wait_for(lambda: log.is_file() and "[rank 1] epoch 0 loss " in log.read_text(), START_S, "rank 1 to train")
        victim = kinds(events_of(run_dir)[1], "started")[-1]["pid"]
        os.kill(victim, signal.SIGKILL)
        output, _ = runner.communicate(timeout=120)
        left = leftover_processes(project)
    finally:
        clean_up(project, runner)
    assert runner.returncode == 3, output
    assert left == []
    # the script reports no steps: no "at step 0" it never said
    assert f"root cause: rank 1 (node 0): its process {victim} vanished without an error (killed: " in output
    said = "its launcher saw it end with signal 9 (SIGKILL: kill -9 or the OOM killer (dmesg says which))"
    assert f"{said} (logs/node-0.log)" in output, output
    failure = json.loads((run_dir / "summary.json").read_text())["failure"]
    assert (failure["rank"], failure["kind"]) == (1, "vanished")


@pytest.mark.slow
def test_smoke_runs_npu_wizards_own_check_with_the_same_launcher_not_the_users_script(tmp_path: Path) -> None:
    # one node of two ranks under torchrun: the launcher is the point, two nodes' smoke is test_smoke_topology's
    project = render_own(tmp_path, nodes=1, **{"network.host_ips": ["127.0.0.1"]})
    runner = start_runner(
        project, "--smoke", "--bandwidth", "--bandwidth-max-bytes", "65536", env=node_env(project / "runs" / "unused")
    )
    try:
        output, _ = runner.communicate(timeout=START_S + 120)
    finally:
        clean_up(project, runner)
    (run_dir,) = run_dirs(project)
    assert runner.returncode == 0, output
    assert "smoke ok: 2/2 ranks" in output
    assert json.loads((run_dir / "bandwidth.json").read_text())["world_size"] == 2
    for rank in range(2):  # each rank ran the runtime's check under torchrun, never the user's script
        log = (run_dir / "logs" / f"rank-{rank}.log").read_text()
        assert f"smoke rank {rank}/2" in log and "epoch" not in log, log


# ---- the ssh engine across two hosts ------------------------------------------------------


@pytest.fixture(scope="module")
def ssh_hosts_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The two network-namespace hosts with their own addresses and sshd."""
    from tests.ssh_hosts import have_ssh_hosts, ssh_hosts

    if not have_ssh_hosts():
        pytest.skip("needs root, sshd, ssh, rsync and ip")
    with ssh_hosts(tmp_path_factory.mktemp("ssh")) as started:
        yield started


@pytest.mark.slow
def test_a_tutorial_style_script_trains_to_the_end_across_two_ssh_hosts(tmp_path: Path, ssh_hosts_pair: Any) -> None:
    addresses = ssh_hosts_pair.addresses
    project = render_own(
        tmp_path,
        **{
            "cluster.engine": "ssh",
            "network.host_ips": addresses,
            "network.master_addr": addresses[0],
        },
    )
    env = node_env(project / "runs" / "unused", NPU_WIZARD_SSH_COMMAND=ssh_hosts_pair.ssh_command)
    code, output, run_dir, _ = run_to_the_end(project, env)
    assert code == 0, output
    assert_trained_to_the_end(run_dir, output)
    for node, address in enumerate(addresses):
        assert f"ssh: node {node} started on {address}" in output


# ---- the two-node Slurm cluster ----------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One running two-node Slurm cluster."""
    from tests.slurm_cluster import have_slurm, slurm_cluster

    if not have_slurm():
        pytest.skip("needs slurm-wlm and munge (.ci/run installs them)")
    with slurm_cluster(tmp_path_factory.mktemp("slurm")) as running:
        yield running


@pytest.mark.slow
def test_a_tutorial_style_script_trains_to_the_end_through_sbatch(tmp_path: Path, cluster: Any) -> None:
    project = render_own(tmp_path, **{"cluster.engine": "slurm", "cluster.time": "00:20:00"})
    code, output, run_dir, _ = run_to_the_end(
        project, node_env(project / "runs" / "unused", SLURM_CONF=str(cluster.conf))
    )
    assert code == 0, output
    assert_trained_to_the_end(run_dir, output)
    job_id = json.loads((run_dir / "run.json").read_text())["job_id"]
    assert f"slurm: job {job_id} COMPLETED ExitCode=0:0" in output
    wait_for(lambda: not cluster.queue(), 60, "squeue to be empty")
