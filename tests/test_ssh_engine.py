"""`npu-wizard run` over ssh to two real hosts: network namespaces with their own sshd (tests/ssh_hosts.py).

The CPU demo is rendered with engine ssh and the hosts' addresses; the runner in
the root namespace copies it with rsync, starts each node over ssh (the test's
key through NPU_WIZARD_SSH_COMMAND), follows the ranks through the status
stream and stops every node on a failure or Ctrl-C. The hosts share this
machine's filesystem and process table, so "no process left" is checked for both.

The engine's point is the hosts, not the ranks on each: the runs here start one rank a
node with the shell launcher (ONE_RANK_A_NODE), as many hosts and sessions as 2 x 2
under torchrun, without the agent and the second rank that import torch on every node.
One finished run serves the tests that only read what it did.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.runs import (
    RunEnded,
    clean_up,
    leftover_processes,
    node_env,
    run_dirs,
    start_runner,
    started_pid,
    wait_for,
)
from tests.ssh_hosts import SshHosts, have_ssh_hosts, ssh_hosts
from wizard.answers.model import resolve
from wizard.cli import main
from wizard.monitor.procs import job_processes, kill_job
from wizard.render.render import render

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not have_ssh_hosts(), reason="needs root, sshd, ssh, rsync and ip (.ci/run installs them)"),
]

START_S = 240
LONG_RUN = {"training.samples": 65536, "training.epochs": 2}
ONE_RANK_A_NODE = {"devices_per_node": 1, "launcher": "shell"}
"""2 nodes x 1 rank, each started by launch/run-node.sh itself: ranks 0 and 1, one on each host."""


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshHosts]:
    """Two hosts with their own addresses and sshd, for the module's tests."""
    with ssh_hosts(tmp_path_factory.mktemp("ssh")) as started:
        yield started


def render_ssh(tmp_path: Path, addresses: list[str], **overrides: Any) -> Path:
    """The CPU demo (2 nodes x 2 ranks, gloo) rendered with engine ssh on these addresses."""
    raw: dict[str, Any] = {
        "project_name": "ssh-demo",
        "device": "cpu",
        "nodes": len(addresses),
        "devices_per_node": 2,
        "launcher": "torchrun",
        "amp": "off",
        "cluster.engine": "ssh",
        "network.host_ips": addresses,
        "network.master_addr": addresses[0],
        "training.samples": 1024,
        "training.batch_size": 16,
        "training.epochs": 2,
        "training.log_every": 4,
    }
    raw.update(overrides)
    return render(resolve(raw), tmp_path).project_dir


def runner_env(hosts: SshHosts, project: Path) -> dict[str, str]:
    return node_env(project / "runs" / "unused", NPU_WIZARD_SSH_COMMAND=hosts.ssh_command)


def git(repo: Path, *args: str) -> None:
    """A git command in `repo` that must succeed."""
    author = ["-c", "user.name=Test", "-c", "user.email=test@example.com", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", *author, *args], cwd=repo, check=True, capture_output=True, timeout=60)


USER_FILES = {
    ".gitignore": "*.log\n/data/\n/scratch/\n",
    "src/.gitignore": "*.tmp\n",
    "src/helper.py": "HELP = 1\n",
    "src/cache.tmp": "ignored by the nested .gitignore\n",
    "debug.log": "ignored\n",
    "scratch/big.bin": "ignored folder\n",
    "data/shard-0.bin": "ignored by git, kept by .npu-wizardignore\n",
    ".npu-wizardignore": "!data/\n",
    "checkpoints/notes.txt": "this host's checkpoint folder\n",
    "runs/earlier/notes.txt": "an earlier run here\n",
}
"""A user's files in the project's git repository: what git ignores stays here, unless .npu-wizardignore keeps it."""


def runs_on(elsewhere: Path) -> list[Path]:
    """The run folders on the hosts' copy of the project."""
    return sorted((elsewhere / "runs").glob("*"))


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory, hosts: SshHosts) -> tuple[RunEnded, Path]:
    """The CPU demo with the user's files in a git repository, run to its end into a folder on the hosts apart
    from the project here; and that folder. Its readers carry the xdist_group mark "ssh-finished-run"."""
    root = tmp_path_factory.mktemp("ssh-finished")
    elsewhere = root / "on-the-hosts"  # the hosts' copy, apart from the project here
    project = render_ssh(
        root / "here",
        hosts.addresses,
        **{**ONE_RANK_A_NODE, "cluster.remote_dir": str(elsewhere), "training.samples": 256, "training.epochs": 1},
    )
    for name, text in USER_FILES.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    git(project, "init", "-q")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "the project")
    runner = start_runner(project, "--interval", "2", env=runner_env(hosts, project))
    try:
        output, _ = runner.communicate(timeout=START_S + 300)
        # the ranks' environment names the run folder on the hosts
        left = [*leftover_processes(project), *(pid for there in runs_on(elsewhere) for pid in job_processes(there))]
    finally:
        clean_up(project, runner)
        for there in runs_on(elsewhere):
            kill_job(there, grace=0.5)
    (run_dir,) = run_dirs(project) or [project / "runs" / "none"]  # none: the tests fail on the exit code, with output
    return RunEnded(project, run_dir, runner.returncode, output, "", left), elsewhere


