"""Every launch path starts the user's own script through `-m runtime.userscript`, with its arguments intact.

The launch scripts run for real under bash, with the real torchrun and
torch.distributed.launch (and the torchrun fallbacks of torch-npu-run and of a
torch without distributed/launch.py). In most tests the project's
runtime/userscript.py is replaced by a recording double (`USERSCRIPT_DOUBLE`):
they pin what the launchers hand the shim (argv, environment, working folder),
not the shim. The slow tests at the end train the tutorial-style script
(tests/user_scripts/ddp_tutorial.py) for real, 1 node x 2 ranks with gloo on the
CPU, through the real shim under the launchers `npu-wizard run`'s tests leave out.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from tests.runs import events_of, free_port, kinds
from tests.test_launch_scripts import project_answers, run_node, script_env
from wizard.answers.model import resolve
from wizard.errors import AnswersError
from wizard.render.k8s import refresh_configmap
from wizard.render.render import render

# Stands in for runtime/userscript.py: records what each rank was started with.
USERSCRIPT_DOUBLE = """\
import json, os, sys
rank = os.environ.get("RANK", "?")
with open(os.path.join(os.environ["FAKE_RECORD"], f"rank-{rank}.json"), "w") as f:
    json.dump({"argv": sys.argv[1:], "env": dict(os.environ), "cwd": os.getcwd(),
               "cpus": sorted(os.sched_getaffinity(0))}, f)
