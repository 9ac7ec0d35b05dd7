"""The ssh engine on hosts as real clusters have them (tests/ssh_hosts.py).

The second host greets every login in GBK (a Banner, and a line on stderr before
each command, as a start-up file of a server set up in Chinese prints); both hosts
have IPv6 addresses too; the folder on the hosts may already hold other files. `run --fresh`
is refused on the ssh engine: the checkpoints it would set aside are on the hosts. The smoke
tests run one rank a node (ONE_RANK_A_NODE): what they prove is how the hosts are reached.
"""

from __future__ import annotations

import contextlib
import io
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.runs import clean_up, run_dirs, start_runner
from tests.ssh_hosts import SshHosts, have_ssh_hosts, ssh_hosts
from tests.test_ssh_engine import ONE_RANK_A_NODE, START_S, render_ssh, runner_env
from wizard.cli import main

GREETING = "欢迎使用 GPU 服务器".encode("gbk")  # not UTF-8: 0xbb opens it


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshHosts]:
    if not have_ssh_hosts():
        pytest.skip("needs root, sshd, ssh, rsync and ip")
    root = tmp_path_factory.mktemp("ssh")
    (root / "banner").write_bytes(GREETING + b"\n")
    greet = root / "greet"
    octal = "".join(f"\\{byte:03o}" for byte in GREETING)
    greet.write_text(f"#!/bin/bash\nprintf '{octal}\\n' >&2\nexec bash -c \"$SSH_ORIGINAL_COMMAND\"\n")
    greet.chmod(0o755)
    extra = {1: f"Banner {root / 'banner'}\nForceCommand {greet}\n"}
    with ssh_hosts(root, extra=extra, ipv6=True) as started:
        yield started


def smoke(project: Path, env: dict[str, str]) -> tuple[int, str]:
    runner = start_runner(project, "--smoke", env=env)
    try:
        output, _ = runner.communicate(timeout=START_S + 120)
    finally:
        clean_up(project, runner)
    return runner.returncode, output


@pytest.mark.slow
def test_a_host_greeting_in_gbk_runs_into_a_folder_this_project_was_copied_to_before(
    tmp_path: Path, hosts: SshHosts
) -> None:
    there = tmp_path / "on-the-hosts"
    project = render_ssh(tmp_path / "here", hosts.addresses, **{**ONE_RANK_A_NODE, "cluster.remote_dir": str(there)})
    shutil.copytree(project, there)  # a copy from an earlier run: this project's, so not refused
    env = runner_env(hosts, project)
    env["NPU_WIZARD_SSH_COMMAND"] = hosts.ssh_command.replace("LogLevel=ERROR", "LogLevel=INFO")  # banners shown
    code, output = smoke(project, env)
    assert code == 0, output
    assert "smoke ok" in output


@pytest.mark.slow
def test_ipv6_hosts_are_reached_and_copied_to(tmp_path: Path, hosts: SshHosts) -> None:
    there = tmp_path / "on-the-hosts"
    project = render_ssh(
        tmp_path,
        hosts.addresses,
        **{**ONE_RANK_A_NODE, "cluster.ssh_hosts": hosts.addresses6, "cluster.remote_dir": str(there)},
    )
    code, output = smoke(project, runner_env(hosts, project))
    assert code == 0, output
    assert (there / "train.py").read_text() == (project / "train.py").read_text()
    assert f"ssh: node 1 started on {hosts.addresses6[1]}" in output


@pytest.mark.slow
def test_a_folder_on_the_hosts_holding_other_files_is_refused_and_named(tmp_path: Path, hosts: SshHosts) -> None:
    home = tmp_path / "home-of-someone"
    home.mkdir()
    (home / "notes.txt").write_text("mine\n")
    (home / "train.py").write_text("# another project's\n")
    project = render_ssh(tmp_path / "here", hosts.addresses, **{"cluster.remote_dir": str(home)})
    code, output = smoke(project, runner_env(hosts, project))
    assert code == 1, output
    where = f"node 0 ({hosts.addresses[0]}), node 1 ({hosts.addresses[1]})"  # the hosts share this disk
    assert f"cluster.remote_dir {home} on {where} holds other files" in output
    assert "nothing was started" in output
    assert (home / "train.py").read_text() == "# another project's\n"
    assert sorted(p.name for p in home.iterdir()) == ["notes.txt", "train.py"]
    assert run_dirs(project) == []


@pytest.mark.parametrize("folder", ["/", "//", "/usr", "/usr/lib/x", "/etc/npu", "/home", "/root/"])
def test_the_root_and_system_folders_are_refused_as_the_folder_on_the_hosts(
    tmp_path: Path, folder: str, capsys: pytest.CaptureFixture[str]
) -> None:
    project = render_ssh(tmp_path, ["192.0.2.10", "192.0.2.11"], **{"cluster.remote_dir": folder})
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["run", str(project), "--plain"]) == 1
    error = capsys.readouterr().err
    assert f"cluster.remote_dir {folder}: " in error and "system folder" in error, error
    assert len(error.strip().splitlines()) == 1
    assert run_dirs(project) == []


def test_run_fresh_on_the_ssh_engine_is_refused_before_anything_moves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    there = "/srv/work/ssh-demo"
    project = render_ssh(tmp_path, ["192.0.2.10", "192.0.2.11"], **{"cluster.remote_dir": there})
    checkpoint = project / "checkpoints" / "step-8.pt"
    checkpoint.parent.mkdir()
    checkpoint.write_bytes(b"weights")
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["run", str(project), "--plain", "--fresh"]) == 1
    error = capsys.readouterr().err
    assert len(error.strip().splitlines()) == 1, error
    assert "--fresh" in error and f"{there}/checkpoints" in error and "every host" in error, error
    assert checkpoint.read_bytes() == b"weights"  # nothing moved here either
    assert not (project / "runs").exists()
