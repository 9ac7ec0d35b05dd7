"""The pods of an AscendJob or a PyTorchJob train for real, under the variables each operator sets.

No cluster runs here, so each pod is played on this host as the operator
would set it up for 2 pods x 2 devices: the ConfigMap's keys as the kubelet
mounts them (a file each), its own workspace, the container's
command from the manifest, and the operator's variables (CLUSTERS.md: for
AscendJob RANK is the pod's node rank, WORLD_SIZE the device count and
LOCAL_RANK the list "0,1"; for PyTorchJob PET_NNODES, PET_NODE_RANK,
PET_NPROC_PER_NODE, with RANK the pod index and WORLD_SIZE pods x processes).
CPU, gloo, 127.0.0.1 for the master Service. The ranks must end as a manual
run of the same answers ends: the same ranks on the same nodes, the same
weights. A user's own script (training.script) trains to its end in pods too:
2 pods of one process each and the shell launcher, as the ConfigMap that carries
the script is the point there, and each process imports torch.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.k8s_pods import pod_command, pod_project
from tests.runs import BIN, events_of, free_port, kinds, run_project, wait_nodes
from wizard.answers.model import resolve
from wizard.render import k8s
from wizard.render.render import render

pytestmark = pytest.mark.slow

NODES, DEVICES = 2, 2
SCRIPTS = Path(__file__).resolve().parent / "user_scripts"


def cpu_answers(engine: str, port: int) -> dict[str, Any]:
    """A small CPU job of 2 nodes x 2 processes (the same training for every engine)."""
    raw: dict[str, Any] = {
        "project_name": f"{engine}-entry",
        "device": "cpu",
        "nodes": NODES,
        "devices_per_node": DEVICES,
        "launcher": "torchrun",
        "amp": "off",
        "cluster.engine": engine,
        "network.master_port": port,
        "training.samples": 1024,
        "training.batch_size": 16,
        "training.epochs": 2,
        "training.log_every": 4,
        "training.checkpoint_every": 8,
    }
    if engine == "manual":
        raw["network.host_ips"] = ["127.0.0.1"] * NODES
    else:
        raw["cluster.image"] = "registry.example.com/train:cpu"
    return raw


def operator_env(engine: str, node: int, master_port: int, devices: int = DEVICES) -> dict[str, str]:
    """The variables the operator gives pod `node` of a 2 x `devices` job (the master Service at 127.0.0.1)."""
    common = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port), k8s.POD_IP_ENV: "127.0.0.1"}
    if engine == "ascendjob":
        return {
            **common,
            "RANK": str(node),
            "WORLD_SIZE": str(NODES * devices),
            "LOCAL_WORLD_SIZE": str(devices),
            "LOCAL_RANK": ",".join(str(i) for i in range(devices)),
            "XDL_IP": "127.0.0.1",
        }
    return {
        **common,
        "RANK": str(node),
        "WORLD_SIZE": str(NODES * devices),
        "PET_NNODES": str(NODES),
        "PET_NODE_RANK": str(node),
        "PET_NPROC_PER_NODE": str(devices),
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": str(master_port),
        "PYTHONUNBUFFERED": "1",
    }


def pod_env(extra: dict[str, str]) -> dict[str, str]:
    """The container's environment: the image's PATH (here: this venv first) and the operator's variables."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("NPU_WIZARD_", "PET_"))}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return {
        **env,
        "PATH": f"{BIN}:{env.get('PATH', '')}",
        "PYTHON": sys.executable,
        "NPU_WIZARD_HEARTBEAT_S": "1",
        **extra,
    }