"""
SCRIPT = "src/my train.py"
ARGS = ["--data", "/data/my set", "--tag", "it's", "--empty", ""]
EXPECTED_ARGV = [SCRIPT, *ARGS, "--epochs", "1"]
# What launch/run-node.sh exports for this 1-node loopback project, whatever the device (the answers' defaults:
# HCCL's host ports from 60000, its timeouts); GLOO_SOCKET_IFNAME is the interface of HCCL's address.
JOB_ENV = {
    "NODE_RANK": "0",
    "NNODES": "1",
    "NPROC_PER_NODE": "2",
    "MASTER_ADDR": "127.0.0.1",
    "HCCL_IF_IP": "127.0.0.1",
    "HCCL_WHITELIST_DISABLE": "1",
    "HCCL_IF_BASE_PORT": "60000",
    "HCCL_CONNECT_TIMEOUT": "120",
    "HCCL_EXEC_TIMEOUT": "1836",
    "GLOO_SOCKET_IFNAME": "lo",
}
# Exported by device and torch_npu release: never inherited from the test's own environment.
DEVICE_ENV = (
    "TASK_QUEUE_ENABLE",
    "CPU_AFFINITY_CONF",
    "TORCH_DEVICE_BACKEND_AUTOLOAD",
    "GLOO_SOCKET_IFNAME",
    "NPU_WIZARD_DEVICE",
)
# A python that says torch has no distributed/launch.py: run-node.sh then falls back to torchrun.
NO_LAUNCH_PY = """\
#!/usr/bin/env bash
if [[ "$1" == -c ]]; then exit 1; fi
exec {python} "$@"
"""


def own_project(tmp_path: Path, **overrides: object) -> Path:
    """A CPU project on loopback (1 node x 2 ranks) that runs SCRIPT with ARGS, the shim replaced by the double."""
    raw = project_answers(**{"training.script": SCRIPT, "training.script_args": ARGS, **overrides})
    project = render(resolve(raw), tmp_path / "out").project_dir
    (project / "runtime" / "userscript.py").write_text(USERSCRIPT_DOUBLE)
    return project


def run_ranks(project: Path, tmp_path: Path, **extra: str) -> list[dict]:
    """Run node 0 with `--epochs 1`; return what ranks 0 and 1 recorded."""
    record = tmp_path / "record"
    record.mkdir()
    env = script_env(
        record,
        **{
            "NPU_WIZARD_SKIP_PREFLIGHT": "1",
            "NPU_WIZARD_RUN_DIR": str(tmp_path / "run"),
            "MASTER_PORT": str(free_port()),
            **extra,
        },
    )
    for name in DEVICE_ENV:
        env.pop(name, None)
    env["PYTHONPATH"] = "/inherited/path"
    done = run_node(project, 0, env, "--epochs", "1", timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return [json.loads((record / f"rank-{rank}.json").read_text()) for rank in (0, 1)]


@pytest.mark.parametrize("launcher", ["shell", "torchrun", "torch-npu-run", "torch-launch"])
def test_every_launcher_starts_the_users_script_through_the_shim_with_its_arguments(
    launcher: str, tmp_path: Path
) -> None:
    project = own_project(tmp_path, launcher=launcher)
    port = str(free_port())  # not the answers' 29500: MASTER_PORT set by the caller wins
    ranks = run_ranks(project, tmp_path, MASTER_PORT=port)
    for rank, seen in enumerate(ranks):
        argv = [arg for arg in seen["argv"] if not arg.startswith("--local-rank=")]  # torch.distributed.launch's
        assert argv == EXPECTED_ARGV
        env = seen["env"]
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == (str(rank), str(rank), "2")
        assert (env["LOCAL_WORLD_SIZE"], env["MASTER_PORT"]) == ("2", port)
        assert {name: env.get(name) for name in JOB_ENV} == JOB_ENV
        # a CPU project: torch_npu's settings left out, and no torch_npu loading itself without CANN
        assert (env.get("TASK_QUEUE_ENABLE"), env.get("CPU_AFFINITY_CONF")) == (None, None)
        assert env["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "0" and "HCCL_SOCKET_IFNAME" not in env
        assert env["NPU_WIZARD_DEVICE"] == "cpu"  # what the README's backend line reads
        assert env["NPU_WIZARD_RUN_DIR"] == str(tmp_path / "run")
        assert env["PYTHONPATH"] == f"{project}:/inherited/path"
        assert seen["cwd"] == str(project) and not (project / "train.py").exists()


def test_an_npu_project_hands_the_users_script_torch_npus_settings_too(tmp_path: Path) -> None:
    # device npu with a current torch_npu (no NPU or CANN needed: the double records, the preflight is skipped)
    project = own_project(tmp_path, launcher="torch-npu-run", device="npu")
    ranks = run_ranks(project, tmp_path)
    for seen in ranks:
        env = seen["env"]
        assert {name: env.get(name) for name in JOB_ENV} == JOB_ENV
        assert (env["TASK_QUEUE_ENABLE"], env["CPU_AFFINITY_CONF"]) == ("2", "1")
        assert "TORCH_DEVICE_BACKEND_AUTOLOAD" not in env  # torch_npu must load itself on the NPU
        assert env["NPU_WIZARD_DEVICE"] == "npu"


def test_torch_launch_falls_back_to_torchrun_with_the_same_script_and_arguments(tmp_path: Path) -> None:
    project = own_project(tmp_path, launcher="torch-launch")
    python = tmp_path / "python-without-launch"
    python.write_text(NO_LAUNCH_PY.format(python=os.path.realpath(sys.executable)))
    python.chmod(0o755)
    ranks = run_ranks(project, tmp_path, PYTHON=str(python))
    assert [seen["argv"] for seen in ranks] == [EXPECTED_ARGV, EXPECTED_ARGV]


def test_the_shell_loop_pins_each_rank_of_the_users_script_with_taskset(tmp_path: Path) -> None:
    # torch_npu 2.1.0.post6 predates CPU_AFFINITY_CONF: the loop pins ranks itself (device npu, no NPU needed here).
    project = own_project(
        tmp_path,
        launcher="shell",
        device="npu",
        hardware="atlas-training",
        amp="fp16",
        **{"environment.torch_npu_version": "2.1.0.post6", "environment.torch_version": "2.1.0"},
    )
    ranks = run_ranks(project, tmp_path)
    cores = os.cpu_count() or 1
    if cores < 2:
        pytest.skip("taskset pins one core per rank: needs 2 cores")
    # the cores are split into one share per device of the server (8 on the Atlas training series), and rank r takes
    # the share of the device it uses (device r here); with fewer cores than devices there is no share to pin to
    share = cores // 8
    if share:
        assert [seen["cpus"] for seen in ranks] == [list(range(0, share)), list(range(share, 2 * share))]
    else:
        assert [seen["cpus"] for seen in ranks] == [list(range(cores)), list(range(cores))]
    assert [seen["argv"] for seen in ranks] == [EXPECTED_ARGV, EXPECTED_ARGV]
    # this torch_npu keeps its own dispatch default and predates CPU_AFFINITY_CONF (hence taskset)
    assert all("TASK_QUEUE_ENABLE" not in seen["env"] and "CPU_AFFINITY_CONF" not in seen["env"] for seen in ranks)


def test_force_replacement_keeps_the_users_script_and_its_folder(tmp_path: Path) -> None:
    answers = resolve(project_answers(**{"training.script": "src/main.py"}))
    project = render(answers, tmp_path).project_dir
    (project / "src").mkdir()
    (project / "src" / "main.py").write_text("from model import Net\n")
    (project / "src" / "model.py").write_text("class Net: ...\n")
    render(answers, tmp_path, force=True)
    assert (project / "src" / "main.py").read_text() == "from model import Net\n"
    assert (project / "src" / "model.py").read_text() == "class Net: ...\n"


def test_the_kubernetes_configmap_carries_the_users_script_once_it_exists(tmp_path: Path) -> None:
    raw = project_answers(
        nodes=2,
        **{
            "network.host_ips": ["127.0.0.1", "127.0.0.1"],
            "cluster.engine": "pytorchjob",
            "cluster.image": "registry.example.com/ml/pytorch:2.9.0",
            "training.script": "src/train_mine.py",
        },
    )
    answers = resolve(raw)
    project = render(answers, tmp_path).project_dir
    assert "src.train_mine.py" not in (project / "k8s" / "project.yaml").read_text()
    (project / "src").mkdir()
    (project / "src" / "train_mine.py").write_text("print('mine')\n")
    refresh_configmap(project, answers)  # as `npu-wizard run` does before it submits
    assert "src.train_mine.py: |\n    print('mine')" in (project / "k8s" / "project.yaml").read_text()
    assert (
        "src.train_mine.py src/train_mine.py"
        in yaml.safe_load((project / "k8s" / "project.yaml").read_text())["data"]["npu-wizard.paths"]
    )


def test_a_kubernetes_script_name_must_fit_a_configmap_key() -> None:
    raw = project_answers(**{"cluster.engine": "pytorchjob", "cluster.image": "registry.example.com/ml/pytorch:2.9.0"})
    with pytest.raises(AnswersError) as caught:
        resolve({**raw, "training.script": "src/my train.py"})
    assert [p.field for p in caught.value.problems] == ["training.script"]
    assert "ConfigMap, whose keys allow only letters, digits, '.', '_' and '-'" in caught.value.problems[0].message


# ---- the real script, trained under each launcher ------------------------------------------

SCRIPTS = Path(__file__).resolve().parent / "user_scripts"
TUTORIAL_EPOCHS = 2
# torch.distributed.launch hands each process --local-rank=N; the shim passes it on only to a script
# that declares the option, so the tutorial's parser, which does not, runs unchanged under it too
# what the launch script says it ran, besides the ranks' output
LAUNCHER_SAYS = {
    "shell": "node 0: started ranks 0-1 of 2",
    "torch-launch": "node 0: NOTE: torch.distributed.launch is deprecated upstream in favour of torchrun",
    "torch-npu-run": "node 0: torch_npu_run not found (torch_npu not installed: CPU simulation?); using torchrun",
}


def tutorial_project(tmp_path: Path, launcher: str) -> Path:
    """A CPU project (1 node x 2 ranks, gloo) that trains tests/user_scripts/ddp_tutorial.py through the real shim."""
    raw = project_answers(
        launcher=launcher,
        **{
            "network.master_port": free_port(),
            "training.script": "ddp_tutorial.py",
            "training.script_args": ["--epochs", str(TUTORIAL_EPOCHS)],
        },
    )
    project = render(resolve(raw), tmp_path / "out").project_dir
    shutil.copyfile(SCRIPTS / "ddp_tutorial.py", project / "ddp_tutorial.py")
    return project


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["shell", "torch-launch", "torch-npu-run"])
def test_each_launcher_trains_the_tutorial_style_script_to_its_last_epoch(launcher: str, tmp_path: Path) -> None:
    project = tutorial_project(tmp_path, launcher)
    run_dir = tmp_path / "run"
    env = script_env(tmp_path / "record", NPU_WIZARD_RUN_DIR=str(run_dir))
    done = run_node(project, 0, env, timeout=240)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert LAUNCHER_SAYS[launcher] in output
    if launcher == "torch-launch":  # this torch still ships torch.distributed.launch: no torchrun fallback
        assert "torch.distributed.launch is gone" not in output
    assert "node 0: finished; logs in " in output
    assert sorted(events_of(run_dir)) == [0, 1]
    for rank in (0, 1):
        # the shim recorded where the launcher put the rank (torch-npu-run's: torchrun's, as its fallback)
        started = kinds(events_of(run_dir)[rank], "started")[0]
        assert (started["world_size"], started["local_rank"], started["node"]) == (2, rank, 0)
        log = (run_dir / "logs" / f"rank-{rank}.log").read_text()
        for epoch in range(TUTORIAL_EPOCHS):
            assert f"[rank {rank}] epoch {epoch} loss " in log, log
        (ended,) = kinds(events_of(run_dir)[rank], "finished")  # the shim saw the script end, exit 0
        assert ended["exit_code"] == 0


def test_the_preflight_names_a_project_file_that_hides_a_standard_library_module(tmp_path: Path) -> None:
    """PYTHONPATH starts with the project: its random.py would be every rank's `import random`, torch's too."""
    project = own_project(tmp_path, launcher="shell")
    (project / "random.py").write_text("seed = 1\n")
    record = tmp_path / "record"
    record.mkdir()
    env = script_env(record, NPU_WIZARD_RUN_DIR=str(tmp_path / "run"), MASTER_PORT=str(free_port()))
    done = run_node(project, 0, env, "--epochs", "1", timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr  # a warning: the ranks still start
    assert (
        "node 0: preflight WARN: stdlib names: random.py (in the project folder (first on PYTHONPATH)) hides the "
        "standard library's random: every rank, torch included, imports it in the module's place; "
        "fix: rename it (and its imports), or move it into a package of your own"
    ) in done.stdout, done.stdout
    (project / "random.py").unlink()
    done = run_node(project, 0, env, "--epochs", "1", timeout=120)
    assert "stdlib names" in done.stdout.split("preflight ok: ", 1)[1].splitlines()[0], done.stdout
