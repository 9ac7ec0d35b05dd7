"""`npu-wizard bundle` reaches the other nodes through the run's engine: ssh to the two namespace hosts of the
test suite (tests/ssh_hosts.py), whose PATH holds recording doubles of npu-smi and hccn_tool (no NPU exists here);
a Slurm job whose allocation is gone and a Kubernetes job without pods are named in the manifest.

The run folder is written here as a finished ssh run leaves it (run.json, each rank's started event): what is
real is the bundle, ssh, the hosts' sshd and the script each host runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ssh_hosts import SshHosts, have_ssh_hosts, ssh_hosts
from wizard.answers.model import resolve
from wizard.bundle import nodes
from wizard.bundle.redact import Redactor
from wizard.render.render import render

PLANTED = "planted-secret-5c1d"
PIDS = {0: 41000, 1: 41001, 2: 42000, 3: 42001}  # rank -> its pid (ranks 0-1 on node 0, 2-3 on node 1)


def recording_double(folder: Path, name: str) -> None:
    """A test double of an NPU host tool: records the host it ran on and its arguments, says which host it is."""
    script = folder / name
    script.write_text(
        "#!/bin/sh\n"
        'host=$(echo "$SSH_CONNECTION" | cut -d" " -f3)\n'
        f'echo "$host $*" >> "{folder}/{name}.calls"\n'
        f'echo "{name} double on $host"\n'
    )
    script.chmod(0o755)


@pytest.fixture(scope="module")
def doubles(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("doubles")
    recording_double(folder, "npu-smi")
    recording_double(folder, "hccn_tool")
    return folder


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory, doubles: Path) -> Iterator[SshHosts]:
    """The two hosts, each session's PATH starting with the doubles' folder (sshd's SetEnv)."""
    if not have_ssh_hosts():
        pytest.skip("needs root, sshd, ssh, rsync and ip (.ci/run installs them)")
    extra = dict.fromkeys((0, 1), f"SetEnv PATH={doubles}:/usr/bin:/bin\n")
    with ssh_hosts(tmp_path_factory.mktemp("ssh"), extra=extra) as started:
        yield started


def ssh_run_folder(tmp_path: Path, addresses: list[str], plog_root: Path) -> Path:
    """An ssh project on `addresses` and a run folder as its 2 x 2 run left it."""
    raw = {
        "project_name": "bundle-nodes", "device": "cpu", "nodes": 2, "devices_per_node": 2, "launcher": "torchrun",
        "amp": "off", "cluster.engine": "ssh", "network.host_ips": addresses, "network.master_addr": addresses[0],
    }  # fmt: skip
    project = render(resolve(raw), tmp_path / "out").project_dir
    run_dir = project / "runs" / "20261127-120000"
    (run_dir / "events").mkdir(parents=True)
    info = {"project": str(project), "engine": "ssh", "nodes": [0, 1], "node_count": 2, "job_id": ",".join(addresses)}
    (run_dir / "run.json").write_text(json.dumps(info))
    for rank, pid in PIDS.items():
        started = {
            "event": "started", "rank": rank, "node": rank // 2, "local_rank": rank % 2, "device": f"npu:{rank % 2}",
            "pid": pid, "host": "node", "environment": {"ASCEND_PROCESS_LOG_PATH": str(plog_root)},
        }  # fmt: skip
        (run_dir / "events" / f"rank-{rank}.jsonl").write_text(json.dumps(started) + "\n")
    return run_dir


def bundle_members(run_dir: Path, out: Path, env: dict[str, str]) -> dict[str, bytes]:
    done = subprocess.run(
        [sys.executable, "-m", "wizard", "bundle", str(run_dir), "-o", str(out)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    with tarfile.open(out) as archive:
        return {
            member.name.split("/", 1)[1]: archive.extractfile(member).read()  # type: ignore[union-attr]
            for member in archive.getmembers()
            if member.isfile()
        }


def manifest_lines(members: dict[str, bytes]) -> tuple[list[str], dict[str, str]]:
    """The manifest's 'in this bundle' lines and its 'missing' reasons by name."""
    text = members["MANIFEST.txt"].decode()
    included = text.split("In this bundle:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    missing = text.split("Missing, and why:\n", 1)[1].splitlines()
    return [line.strip() for line in included], dict(line.strip().split(": ", 1) for line in missing if ": " in line)


@pytest.mark.slow
def test_each_ssh_node_s_tools_and_plogs_come_over_the_engine_s_ssh(
    tmp_path: Path, hosts: SshHosts, doubles: Path
) -> None:
    plog_root = tmp_path / "ascend-log"
    (plog_root / "debug" / "plog").mkdir(parents=True)
    node_1_plog = plog_root / "debug" / "plog" / f"plog-{PIDS[2]}_20261127120000001.log"
    node_1_plog.write_text(f"[ERROR] HCCL timeout PASSWORD={PLANTED}\n")
    run_dir = ssh_run_folder(tmp_path, hosts.addresses, plog_root)
    env = {
        **os.environ,
        "NPU_WIZARD_SSH_COMMAND": hosts.ssh_command,
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
    }
    members = bundle_members(run_dir, tmp_path / "b.tar.gz", env)
    for node, address in enumerate(hosts.addresses):
        assert members[f"nodes/node-{node}/npu-smi-info.txt"] == f"npu-smi double on {address}\n".encode()
        for device in (0, 1):
            assert (
                members[f"nodes/node-{node}/hccn_tool-{device}-link.txt"] == f"hccn_tool double on {address}\n".encode()
            )
    calls = sorted((doubles / "hccn_tool.calls").read_text().splitlines())
    assert calls == sorted(
        f"{address} -i {device} -{what} -g"
        for address in hosts.addresses
        for device in (0, 1)
        for what in ("link", "ip")
    )
    assert sorted((doubles / "npu-smi.calls").read_text().splitlines()) == sorted(f"{a} info" for a in hosts.addresses)
    plog = members[f"nodes/node-1/plog/debug-{node_1_plog.name}"].decode()
    assert "[ERROR] HCCL timeout PASSWORD=" in plog and PLANTED not in plog
    included, missing = manifest_lines(members)
    size = len(members["nodes/node-1/npu-smi-info.txt"])
    assert f"nodes/node-1/npu-smi-info.txt ({size} bytes; from node 1, over ssh to {hosts.addresses[1]})" in included
    assert missing["nodes/node-0/plog/"] == f"no plog file of node 0's ranks' pids under {plog_root}"
    assert "host/npu-smi" in missing  # this host (the runner's) has no NPU tools


def test_a_node_that_cannot_be_reached_is_named_with_ssh_s_reason() -> None:
    reach = nodes.ssh_reach(["203.0.113.9"], [0, 1])
    assert reach.why_not == {1: "the answers name no ssh host for node 1"}
    found = FakeBundle()
    reach.commands[0] = [
        sys.executable,
        "-c",
        "import sys; sys.stderr.write('ssh: connect to host: No route'); exit(255)",
    ]
    nodes.collect_nodes(reach, {}, found, Redactor())
    assert found.missing == {
        "nodes/node-1/": "the answers name no ssh host for node 1",
        "nodes/node-0/": "could not be reached over ssh to 203.0.113.9: ssh: connect to host: No route",
    }


def test_what_ssh_said_of_a_node_it_could_not_reach_is_redacted_too() -> None:
    """ssh's stderr goes into the manifest's reasons: a password in a proxy URL or an sshpass line it echoes
    is hidden there as everywhere else in the bundle."""
    reach = nodes.ssh_reach(["203.0.113.9"], [0])
    said = f"kex_exchange_identification: proxy http://alice:{PLANTED}@proxy:3128 refused; sshpass -p {PLANTED}"
    reach.commands[0] = [sys.executable, "-c", f"import sys; sys.stderr.write({said!r}); exit(255)"]
    found = FakeBundle()
    nodes.collect_nodes(reach, {}, found, Redactor())
    why = found.missing["nodes/node-0/"]
    assert why.startswith("could not be reached over ssh to 203.0.113.9: kex_exchange_identification: proxy")
    assert PLANTED not in why


def test_a_long_failure_is_cut_at_a_word_so_no_secret_is_cut_past_its_shape() -> None:
    """A query's failure is kept to its last 300 characters: the cut never lands inside a word, where it
    could leave `lice:PASSWORD@proxy`, which no redaction pattern knows."""
    url = f"http://alice:{PLANTED}@proxy:3128"
    for into in range(len(url)):  # the 300-character cut at every character of the URL
        # the last 300 characters start `into` characters into the URL
        said = "x " * 50 + url + " " + "y" * (300 - len(url) + into - 1)
        command = [sys.executable, "-c", f"import sys; sys.stderr.write({said!r}); exit(1)"]
        ok, why = nodes._run(command, dict(os.environ))
        assert not ok and PLANTED not in Redactor().text(why), (into, why)


class FakeBundle:
    """Records what collect_nodes adds and lacks (the bundle's own interface)."""

    def __init__(self) -> None:
        self.members: dict[str, bytes] = {}
        self.missing: dict[str, str] = {}

    def add(self, name: str, data: bytes, cut: int | None = None, *, note: str = "", header: bool = True) -> None:
        self.members[name] = data

    def lack(self, name: str, why: str) -> None:
        self.missing[name] = why


def fake_tool(folder: Path, name: str, says: str) -> None:
    """A stand-in for a cluster command (no Slurm or Kubernetes cluster is needed to read its answer)."""
    (folder / name).write_text(f"#!/bin/sh\ncat <<'EOF'\n{says}\nEOF\n")
    (folder / name).chmod(0o755)


def test_a_slurm_job_that_ended_has_no_allocation_to_srun_into(tmp_path: Path) -> None:
    fake_tool(tmp_path, "scontrol", "JobId=77 JobName=job JobState=COMPLETED Reason=None NodeList=n[1-2]")
    reach = nodes.slurm_reach("77", [0, 1], {"PATH": f"{tmp_path}:/usr/bin:/bin"})
    why = "job 77 is COMPLETED: its allocation is gone, so srun cannot reach its nodes"
    assert (reach.commands, reach.why_not) == ({}, {0: why, 1: why})


def test_a_running_slurm_job_is_reached_with_srun_on_each_of_its_nodes(tmp_path: Path) -> None:
    (tmp_path / "scontrol").write_text(
        '#!/bin/sh\nif [ "$2" = hostnames ]; then printf "n1\\nn2\\n"; exit; fi\n'
        'echo "JobId=78 JobState=RUNNING NodeList=n[1-2]"\n'
    )
    (tmp_path / "scontrol").chmod(0o755)
    reach = nodes.slurm_reach("78", [0, 1], {"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert reach.commands[1] == [
        "srun", "--jobid=78", "--overlap", "--nodes=1", "--ntasks=1", "--nodelist=n2", "bash", "-c",
    ]  # fmt: skip


def test_a_kubernetes_job_without_pods_says_so(tmp_path: Path) -> None:
    fake_tool(tmp_path, "kubectl", '{"items": []}')
    reach = nodes.kubernetes_reach("pytorchjob", "team/demo", [0, 1], {"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert reach.why_not[1] == "job team/demo has no pod for node 1 any more (the job was deleted or ended)"
    assert reach.commands == {}
