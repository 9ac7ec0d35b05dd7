"""Issue 36, item 16: SIGUSR2 goes only to this run's process, on the host the rank reported."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from runtime.events import ENV_RUN_DIR
from wizard.run.engines.ssh import SshEngine
from wizard.run.hang_stacks import probe_local, read_probe


def handler_child(stacks: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    """A process with a SIGUSR2 handler writing its stacks to `stacks`, as a rank has."""
    code = (
        "import faulthandler, signal, time\n"
        f"faulthandler.register(signal.SIGUSR2, file=open({str(stacks)!r}, 'a'), all_threads=True)\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    assert child.stdout is not None and child.stdout.readline() == "ready\n"
    return child


def test_a_process_of_another_run_with_a_handler_is_not_signalled(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    stacks = tmp_path / "logs" / "rank-0.stacks.txt"
    other_run = {**os.environ, ENV_RUN_DIR: str(tmp_path / "another-run")}
    child = handler_child(stacks, other_run)  # the pid was reused by someone else's process
    try:
        probe = probe_local(tmp_path, 0, child.pid, wait_s=0.5)
        assert "not this run's" in str(probe.note)
        assert not stacks.exists() or stacks.read_text() == ""
    finally:
        child.kill()
        child.wait()


def test_this_runs_process_is_still_signalled(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    stacks = tmp_path / "logs" / "rank-0.stacks.txt"
    child = handler_child(stacks, {**os.environ, ENV_RUN_DIR: str(tmp_path)})
    try:
        probe = probe_local(tmp_path, 0, child.pid)
        assert probe.faulthandler is not None and "most recent call first" in probe.faulthandler
    finally:
        child.kill()
        child.wait()


@pytest.fixture
def ssh_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """NPU_WIZARD_SSH_COMMAND: a stand-in that notes the host it was given and runs the command here."""
    fake_ssh = tmp_path / "ssh"
    fake_ssh.write_text(f'#!/bin/bash\nprintf "%s\\n" "$1" >> {tmp_path / "hosts"}\nexec bash -c "$2"\n')
    fake_ssh.chmod(0o755)
    monkeypatch.setenv("NPU_WIZARD_SSH_COMMAND", str(fake_ssh))
    return tmp_path / "hosts"


def ssh_launch(tmp_path: Path) -> SimpleNamespace:
    run_dir = tmp_path / "runs" / "20260101-000000"
    (run_dir / "logs").mkdir(parents=True)
    return SimpleNamespace(
        answers={"devices_per_node": 2, "network.host_ips": ["host-a", "host-b"]},
        project=tmp_path,
        run_dir=run_dir,
        spares={},
    )


def test_the_ssh_probe_goes_to_the_host_the_rank_reported(tmp_path: Path, ssh_here: Path) -> None:
    launch = ssh_launch(tmp_path)
    remote_run_dir = SshEngine().remote_run_dir(launch)  # type: ignore[arg-type]
    child = handler_child(launch.run_dir / "logs" / "rank-3.stacks.txt", {**os.environ, ENV_RUN_DIR: remote_run_dir})
    try:
        # rank 3 would be node 1 (host-b) by number; it said it runs on host-a
        probed = SshEngine().probe_rank(launch, 3, "host-a", child.pid)  # type: ignore[arg-type]
        assert ssh_here.read_text().splitlines() == ["host-a"]
        assert probed is not None and read_probe(*probed).faulthandler is not None
    finally:
        child.kill()
        child.wait()


def test_the_ssh_probe_does_not_signal_a_process_of_another_run(tmp_path: Path, ssh_here: Path) -> None:
    launch = ssh_launch(tmp_path)
    stacks = launch.run_dir / "logs" / "rank-3.stacks.txt"
    child = handler_child(stacks, {**os.environ, ENV_RUN_DIR: str(tmp_path / "another-run")})
    try:
        probed = SshEngine().probe_rank(launch, 3, "host-b", child.pid)  # type: ignore[arg-type]
        assert probed is not None
        assert "not this run's" in str(read_probe(*probed).note)
        assert not stacks.exists() or stacks.read_text() == ""
    finally:
        child.kill()
        child.wait()
