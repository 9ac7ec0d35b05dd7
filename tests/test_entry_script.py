"""launch/entry.sh under a scheduler's variables: the same ranks as the per-node scripts, or a loud stop.

The entry script and the shared launch script run for real under bash. A test
double stands in for `scontrol` (no Slurm controller is asked here; the real
cluster is in test_slurm_engine.py), and the fake rank of test_launch_scripts
records each rank's environment.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
from pathlib import Path

import pytest

from tests.test_launch_scripts import fake_bin, render_project, script_env, with_fake_train

# scontrol double: the job's nodes are n1 and n2, both at 127.0.0.1.
SCONTROL_DOUBLE = """\
#!/usr/bin/env bash
case "$1 $2" in
"show hostnames") printf 'n1\\nn2\\n' ;;
"show node") echo "NodeName=$3 Arch=x86_64 CoresPerSocket=1"; echo "   NodeAddr=127.0.0.1 NodeHostName=localhost" ;;
*) echo "scontrol double: unexpected $*" >&2; exit 1 ;;
esac
"""
JOB_ID = 1234


def slurm_variables(node: int, **overrides: str) -> dict[str, str]:
    """What srun gives each task of a two-node job with one task per node."""
    variables = {
        "SLURM_JOB_ID": str(JOB_ID),
        "SLURM_NODEID": str(node),
        "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURM_NTASKS_PER_NODE": "1",
        "SLURM_PROCID": str(node),
    }
    variables.update(overrides)
    return variables


def doubles(tmp_path: Path) -> Path:
    """A folder with the scontrol double and a recording torchrun stand-in, to put first on PATH."""
    folder = fake_bin(tmp_path, "torchrun")
    (folder / "scontrol").write_text(SCONTROL_DOUBLE)
    (folder / "scontrol").chmod(0o755)
    return folder


def ranks_seen(record: Path) -> dict[int, dict[str, str]]:
    """Each recorded rank's place in the job and its address variables."""
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "HCCL_IF_IP", "NODE_RANK")
    seen = {}
    for path in sorted(record.glob("rank-*.json")):
        env = json.loads(path.read_text())["env"]
        seen[int(env["RANK"])] = {key: env.get(key, "") for key in keys}
    return seen


def run_script(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("launcher", ["shell", "torchrun"])
def test_entry_under_slurm_gives_the_ranks_the_per_node_scripts_give(tmp_path: Path, launcher: str) -> None:
    by_hand = render_project(tmp_path / "manual", nodes=2, launcher=launcher)
    slurm = render_project(
        tmp_path / "slurm",
        nodes=2,
        launcher=launcher,
        **{"cluster.engine": "slurm", "network.host_ips": None, "network.master_addr": None},
    )
    records = {}
    for name, project in (("manual", by_hand), ("slurm", slurm)):
        record = with_fake_train(project, tmp_path / name)
        for node in (0, 1):
            if name == "manual":
                command, extra = ["bash", f"launch/node{node}.sh"], {}
            else:
                command, extra = ["bash", "launch/entry.sh"], slurm_variables(node)
            env = script_env(record, doubles(tmp_path), NPU_WIZARD_SKIP_PREFLIGHT="1", **extra)
            result = run_script(command, project, env)
            assert result.returncode == 0, result.stdout + result.stderr
        records[name] = record
    if launcher == "torchrun":  # the fake torchrun recorded the flags it was given on the last node
        argv = (records["slurm"] / "torchrun.argv").read_text().split()
        assert argv[argv.index("--master-port") + 1] == str(29500 + JOB_ID % 1000)
        assert argv[argv.index("--node-rank") + 1] == "1"
        assert argv[argv.index("--master-addr") + 1] == "127.0.0.1"
        return
    assert ranks_seen(records["slurm"]) == ranks_seen(records["manual"])
    env = json.loads((records["slurm"] / "rank-3.json").read_text())["env"]
    assert env["MASTER_PORT"] == str(29500 + JOB_ID % 1000)
    assert env["HCCL_IF_BASE_PORT"] == str(60000 + (JOB_ID % 64) * 16)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"SLURM_NNODES": "3"}, "the job has 3 node(s) but this project was rendered for 2"),
        ({"SLURM_NODEID": ""}, "SLURM_NODEID is not set: run this through srun in slurm/job.sbatch"),
        ({"SLURM_NODEID": "x"}, "SLURM_NODEID='x' is not a node index"),
        ({"SLURM_NTASKS_PER_NODE": "2"}, "one task per node expected"),
        ({"CUDA_VISIBLE_DEVICES": "0"}, "this node sees 1 device(s) (0) but runs 2 rank(s)"),
    ],
)
def test_entry_stops_loudly_on_a_surprise_and_starts_nothing(
    tmp_path: Path, overrides: dict[str, str], message: str
) -> None:
    project = render_project(
        tmp_path, nodes=2, **{"cluster.engine": "slurm", "network.host_ips": None, "network.master_addr": None}
    )
    record = with_fake_train(project, tmp_path)
    env = script_env(record, doubles(tmp_path), NPU_WIZARD_SKIP_PREFLIGHT="1", **slurm_variables(0, **overrides))
    result = run_script(["bash", "launch/entry.sh"], project, env)
    assert result.returncode == 2
    assert message in result.stderr
    assert list(record.iterdir()) == []