def play_pod(project: Path, engine: str, node: int, root: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Set pod `node` up as the kubelet would and start its command under the operator's `env`."""
    return subprocess.Popen(
        pod_command(project, engine, node, root),
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def rank_outcome(events: dict[int, list[dict]]) -> dict[int, tuple[int, int, str]]:
    """Each rank's node, local rank and final weights."""
    outcome = {}
    for rank, rank_events in events.items():
        started, finished = kinds(rank_events, "started")[-1], kinds(rank_events, "finished")
        assert finished, f"rank {rank} never finished"
        outcome[rank] = (started["node"], started["local_rank"], finished[-1]["weights_sha256"])
    return outcome


@pytest.fixture(scope="module")
def manual_outcome(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[int, int, str]]:
    """How the same training ends under the manual engine (node scripts on 127.0.0.1)."""
    tmp = tmp_path_factory.mktemp("manual")
    project = render(resolve(cpu_answers("manual", free_port())), tmp).project_dir
    for node, (code, output) in enumerate(run_project(project, tmp / "run")):
        assert code == 0, f"manual node {node} exited {code}:\n{output[-3000:]}"
    return rank_outcome(events_of(tmp / "run"))


def train_pods(project: Path, engine: str, tmp_path: Path, devices: int = DEVICES) -> list[tuple[int, str]]:
    """Play every pod of the job (`devices` processes each) under the operator's variables, each in its own
    workspace; each must exit 0."""
    master_port = free_port()
    pods = [
        play_pod(
            project, engine, node, tmp_path / f"pod{node}", pod_env(operator_env(engine, node, master_port, devices))
        )
        for node in range(NODES)
    ]
    results = wait_nodes(pods, timeout=240)
    for node, (code, output) in enumerate(results):
        assert code == 0, f"pod {node} exited {code}:\n{output[-3000:]}"
    return results


@pytest.mark.xdist_group("k8s-manual-outcome")  # one worker makes the manual engine's run once for both
@pytest.mark.parametrize("engine", ["ascendjob", "pytorchjob"])
def test_pods_train_like_the_manual_engine(
    engine: str, tmp_path: Path, manual_outcome: dict[int, tuple[int, int, str]]
) -> None:
    project = render(resolve(cpu_answers(engine, free_port())), tmp_path).project_dir
    results = train_pods(project, engine, tmp_path)
    events: dict[int, list[dict]] = {}
    for node in range(NODES):
        # no shared storage: each pod keeps its own run folder in its workspace
        events.update(events_of(pod_project(project, tmp_path / f"pod{node}") / "runs" / "latest"))
    outcome = rank_outcome(events)
    assert sorted(outcome) == list(range(NODES * DEVICES))
    assert outcome == manual_outcome
    assert "entry: pod" in results[0][1]


# The user's own script: the PyTorch DDP tutorial's src/ddp_tutorial.py, started by a src/main.py beside it,
# so that the pods can train only if the ConfigMap puts the module back at its path next to the script.
OWN_SCRIPT = {
    "src/ddp_tutorial.py": (SCRIPTS / "ddp_tutorial.py").read_text(),
    "src/main.py": "from ddp_tutorial import main\n\nmain()\n",
}
OWN_EPOCHS = 2
# a pod of one process, the shell launcher: what reaches the pods is the point (the operators' variables for two
# processes a pod, and torchrun under them, are test_pods_train_like_the_manual_engine's)
OWN_DEVICES = 1


@pytest.mark.parametrize("engine", ["ascendjob", "pytorchjob"])
def test_pods_train_a_users_own_script_to_the_end(engine: str, tmp_path: Path) -> None:
    raw = {
        **cpu_answers(engine, free_port()),
        "devices_per_node": OWN_DEVICES,
        "launcher": "shell",
        "training.script": "src/main.py",
        "training.script_args": ["--epochs", str(OWN_EPOCHS)],
    }
    project = render(resolve(raw), tmp_path).project_dir
    for name, text in OWN_SCRIPT.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    k8s.refresh_configmap(project, resolve(raw))  # as `npu-wizard run` does before it applies the manifests
    train_pods(project, engine, tmp_path, OWN_DEVICES)
    for node in range(NODES):
        run_dir = pod_project(project, tmp_path / f"pod{node}") / "runs" / "latest"
        events = events_of(run_dir)
        assert sorted(events) == list(range(node * OWN_DEVICES, (node + 1) * OWN_DEVICES))
        for rank, rank_events in events.items():
            log = (run_dir / "logs" / f"rank-{rank}.log").read_text()
            assert f"[rank {rank}] epoch {OWN_EPOCHS - 1} loss " in log, log
            assert kinds(rank_events, "started")[-1]["node"] == node
            assert kinds(rank_events, "finished"), rank_events


SURPRISES = [
    ("ascendjob", {"LOCAL_RANK": "0,1,2"}, "LOCAL_RANK='0,1,2'"),
    ("ascendjob", {"RANK": "0,1"}, "RANK='0,1' is not a node rank"),
    ("ascendjob", {"WORLD_SIZE": "3"}, "not a multiple of LOCAL_WORLD_SIZE"),
    ("ascendjob", {"WORLD_SIZE": "6"}, "the job has 3 node(s) but this project was rendered for 2"),
    ("ascendjob", {"LOCAL_WORLD_SIZE": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "rendered for 2 per node"),
    ("pytorchjob", {"LOCAL_RANK": "0,1"}, "LOCAL_RANK='0,1' is not an integer"),
    ("pytorchjob", {"PET_NNODES": "1:2"}, "an elastic range min:max is not supported"),
    ("pytorchjob", {"PET_NPROC_PER_NODE": "auto"}, "not auto"),
    ("pytorchjob", {"PET_NODE_RANK": "2"}, "node rank 2 is not below the node count 2"),
    ("pytorchjob", {"MASTER_PORT": ""}, "MASTER_PORT is not set"),
]


@pytest.mark.parametrize(("engine", "changed", "message"), SURPRISES, ids=[m for _, _, m in SURPRISES])
def test_the_entry_script_refuses_surprises(engine: str, changed: dict[str, str], message: str, tmp_path: Path) -> None:
    project = render(resolve(cpu_answers(engine, free_port())), tmp_path).project_dir
    env = pod_env({**operator_env(engine, 0, free_port()), **changed})
    result = subprocess.run(
        ["bash", str(project / "launch" / "entry.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr
    assert not (project / "runs").exists(), "nothing may start after a refusal"


# What a rank imports of the project, as launch/run-node.sh starts it: the script's folder comes first on sys.path
# and the project folder is on PYTHONPATH, so a module beside the script, a top-level module, a top-level package
# (one named data/ too: a user's script has no data folder) and a namespace package (no __init__.py) all import.
IMPORTED = {
    "helpers.py": "NAME = 'helpers'\n",
    "data/__init__.py": "",
    "data/loader.py": "NAME = 'data.loader'\n",
    "lib/__init__.py": "",
    "lib/core.py": "NAME = 'lib.core'\n",
    "shared/deep/leaf.py": "NAME = 'shared.deep.leaf'\n",
}
IMPORTS = ["helpers", "data.loader", "lib.core", "shared.deep.leaf"]
BESIDE = {"model.py": "NAME = 'model'\n", "nsutil/text.py": "NAME = 'nsutil.text'\n"}


def importing_script(modules: list[str]) -> str:
    """A script that imports each of `modules` and prints their NAMEs, and nothing else."""
    lines = ["import importlib", "", f"names = [importlib.import_module(m).NAME for m in {modules!r}]"]
    return "\n".join([*lines, "print('imported', ' '.join(names), flush=True)", ""])


@pytest.mark.parametrize("folder", ["src/"])
def test_a_rank_in_a_pod_imports_every_module_run_node_lets_it_import(folder: str, tmp_path: Path) -> None:
    files = {**IMPORTED, **{folder + name: text for name, text in BESIDE.items()}}
    modules = [*IMPORTS, "model", "nsutil.text"]
    files[folder + "main.py"] = importing_script(modules)
    raw = {**cpu_answers("pytorchjob", free_port()), "training.script": folder + "main.py"}
    project = render(resolve(raw), tmp_path).project_dir
    for name, text in files.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    k8s.refresh_configmap(project, resolve(raw))  # as `npu-wizard run` does before it applies the manifests

    train_pods(project, "pytorchjob", tmp_path)

    for node in range(NODES):
        logs = pod_project(project, tmp_path / f"pod{node}") / "runs" / "latest" / "logs"
        for rank in range(node * DEVICES, (node + 1) * DEVICES):
            assert f"imported {' '.join(modules)}\n" in (logs / f"rank-{rank}.log").read_text()


@pytest.mark.parametrize("engine", ["pytorchjob"])
def test_a_rank_in_a_pod_dumps_its_stacks_on_sigusr2_at_a_hang(engine: str, tmp_path: Path) -> None:
    """The pods cannot reach the runner's status stream: at a hang each rank still writes every thread's
    stack to logs/rank-N.stacks.txt in its pod's run folder on SIGUSR2 (what `kubectl exec POD -- kill -USR2`
    sends), the late rank before its backward and the others in it (issue 28's case (a) in the pods)."""
    import signal as signals

    from tests.hang_runs import LATE_RANK, LATE_STEP
    from tests.runs import kill_groups, kill_left_in, wait_for

    answers = {**cpu_answers(engine, free_port()), "training.samples": 4096, "training.log_every": 2}
    project = render(resolve(answers), tmp_path).project_dir
    master_port = free_port()
    plan = {"NPU_WIZARD_REHEARSE": f"hang:{LATE_RANK}:{LATE_STEP}:sleep"}
    pods = [
        play_pod(
            project, engine, node, tmp_path / f"pod{node}", pod_env({**operator_env(engine, node, master_port), **plan})
        )
        for node in range(NODES)
    ]
    runs = [pod_project(project, tmp_path / f"pod{node}") / "runs" / "latest" for node in range(NODES)]
    try:

        def pids() -> dict[int, int] | None:
            found = {}
            for run in runs:
                for rank, rank_events in events_of(run).items():
                    if kinds(rank_events, "step") and kinds(rank_events, "started"):
                        found[rank] = kinds(rank_events, "started")[-1]["pid"]
            return found if len(found) == NODES * DEVICES else None

        where = wait_for(pids, 240, "every rank's first step")
        stacks = {rank: runs[rank // DEVICES] / "logs" / f"rank-{rank}.stacks.txt" for rank in where}
        lines = (project / "train.py").read_text().splitlines()
        backward = [n for n, line in enumerate(lines, 1) if "loss.backward()" in line]

        def dumped(ranks: list[int], needle: str, after: dict[int, int]) -> bool:
            for rank in ranks:
                os.kill(where[rank], signals.SIGUSR2)
            return all(needle in stacks[r].read_text()[after.get(r, 0) :] for r in ranks if stacks[r].exists())

        late = "rehearsal.py"
        wait_for(lambda: dumped([LATE_RANK], late, {}), 120, f"rank {LATE_RANK} asleep before its backward", step=2)
        others = [rank for rank in where if rank != LATE_RANK]
        sizes = {rank: len(stacks[rank].read_text()) if stacks[rank].exists() else 0 for rank in others}
        (line,) = backward
        at_backward = f'train.py", line {line} in _backward'  # Trainer._backward: loss.backward()
        wait_for(
            lambda: dumped(others, at_backward, sizes), 120, "the other ranks in the backward's collective", step=2
        )
    finally:
        kill_groups(pods)
        # torchrun's workers live in sessions of their own: the sleeping rank, which ignores SIGTERM, and the
        # others outlive their pod's process group
        kill_left_in(tmp_path)