@pytest.mark.xdist_group("ssh-finished-run")
def test_the_cpu_demo_trains_to_the_end_across_two_hosts(finished_run: tuple[RunEnded, Path], hosts: SshHosts) -> None:
    run, elsewhere = finished_run
    output = run.stdout
    assert run.code == 0, output
    summary = json.loads((run.run_dir / "summary.json").read_text())
    assert summary["outcome"] == "finished"
    assert [info["node"] for info in summary["ranks"].values()] == [0, 1]
    assert re.search(r"^ssh: 2 host\(s\) answered in \d+\.\ds$", output, re.MULTILINE), output
    assert re.search(r"^ssh: project copied to 2 host\(s\) in \d+\.\ds$", output, re.MULTILINE), output
    remote_run = elsewhere / run.run_dir.relative_to(run.project)  # the nodes' own logs stay on their hosts
    for node, address in enumerate(hosts.addresses):
        assert f"ssh: node {node} started on {address}" in output
        assert f"node {node}/2 ({address})" in (remote_run / "logs" / f"node-{node}.log").read_text()
    assert run.left == []


@pytest.mark.xdist_group("ssh-finished-run")
def test_only_what_a_rank_needs_is_copied_to_the_hosts_and_the_run_trains(finished_run: tuple[RunEnded, Path]) -> None:
    run, elsewhere = finished_run
    assert run.code == 0, run.stdout
    copied = sorted(p.relative_to(elsewhere).as_posix() for p in elsewhere.rglob("*") if p.is_file())
    assert not [name for name in copied if name.startswith(".git/")], copied
    left_out = {"src/cache.tmp", "debug.log", "scratch/big.bin", "checkpoints/notes.txt", "runs/earlier/notes.txt"}
    assert not left_out & set(copied), copied
    assert {"data/shard-0.bin", "src/helper.py", "train.py", "answers.yaml", "launch/node1.sh"} <= set(copied)
    listed = (run.run_dir / "logs" / "ssh-copied-files").read_bytes().split(b"\0")
    assert b"data/shard-0.bin" in listed and not [name for name in listed if name.startswith(b".git/")]
    said = r"^ssh: rsync copies \d+ file\(s\), \d+ bytes .*1 of them ignored by git but kept by \.npu-wizardignore"
    assert re.search(said, run.stdout, re.M), run.stdout
    assert json.loads((run.run_dir / "summary.json").read_text())["outcome"] == "finished"


def test_kill_9_of_a_rank_on_the_second_host_stops_every_node_and_names_it(tmp_path: Path, hosts: SshHosts) -> None:
    project = render_ssh(tmp_path, hosts.addresses, **LONG_RUN, **ONE_RANK_A_NODE)
    runner = start_runner(project, "--interval", "1", env=runner_env(hosts, project))
    try:
        run_dir = wait_for(lambda: run_dirs(project), 60, "the run folder")[0]
        victim = wait_for(lambda: started_pid(run_dir, 1), START_S, "rank 1 to train on the second host")
        os.kill(victim, signal.SIGKILL)
        output, _ = runner.communicate(timeout=120)
        wait_for(lambda: not leftover_processes(project), 20, "every process of the job to end on both hosts")
    finally:
        clean_up(project, runner)
    assert runner.returncode == 3, output
    assert "root cause: rank 1 (node 1): its process" in output and "vanished" in output
    # Not asserted since the ranks save on SIGTERM (issue 29): the line "its launcher saw it end with signal 9"
    # from ssh-node-1.log. Under torchrun the runner stops node 1 before torchrun logs the worker's signal (torchrun
    # logs it only once the other worker, waiting in the stop grace, has ended); left open, said in the notes.
    assert json.loads((run_dir / "summary.json").read_text())["failure"]["rank"] == 1