def test_the_shared_script_refuses_to_start_without_the_entry_script(tmp_path: Path) -> None:
    project = render_project(
        tmp_path, nodes=2, **{"cluster.engine": "slurm", "network.host_ips": None, "network.master_addr": None}
    )
    record = with_fake_train(project, tmp_path)
    result = run_script(["bash", "launch/run-node.sh"], project, script_env(record))
    assert result.returncode == 2
    assert "start launch/entry.sh instead" in result.stderr


def hold_a_port(host: str, first: int, last: int) -> socket.socket:
    """A listening socket on the first port from `first` to `last` that is free here (another job's, in effect)."""
    for port in range(first, last + 1):
        holder = socket.socket()
        try:
            holder.bind((host, port))
        except OSError:
            holder.close()
            continue
        holder.listen()
        return holder
    raise AssertionError(f"no free port in {first}-{last} to hold")


SLURM_PORTS = {
    "cluster.engine": "slurm",
    "network.host_ips": None,
    "network.master_addr": None,
    "network.master_port": 29500,
    "network.hccl_base_port": 60000,
    "network.hccl_port_count": 16,
}


def test_a_master_port_another_job_holds_stops_node_0_naming_the_port_and_the_job(tmp_path: Path) -> None:
    project = render_project(tmp_path, nodes=2, device="cpu", **SLURM_PORTS)
    record = with_fake_train(project, tmp_path)
    with hold_a_port("0.0.0.0", 29500, 30499) as holder:
        port = holder.getsockname()[1]
        job = 7000 + port - 29500  # MASTER_PORT = 29500 + job id % 1000
        env = script_env(record, doubles(tmp_path), **slurm_variables(0, SLURM_JOB_ID=str(job)))
        result = run_script(["bash", "launch/entry.sh"], project, env)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert f"preflight FAIL: master port: {port} is taken" in output
    assert f"job {job} takes master port {port} from its job id; another job on" in output
    assert "probably holds it" in output
    assert f"ss -tlnp 'sport = :{port}'" in output
    assert list(record.iterdir()) == []  # no launcher, no rank


def numbers_in(listed: str) -> set[int]:
    """The ports of a list such as "61008, 61010-61012"."""
    ports: set[int] = set()
    for part in listed.split(","):
        low, _, high = part.strip().partition("-")
        ports.update(range(int(low), int(high or low) + 1))
    return ports


