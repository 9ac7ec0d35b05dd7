"""Stopping the ssh engine in every phase: SIGTERM or SIGINT ends the runner without waiting out whatever hangs.

A host that never answers is played by a fake ssh command (NPU_WIZARD_SSH_COMMAND)
that sleeps, or by a real host (tests/ssh_hosts.py) whose sshd is SIGSTOPped, so new
connections hang with no timeout; a host that is slow to start a node's launch is a
real host whose shell sleeps (BASH_ENV) before it runs the launch command. The real hosts
run one rank a node (ONE_RANK_A_NODE): what is stopped is the hosts' sessions.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.runs import clean_up, leftover_processes, node_env, run_dirs, start_runner, started_pid, wait_for
from tests.ssh_hosts import SshHosts, have_ssh_hosts, ssh_hosts
from tests.test_ssh_engine import LONG_RUN, ONE_RANK_A_NODE, START_S, render_ssh
from wizard.monitor.procs import is_alive
from wizard.run.engines.ssh import DEFAULT_SSH

needs_hosts = pytest.mark.skipif(not have_ssh_hosts(), reason="needs root, sshd, ssh, rsync and ip")


def fake_ssh(tmp_path: Path, answers_true: bool) -> tuple[str, Path]:
    """An ssh command that records its pid and sleeps 600 s, past every test's deadline (or, for `true`, succeeds
    when `answers_true`): a runner that ends within its deadline stopped it rather than waited for it."""
    pids = tmp_path / "fake-ssh-pids"
    pids.mkdir()
    script = tmp_path / "fake-ssh"
    passes = 'case "$*" in *" true") exit 0 ;; esac\n' if answers_true else ""
    script.write_text(f'#!/bin/sh\n{passes}echo "$*" > {shlex.quote(str(pids))}/$$\nexec sleep 600\n')
    script.chmod(0o755)
    return str(script), pids


def stop_while_hung(tmp_path: Path, answers_true: bool, signum: int) -> tuple[subprocess.Popen[str], str, Path]:
    """Start a run whose ssh hangs, signal the runner once a fake ssh sleeps, and let it end (30 s at most)."""
    command, pids = fake_ssh(tmp_path, answers_true)
    project = render_ssh(tmp_path / "p", ["192.0.2.10", "192.0.2.11"])
    runner = start_runner(project, env=node_env(project / "runs" / "unused", NPU_WIZARD_SSH_COMMAND=command))
    try:
        wait_for(lambda: len(list(pids.iterdir())) == 2, 60, "both hosts' ssh to hang")
        runner.send_signal(signum)
        # half the runner's own 60 s host check (CHECK_S), which kills the ssh it started when it runs out: a
        # runner that waited that out instead of acting on the signal fails here (the fake ssh sleeps 600 s)
        output, _ = runner.communicate(timeout=30)
    finally:
        clean_up(project, runner)
    return runner, output, pids


def test_the_default_ssh_notices_a_host_that_stops_answering() -> None:
    shown = subprocess.run([*DEFAULT_SSH, "-G", "atlas-a"], capture_output=True, text=True, check=True).stdout
    assert "serveraliveinterval 15" in shown.splitlines()
    assert "serveralivecountmax 4" in shown.splitlines()


def test_sigterm_during_a_hung_host_check_ends_the_runner_at_once(tmp_path: Path) -> None:
    runner, output, pids = stop_while_hung(tmp_path, answers_true=False, signum=signal.SIGTERM)
    assert runner.returncode == 128 + signal.SIGTERM, output
    assert not [pid for pid in map(int, os.listdir(pids)) if is_alive(pid)]  # no ssh left behind


def test_sigint_to_the_runner_during_a_hung_copy_ends_it_at_once(tmp_path: Path) -> None:
    runner, output, pids = stop_while_hung(tmp_path, answers_true=True, signum=signal.SIGINT)
    assert runner.returncode == 130, output
    assert all("rsync" in (pids / name).read_text() for name in os.listdir(pids))  # they hung in the copy
    assert not [pid for pid in map(int, os.listdir(pids)) if is_alive(pid)]


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[SshHosts]:
    if not have_ssh_hosts():
        pytest.skip("needs root, sshd, ssh, rsync and ip")
    (tmp_path / "hosts").mkdir()
    with ssh_hosts(tmp_path / "hosts") as started:
        yield started


@needs_hosts
@pytest.mark.slow
def test_ctrl_c_while_a_host_hangs_ends_the_runner_in_bounded_time(tmp_path: Path, hosts: SshHosts) -> None:
    project = render_ssh(tmp_path, hosts.addresses, **LONG_RUN, **ONE_RANK_A_NODE)
    no_timeout = hosts.ssh_command.replace("-o ConnectTimeout=10", "")  # a hung host holds ssh forever
    runner = start_runner(project, "--interval", "1", env=node_env(project / "x", NPU_WIZARD_SSH_COMMAND=no_timeout))
    try:
        run_dir = wait_for(lambda: run_dirs(project), 60, "the run folder")[0]
        wait_for(lambda: started_pid(run_dir, 1), START_S, "rank 1 to train on the second host")
        os.kill(hosts.pids[1], signal.SIGSTOP)  # the second host's sshd accepts connections but never answers
        runner.send_signal(signal.SIGINT)
        output, _ = runner.communicate(timeout=90)  # the bound: a runner held by the hung host fails here
    finally:
        os.kill(hosts.pids[1], signal.SIGCONT)
        clean_up(project, runner)
    assert runner.returncode == 130, output
    assert f"ssh: could not reach {hosts.addresses[1]} within 10s to stop node 1" in output


@needs_hosts
@pytest.mark.slow
def test_a_launch_stopped_before_it_said_its_session_is_swept_on_its_host(tmp_path: Path) -> None:
    # the second host's login runs the launch command after 8 s (a slow shell start-up file, say)
    marker, sleeper, slow = tmp_path / "login-started", tmp_path / "login-sleep-pid", tmp_path / "slow-login"
    slow.write_text(
        '#!/bin/bash\ncase "$SSH_ORIGINAL_COMMAND" in\n'
        f"*setsid*) exec bash -c 'touch {marker}; sleep 8 & echo $! > {sleeper}; wait $!; eval \"$1\"' "
        'slow-login "$SSH_ORIGINAL_COMMAND" ;;\n*) exec bash -c "$SSH_ORIGINAL_COMMAND" ;;\nesac\n'
    )
    slow.chmod(0o755)
    (tmp_path / "hosts").mkdir()
    with ssh_hosts(tmp_path / "hosts", extra={1: f"ForceCommand {slow}\n"}) as hosts:
        project = render_ssh(tmp_path, hosts.addresses, **LONG_RUN, **ONE_RANK_A_NODE)
        env = node_env(project / "x", NPU_WIZARD_SSH_COMMAND=hosts.ssh_command)
        runner = start_runner(project, "--interval", "1", env=env)
        try:
            wait_for(marker.exists, 120, "the second host's login to start the launch")
            runner.send_signal(signal.SIGTERM)
            output, _ = runner.communicate(timeout=60)
            wait_for(
                lambda: (
                    sleeper.exists()
                    and sleeper.read_text().strip().isdigit()
                    and not is_alive(int(sleeper.read_text()))
                ),
                30,
                "the slow login's sleep",
            )
            # a launch that escaped the sweep starts now: look for its processes a while
            deadline, left = time.monotonic() + 5, []
            while not left and time.monotonic() < deadline:
                left = leftover_processes(project)
        finally:
            clean_up(project, runner)
    assert runner.returncode == 128 + signal.SIGTERM, output
    assert left == [], output


def test_sigterm_during_a_hung_host_check_ends_the_live_view_runner_at_once(tmp_path: Path) -> None:
    import pty
    import sys
    import threading

    command, pids = fake_ssh(tmp_path, answers_true=False)
    project = render_ssh(tmp_path / "p", ["192.0.2.10", "192.0.2.11"])
    env = node_env(project / "runs" / "unused", NPU_WIZARD_SSH_COMMAND=command, TERM="xterm")
    terminal, screen = pty.openpty()  # the live view runs only on a terminal
    runner = subprocess.Popen(
        [sys.executable, "-m", "wizard", "run", str(project)], env=env, stdin=screen, stdout=screen, stderr=screen
    )
    os.close(screen)
    shown: list[bytes] = []

    def read_screen() -> None:
        while True:
            try:
                chunk = os.read(terminal, 65536)
            except OSError:
                return
            if not chunk:
                return
            shown.append(chunk)

    reader = threading.Thread(target=read_screen, daemon=True)
    reader.start()
    try:
        wait_for(lambda: len(list(pids.iterdir())) == 2, 60, "both hosts' ssh to hang")
        runner.send_signal(signal.SIGTERM)
        runner.wait(timeout=30)  # half the runner's 60 s host check, as in stop_while_hung
    finally:
        if runner.poll() is None:
            runner.kill()
        os.close(terminal)
        clean_up(project, runner)
    output = b"".join(shown).decode(errors="replace")
    assert runner.returncode == 128 + signal.SIGTERM, output
    assert not [pid for pid in map(int, os.listdir(pids)) if is_alive(pid)]  # no ssh left behind


# Makes the worst moment happen every time: the runner's SIGTERM lands right after the fork of a
# host's ssh, before Popen returns it. The stand-in wraps the real fork (test-only instrumentation).
SIGNAL_AFTER_FORK = """
import os, signal, subprocess, sys
from wizard.run.engines.ssh_run import run_all
from wizard.stopping import StopSignal, stop_signals_raise
real_fork_exec = subprocess._fork_exec
def fork_exec_then_signal(*args, **kwargs):
    pid = real_fork_exec(*args, **kwargs)
    print(pid, flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    return pid
subprocess._fork_exec = fork_exec_then_signal
with stop_signals_raise():
    try:
        run_all([["sleep", "300"]], 60)
    except StopSignal:
        sys.exit(143)
"""


def test_a_signal_right_after_an_ssh_is_forked_leaves_no_ssh_behind() -> None:
    import sys

    harness = subprocess.run([sys.executable, "-c", SIGNAL_AFTER_FORK], capture_output=True, text=True, timeout=60)
    forked = int(harness.stdout.split()[0])
    try:
        assert harness.returncode == 143, harness.stderr
        assert not is_alive(forked)
    finally:
        if is_alive(forked):
            os.kill(forked, signal.SIGKILL)