def rank_process(run_dir: str, rank: int) -> int | None:
    """The pid of `rank`'s process of the run whose folder (on its host) is `run_dir`, once it runs train.py."""
    wanted = {f"RANK={rank}".encode(), f"NPU_WIZARD_RUN_DIR={run_dir}".encode()}
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and b"train.py" in (proc / "cmdline").read_bytes():
                if wanted <= set((proc / "environ").read_bytes().split(b"\0")):
                    return int(proc.name)
        except OSError:
            continue
    return None


def test_kill_9_of_a_remote_rank_before_it_reports_names_the_signal_its_launcher_saw(
    tmp_path: Path, hosts: SshHosts
) -> None:
    elsewhere = tmp_path / "on-the-hosts"  # the hosts' copy: node 1's own log is there, not in the run folder here
    # torchrun kept: what the runner reads over ssh is torchrun's own summary of how its rank ended
    project = render_ssh(
        tmp_path / "here", hosts.addresses, **{"devices_per_node": 1, "cluster.remote_dir": str(elsewhere)}
    )
    script = project / "train.py"  # every rank waits before it reports anything: the kill lands before its start
    script.write_text("import time\ntime.sleep(600)\n" + script.read_text())
    runner = start_runner(project, "--interval", "1", env=runner_env(hosts, project))
    try:
        run_dir = wait_for(lambda: run_dirs(project), 60, "the run folder")[0]
        remote_run = str(elsewhere / run_dir.relative_to(project))
        victim = wait_for(lambda: rank_process(remote_run, 1), START_S, "rank 1's process on the second host")
        os.kill(victim, signal.SIGKILL)
        output, _ = runner.communicate(timeout=120)
        wait_for(lambda: not leftover_processes(project), 30, "every process of the job to end on both hosts")
    finally:
        clean_up(project, runner)
    assert runner.returncode == 3, output
    assert not (run_dir / "logs" / "node-1.log").exists()  # only the hosts have it
    assert "root cause: node 1's launcher: its launch script exited (exit code 1)" in output, output
    said = "its launcher saw rank 1 end with signal 9 (SIGKILL: kill -9 or the OOM killer (dmesg says which))"
    assert said in output, output
    assert f"its log is {hosts.addresses[1]}:{remote_run}/logs/node-1.log; from logs/ssh-node-1.log here:" in output