def test_hccl_ports_another_job_holds_stop_the_node_naming_the_port_and_the_slot(tmp_path: Path) -> None:
    project = render_project(tmp_path, nodes=2, device="npu", **SLURM_PORTS)
    record = with_fake_train(project, tmp_path)
    # the last slot (61008-61023) lies above Linux's default ephemeral range (32768-60999): no connection of
    # another process is given a port beside the held one, which the check would rightly name too
    with hold_a_port("127.0.0.1", 61008, 61023) as holder:
        port = holder.getsockname()[1]
        slot = (port - 60000) // 16
        job = slot + 64 * 3  # HCCL_IF_BASE_PORT = 60000 + (job id % 64) x 16
        env = script_env(record, doubles(tmp_path), **slurm_variables(1, SLURM_JOB_ID=str(job)))
        result = run_script(["bash", "launch/entry.sh"], project, env)
    output = result.stdout + result.stderr
    first = 60000 + slot * 16
    assert result.returncode == 1, output
    pattern = rf"preflight FAIL: HCCL ports: ([0-9, -]+) taken on 127\.0\.0\.1 \(HCCL needs {first}-{first + 15}\)"
    said = re.search(pattern, output)
    assert said and port in numbers_in(said[1]), output
    assert f"job {job} takes HCCL slot {slot} ({first}-{first + 15}) from its job id" in output
    assert f"another job on {socket.gethostname()} in slot {slot} probably holds it" in output
    assert list(record.iterdir()) == []


def test_an_inherited_master_port_is_ignored_under_slurm(tmp_path: Path) -> None:
    project = render_project(tmp_path, nodes=2, **SLURM_PORTS)
    record = with_fake_train(project, tmp_path)
    env = script_env(
        record, doubles(tmp_path), NPU_WIZARD_SKIP_PREFLIGHT="1", MASTER_PORT="12345", **slurm_variables(1)
    )
    result = run_script(["bash", "launch/entry.sh"], project, env)
    assert result.returncode == 0, result.stdout + result.stderr
    argv = (record / "torchrun.argv").read_text().split()
    assert argv[argv.index("--master-port") + 1] == str(29500 + JOB_ID % 1000)


def test_a_one_node_job_moves_past_ports_another_job_holds(tmp_path: Path) -> None:
    # HCCL slots from 20000, below Linux's default ephemeral range (32768-60999), where any connection of the
    # suite's other workers may hold a port of a slot: with slots from 60000 the port this test held was taken
    # once, and once the job kept its slot without a word (runtime.ports keeps it when it finds no slot free).
    # Master port 29500 + 8127 % 1000 = 29627, HCCL slot 8127 % 64 = 63: ports 21008-21023; slot 0: 20000-20015.
    project = render_project(tmp_path, nodes=1, device="cpu", **{**SLURM_PORTS, "network.hccl_base_port": 20000})
    record = with_fake_train(project, tmp_path)
    job = 8127
    variables = slurm_variables(0, SLURM_JOB_ID=str(job), SLURM_NNODES="1", SLURM_JOB_NODELIST="n1")
    env = script_env(record, doubles(tmp_path), NPU_WIZARD_SKIP_PREFLIGHT="1", **variables)
    with hold_a_port("0.0.0.0", 29627, 29627), hold_a_port("0.0.0.0", 21014, 21014):
        result = run_script(["bash", "launch/entry.sh"], project, env)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    host = socket.gethostname()
    assert f"entry: master port 29627 is taken on {host} (another job?): job {job} takes " in output
    assert f"entry: HCCL slot 63 is taken on {host} (another job?): job {job} takes slot " in output
    master = int(output.split(f"job {job} takes ")[1].split()[0])
    slot = int(output.split(f"job {job} takes slot ")[1].split()[0])
    assert master != 29627 and slot != 63
    assert f"master 127.0.0.1:{master}, HCCL_IF_IP 127.0.0.1, HCCL ports from {20000 + slot * 16}" in output
    argv = (record / "torchrun.argv").read_text().split()
    assert argv[argv.index("--master-port") + 1] == str(master)
