"""Any script name is the user's: `training.script: train.py` runs their train.py, and doctor reads what it imports."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.runs import free_port, node_env
from tests.test_doctor_command import doctor, render_project
from tests.test_doctor_user_script import script_line
from tests.test_user_script import SCRIPTS, run_to_the_end
from wizard.answers.model import load_text, resolve
from wizard.render.render import render

SCRIPT_THAT_DELEGATES = """\
from mypkg.dist import setup

setup()
"""
MODULE_WITH_NCCL = """\
import torch.distributed as dist


def setup():
    dist.init_process_group(backend="nccl")
"""


def test_training_script_train_py_is_the_users_script_and_no_train_py_is_generated(tmp_path: Path) -> None:
    project = render_project(tmp_path, project_name="own", device="cpu", **{"training.script": "train.py"})
    assert not (project / "train.py").exists()
    assert "-m runtime.userscript train.py" in (project / "launch" / "run-node.sh").read_text()
    assert load_text((project / "answers.yaml").read_text())["training.script"] == "train.py"


def test_an_older_projects_answers_naming_train_py_with_a_model_still_mean_the_generated_script() -> None:
    old = "schema: 1\nproject_name: old\ndevice: cpu\ntraining:\n  script: train.py\n  model: mlp\n"
    assert load_text(old)["training.script"] is None


def test_doctor_flags_nccl_in_a_module_of_the_repository_that_train_py_imports(tmp_path: Path) -> None:
    project = render_project(
        tmp_path, project_name="own", device="npu", devices_per_node=2, **{"training.script": "train.py"}
    )
    (project / "train.py").write_text(SCRIPT_THAT_DELEGATES)
    (project / "mypkg").mkdir()
    (project / "mypkg" / "__init__.py").write_text("")
    (project / "mypkg" / "dist.py").write_text(MODULE_WITH_NCCL)
    line = script_line(doctor(str(project)).stdout)
    assert line.startswith(
        "WARN script train.py and the 2 module(s) it imports name nccl or cuda on an NPU project: "
        "mypkg/dist.py line 5: '\"nccl\"'"
    ), line


def test_doctor_does_not_follow_imports_out_of_the_repository(tmp_path: Path) -> None:
    project = render_project(
        tmp_path, project_name="own", device="npu", devices_per_node=2, **{"training.script": "train.py"}
    )
    (project / "train.py").write_text("import os\nimport torch.distributed\nfrom runtime import report\n")
    assert script_line(doctor(str(project)).stdout) == "PASS script train.py is there and names neither nccl nor cuda"


@pytest.mark.slow
def test_a_users_train_py_trains_one_node_of_two_ranks_to_the_end(tmp_path: Path) -> None:
    answers = {
        "project_name": "own-train",
        "device": "cpu",
        "nodes": 1,
        "devices_per_node": 2,
        "launcher": "torchrun",
        "network.host_ips": ["127.0.0.1"],
        "network.master_port": free_port(),
        "training.script": "train.py",
        "training.script_args": ["--epochs", "1"],
    }
    project = render(resolve(answers), tmp_path).project_dir
    shutil.copyfile(SCRIPTS / "ddp_tutorial.py", project / "train.py")
    ended = run_to_the_end(project, node_env(project / "runs" / "unused"))
    assert ended.code == 0, ended.output
    for rank in range(2):
        assert f"[rank {rank}] epoch 0 loss " in (ended.run_dir / "logs" / f"rank-{rank}.log").read_text()
