"""The status token stays out of every other user's reach while a real ssh or Slurm run goes on.

Another uid (`nobody`, through setpriv) reads every process's command line, and
its environment where the kernel lets it, again and again for the whole run; the
run's token (given to the runner in its environment) must never turn up. The
reader gets the token on its standard input, so its own command line holds none.
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.runs import clean_up, run_dirs, start_runner
from tests.slurm_cluster import SlurmCluster, have_slurm, slurm_cluster
from tests.ssh_hosts import SshHosts, have_ssh_hosts, ssh_hosts
from tests.test_slurm_engine import render_slurm
from tests.test_slurm_engine import runner_env as slurm_runner_env
from tests.test_ssh_engine import render_ssh
from tests.test_ssh_engine import runner_env as ssh_runner_env

pytestmark = [pytest.mark.slow]

START_S = 240

READER = r"""
import json, os, select, sys
token = sys.stdin.readline().strip().encode()
mark = sys.stdin.readline().strip().encode()
scans = seen = environs = 0
hits, marks = [], set()
while not select.select([sys.stdin], [], [], 0.01)[0]:
    scans += 1
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        for name in ("cmdline", "environ"):
            try:
                with open(f"/proc/{pid}/{name}", "rb") as handle:
                    data = handle.read()
            except OSError:
                continue
            seen += name == "cmdline"
            environs += name == "environ"
            if token in data:
                hits.append(f"/proc/{pid}/{name}: " + data.replace(b"\0", b" ").decode(errors="replace")[:300])
            if name == "cmdline" and mark in data:
                marks.add(data.replace(b"\0", b" ").decode(errors="replace")[:120])
print(json.dumps({"uid": os.getuid(), "scans": scans, "cmdlines": seen, "environs": environs,
                  "hits": hits[:5], "marks": sorted(marks)[:20]}))
"""


def start_reader(token: str, mark: str) -> subprocess.Popen[str]:
    """The reader as user nobody, scanning /proc until a line arrives on its standard input. It keeps the command
    lines that hold `mark` (the run's own script, proof that it saw the run): only those, for the suite's other
    tests start processes of their own (a shellcheck of launch/*.sh filled the 20 it kept once)."""
    reader = subprocess.Popen(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "/usr/bin/python3", "-c", READER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    assert reader.stdin is not None
    reader.stdin.write(token + "\n" + mark + "\n")
    reader.stdin.flush()
    return reader


def stop_reader(reader: subprocess.Popen[str]) -> dict:
    output, _ = reader.communicate("stop\n", timeout=60)
    return json.loads(output)


def watched_run(project: Path, env: dict[str, str], token: str, mark: str, *args: str) -> tuple[str, int, dict]:
    """A whole run of the project with the reader scanning throughout; its output, exit code and what was read."""
    reader = start_reader(token, mark)
    runner = start_runner(project, *args, env={**env, "NPU_WIZARD_STATUS_TOKEN": token})
    try:
        output, _ = runner.communicate(timeout=START_S + 300)
    finally:
        clean_up(project, runner)
        read = stop_reader(reader)
    return output, runner.returncode, read


def can_switch_user() -> bool:
    return shutil.which("setpriv") is not None and Path("/usr/bin/python3").exists()


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshHosts]:
    if not (have_ssh_hosts() and can_switch_user()):
        pytest.skip("needs root, sshd, ssh, rsync, ip and setpriv")
    with ssh_hosts(tmp_path_factory.mktemp("ssh")) as started:
        yield started


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    if not (have_slurm() and can_switch_user()):
        pytest.skip("needs slurm-wlm, munge and setpriv")
    with slurm_cluster(tmp_path_factory.mktemp("slurm")) as running:
        yield running


def test_no_other_user_reads_the_token_during_an_ssh_run(tmp_path: Path, hosts: SshHosts) -> None:
    project = render_ssh(tmp_path, hosts.addresses, **{"cluster.remote_dir": str(tmp_path / "on-the-hosts")})
    token = secrets.token_hex(16)
    output, code, read = watched_run(
        project, ssh_runner_env(hosts, project), token, "launch/node1.sh", "--interval", "2"
    )
    assert code == 0, output
    assert read["uid"] != 0 and read["scans"] > 10
    assert read["marks"], read  # it did see the run's processes
    assert read["hits"] == [], read
    (run_dir,) = run_dirs(project)
    assert token not in (run_dir / "logs" / "ssh-node-1.log").read_text()


def test_no_other_user_reads_the_token_during_a_slurm_run(tmp_path: Path, cluster: SlurmCluster) -> None:
    project = render_slurm(tmp_path)
    token = secrets.token_hex(16)
    output, code, read = watched_run(
        project, slurm_runner_env(cluster, project), token, "launch/entry.sh", "--interval", "2"
    )
    assert code == 0, output
    assert read["uid"] != 0 and read["scans"] > 10
    assert read["marks"], read
    assert read["hits"] == [], read
