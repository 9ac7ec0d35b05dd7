"""`npu-wizard doctor` on a project that runs the user's own script: there, and free of nccl/cuda on the NPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_doctor_command import doctor, render_project, user_env
from tests.wizard_forks import wizard

SCRIPT_WITH_CUDA = """\
import os
import torch
import torch.distributed as dist

# cuda and nccl in a comment are not code: no warning for this line


def setup():
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
"""
SCRIPT_FOR_NPU = """\
import torch
import torch_npu  # noqa: F401

backend = "hccl" if torch.npu.is_available() else "gloo"
"""


def own_project(tmp_path: Path, device: str, text: str | None) -> Path:
    """A one-node project (device `device`) whose training.script is src/main.py holding `text` (None: absent)."""
    project = render_project(
        tmp_path, project_name="own", device=device, devices_per_node=2, **{"training.script": "src/main.py"}
    )
    if text is not None:
        (project / "src").mkdir()
        (project / "src" / "main.py").write_text(text)
    return project


def script_line(output: str) -> str:
    """The doctor's line about the script, with its fix line when it has one."""
    lines = output.splitlines()
    index = next(i for i, line in enumerate(lines) if line[6:].startswith("script "))
    follows = lines[index + 1] if index + 1 < len(lines) and "fix:" in lines[index + 1] else ""
    return " ".join(part.split() and " ".join(part.split()) for part in (lines[index], follows) if part)


def test_an_npu_project_whose_script_names_nccl_and_cuda_gets_a_warning_naming_file_and_lines(
    tmp_path: Path,
) -> None:
    project = own_project(tmp_path, "npu", SCRIPT_WITH_CUDA)
    result = doctor(str(project))
    line = script_line(result.stdout)
    assert line.startswith(
        "WARN script src/main.py names nccl or cuda on an NPU project: line 9: '\"nccl\"', line 10: 'cuda'"
    ), result.stdout
    assert 'fix: on the NPU the backend is hccl and the device npu: backend = "hccl" if device == "npu"' in line


def test_an_npu_script_with_hccl_passes_and_a_cpu_project_is_not_searched(tmp_path: Path) -> None:
    assert script_line(doctor(str(own_project(tmp_path / "npu", "npu", SCRIPT_FOR_NPU))).stdout) == (
        "PASS script src/main.py is there and names neither nccl nor cuda"
    )
    assert script_line(doctor(str(own_project(tmp_path / "cpu", "cpu", SCRIPT_WITH_CUDA))).stdout) == (
        "PASS script src/main.py is there (device cpu: nccl/cuda not looked for)"
    )


def test_a_missing_script_fails_with_where_to_put_it(tmp_path: Path) -> None:
    project = own_project(tmp_path, "cpu", None)
    result = doctor(str(project))
    assert result.returncode != 0
    line = script_line(result.stdout)
    assert line.startswith(f"FAIL script src/main.py (training.script) is not in {project}: every rank would stop")
    assert f"fix: put your script at {project / 'src' / 'main.py'}" in line


def test_a_project_with_the_generated_script_has_no_script_line(tmp_path: Path) -> None:
    project = render_project(tmp_path, project_name="gen", device="npu", devices_per_node=2)
    assert not any(line[6:].startswith("script ") for line in doctor(str(project)).stdout.splitlines())


# A script whose top level acts at once: run or imported, it leaves a marker and ends the process.
SCRIPT_THAT_ACTS = """\
import pathlib
import sys

pathlib.Path({marker!r}).write_text("the script ran")
sys.exit(7)
"""


# platform.py: the name of a module the software probe imports, in the folder doctor runs in
# A PYTHONPATH that ends in ':' (CANN's set_env.sh prepends to an empty one) names the working folder again.
@pytest.mark.parametrize(
    ("device", "script", "pythonpath"),
    [("npu", "my_train.py", None), ("cpu", "platform.py", None), ("cpu", "platform.py", "/opt/cann/python:")],
)
def test_doctor_reads_the_script_and_never_runs_or_imports_it(
    tmp_path: Path, device: str, script: str, pythonpath: str | None
) -> None:
    marker = tmp_path / "ran"
    project = render_project(
        tmp_path, project_name="own", device=device, devices_per_node=2, **{"training.script": script}
    )
    (project / script).write_text(SCRIPT_THAT_ACTS.format(marker=str(marker)))
    # from the project folder, as a user runs it: the script is a top-level module there
    result = wizard(  # a process of its own (tests/wizard_forks.py)
        ["doctor"], cwd=project, env=user_env(**({"PYTHONPATH": pythonpath} if pythonpath else {})), timeout=180
    )
    assert not marker.exists(), result.stdout + result.stderr
    assert script_line(result.stdout).startswith(f"PASS script {script} is there"), result.stdout
    assert "PASS  python " in result.stdout, result.stdout  # the probe imported torch, not the script


def stdlib_line(output: str) -> str:
    """The doctor's line about standard-library names, with its fix line."""
    lines = output.splitlines()
    index = next(i for i, line in enumerate(lines) if line[6:].startswith("stdlib names "))
    follows = lines[index + 1] if index + 1 < len(lines) and "fix:" in lines[index + 1] else ""
    return " ".join(" ".join(part.split()) for part in (lines[index], follows) if part)


def test_a_repository_file_that_hides_a_standard_library_module_is_named(tmp_path: Path) -> None:
    """The project is first on every rank's PYTHONPATH: its random.py is what torch gets for `import random`."""
    project = own_project(tmp_path, "cpu", "import random\n")
    (project / "random.py").write_text("seed = 1\n")
    (project / "logging").mkdir()
    (project / "logging" / "__init__.py").write_text("")
    (project / "src" / "json.py").write_text("")
    (project / "typing").mkdir()  # no __init__.py: a namespace package gives way to the real typing
    (project / "utils.py").write_text("")
    line = stdlib_line(doctor(str(project)).stdout)
    assert line == (
        "WARN stdlib names logging/ (in the project folder (first on PYTHONPATH)) hides the standard library's "
        "logging; random.py (in the project folder (first on PYTHONPATH)) hides the standard library's random; "
        "src/json.py (in the script's folder (first on sys.path)) hides the standard library's json: every rank, "
        "torch included, imports it in the module's place "
        "fix: rename it (and its imports), or move it into a package of your own"
    )


def test_a_project_without_such_files_passes_the_stdlib_names_check(tmp_path: Path) -> None:
    project = own_project(tmp_path, "cpu", "import random\n")
    (project / "helpers.py").write_text("")
    assert stdlib_line(doctor(str(project)).stdout) == (
        "PASS stdlib names no file of the project hides a standard-library module"
    )