def ssh_session_of(runner_pid: int, host: str, node: int) -> int | None:
    """The pid of the runner's ssh client that started node's launch script on host, if it runs."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == runner_pid and host.encode() in argv and any(f"launch/node{node}.sh".encode() in a for a in argv):
            return int(proc.name)
    return None


def test_a_dropped_ssh_session_points_at_the_node_log_on_its_host(tmp_path: Path, hosts: SshHosts) -> None:
    project = render_ssh(tmp_path, hosts.addresses, **LONG_RUN, **ONE_RANK_A_NODE)
    runner = start_runner(project, "--interval", "1", env=runner_env(hosts, project))
    try:
        run_dir = wait_for(lambda: run_dirs(project), 60, "the run folder")[0]
        wait_for(lambda: started_pid(run_dir, 1), START_S, "rank 1 to train on the second host")
        session = wait_for(lambda: ssh_session_of(runner.pid, hosts.addresses[1], 1), 30, "node 1's ssh session")
        os.kill(session, signal.SIGKILL)  # the connection to the second host is gone; its ranks run on there
        output, _ = runner.communicate(timeout=120)
        wait_for(lambda: not leftover_processes(project), 30, "every process of the job to end on both hosts")
    finally:
        clean_up(project, runner)
    assert runner.returncode == 3, output
    remote_log = f"{hosts.addresses[1]}:{run_dir}/logs/node-1.log"
    assert "root cause: node 1's launcher" in output, output
    assert remote_log in output, output


def test_ctrl_c_stops_every_node_on_every_host(tmp_path: Path, hosts: SshHosts) -> None:
    project = render_ssh(tmp_path, hosts.addresses, **LONG_RUN, **ONE_RANK_A_NODE)
    runner = start_runner(project, "--interval", "1", env=runner_env(hosts, project))
    try:
        run_dir = wait_for(lambda: run_dirs(project), 60, "the run folder")[0]
        wait_for(lambda: started_pid(run_dir, 1), START_S, "rank 1 to train on the second host")
        runner.send_signal(signal.SIGINT)
        output, _ = runner.communicate(timeout=60)
        wait_for(lambda: not leftover_processes(project), 20, "every process of the job to end on both hosts")
    finally:
        clean_up(project, runner)
    assert runner.returncode == 130, output


def test_smoke_through_ssh_into_another_folder_reports_every_rank(tmp_path: Path, hosts: SshHosts) -> None:
    elsewhere = tmp_path / "on-the-hosts"  # not the project's folder: only rsync and the status stream connect them
    project = render_ssh(
        tmp_path / "here", hosts.addresses, **{**ONE_RANK_A_NODE, "cluster.remote_dir": str(elsewhere)}
    )
    runner = start_runner(project, "--smoke", env=runner_env(hosts, project))
    try:
        output, _ = runner.communicate(timeout=START_S + 120)
    finally:
        clean_up(project, runner)
    assert runner.returncode == 0, output
    assert "smoke ok" in output
    rank_lines = [line for line in output.splitlines() if line.strip().startswith("rank ") and "all_reduce" in line]
    assert [line.split()[1:4:2] for line in rank_lines] == [["0", "0"], ["1", "1"]]
    assert all(line.split()[-2] == "ok" for line in rank_lines), output
    assert (elsewhere / "train.py").read_text() == (project / "train.py").read_text()
    assert list((elsewhere / "runs").iterdir())  # the nodes' logs and events stayed on the hosts


def test_an_unreachable_host_is_named_before_anything_starts(tmp_path: Path, hosts: SshHosts) -> None:
    nowhere = hosts.gateway.rsplit(".", 1)[0] + ".250"  # on the bridge's subnet, but no host answers there
    project = render_ssh(tmp_path, [hosts.addresses[0], nowhere])
    runner = start_runner(project, env=runner_env(hosts, project))
    try:
        output, _ = runner.communicate(timeout=120)
    finally:
        clean_up(project, runner)
    assert runner.returncode == 1, output
    assert f"node 1 ({nowhere})" in output and "nothing was started" in output
    assert f"node 0 ({hosts.addresses[0]})" not in output
    assert run_dirs(project) == []  # no run.json: the job never started


def test_a_dry_run_prints_the_rsync_and_ssh_commands_and_starts_nothing(tmp_path: Path) -> None:
    project = render_ssh(tmp_path, ["192.0.2.10", "192.0.2.11"], **{"cluster.ssh_hosts": ["atlas-a", "atlas-b"]})
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["run", str(project), "--dry-run"]) == 0
    text = printed.getvalue()
    assert re.search(r"^# rsync copies \d+ file\(s\), \d+ bytes \(\d+\.\d MiB\); not \.git/, runs/", text, re.M), text
    for node, host in enumerate(["atlas-a", "atlas-b"]):
        assert "rsync -a --from0 --files-from=" in text and "/logs/ssh-copied-files -e 'ssh -o BatchMode=yes" in text
        assert f"{project}/ {host}:{project}/" in text
        assert f"launch/node{node}.sh" in text
    assert "setsid -w" in text and "PYTHON=/" in text
    assert not (project / "runs").exists()


def test_doctor_on_an_ssh_project_checks_this_host_and_names_the_command_for_every_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    project = render_ssh(tmp_path, ["192.0.2.10", "192.0.2.11"])
    main(["doctor", str(project), "--node", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"npu-wizard doctor: {project.name}, node 1 of 2 (192.0.2.11)")
    assert lines[-1].startswith("every host of this ssh project from here: npu-wizard run PROJECT --smoke")
