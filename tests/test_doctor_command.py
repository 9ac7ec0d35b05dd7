"""`npu-wizard doctor` as a user runs it: one screen, every FAIL with its fix, --json, exit codes.

The software probe runs for real in the project's interpreter (this venv,
torch on the CPU). torch_npu cannot exist here; where a test needs one, a
stand-in package (`stand_in_torch_npu`) goes on PYTHONPATH: one that fails
to load like torch_npu without CANN, one that loads and reports a version,
and one registered for torch's backend auto-loading.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.factories import answers
from tests.runs import free_port
from tests.wizard_forks import wizard
from wizard.answers.model import resolve
from wizard.doctor import software
from wizard.doctor.probe import probe_software
from wizard.render.render import render

BIN = str(Path(sys.executable).parent)
FOREIGN = "203.0.113.77"  # TEST-NET-3: not on this host; never sent any traffic
SCREEN = 24
NO_CANN = "ImportError: libhccl.so: cannot open shared object file: No such file or directory"


def user_env(**extra: str) -> dict[str, str]:
    """A user's shell: this venv first on PATH, no CANN, no leftovers from a launch script."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NPU_WIZARD_", "ASCEND_", "HCCL_", "CANN_"))}
    env.pop("PYTHONPATH", None)
    env.update({"PATH": f"{BIN}:{env.get('PATH', '')}", "PYTHON": sys.executable, **extra})
    return env


def doctor(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    """Run `npu-wizard doctor ARGS` the way a user does, a process of its own (tests/wizard_forks.py)."""
    return wizard(["doctor", *args], env=user_env(**extra), timeout=180)


def render_project(tmp_path: Path, **raw: object) -> Path:
    """Render a project from dotted-name answers into tmp_path."""
    return render(resolve(raw), tmp_path / "out").project_dir


def stand_in_torch_npu(tmp_path: Path, body: str, *, autoload: bool = False) -> Path:
    """A folder holding a torch_npu stand-in (for PYTHONPATH); `autoload` registers it as torch does."""
    folder = tmp_path / "stand_in_torch_npu"
    (folder / "torch_npu").mkdir(parents=True)
    (folder / "torch_npu" / "__init__.py").write_text(body)
    if autoload:
        info = folder / "torch_npu-2.9.0.post6.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_npu\nVersion: 2.9.0.post6\n")
        (info / "entry_points.txt").write_text("[torch.backends]\ntorch_npu = torch_npu:_autoload\n")
    return folder


def without_cann_body() -> str:
    """torch_npu's import without CANN sourced (ERR00008)."""
    return f"raise ImportError({NO_CANN.split(': ', 1)[1]!r} + \". Please run 'source set_env.sh' in the CANN path\")\n"


# ---- the report a person reads --------------------------------------------------------


def test_a_simulated_cpu_project_passes_in_one_screen(tmp_path: Path) -> None:
    project = render_project(
        tmp_path, project_name="sim", device="cpu", nodes=2, devices_per_node=2, **{"network.master_port": free_port()}
    )
    result = doctor(str(project))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "npu-wizard doctor: sim, node 0 of 2 (127.0.0.1, every node simulated on this host), device cpu"
    assert lines[1] == f"PASS  python               {sys.version.split()[0]} ({sys.executable})"
    assert lines[2].startswith("PASS  torch                2.")
    assert lines[-1].endswith("0 failed, 9 skipped: ready")
    assert len(lines) <= SCREEN


def test_a_broken_node_fails_each_problem_with_its_fix_a_line_each_and_nothing_more(tmp_path: Path) -> None:
    reserved = tmp_path / "reserved_ports"
    reserved.write_text("29500\n")
    project = render_project(
        tmp_path,
        project_name="cluster",
        device="npu",
        nodes=2,
        **{
            "network.host_ips": [FOREIGN, "198.51.100.7"],
            "network.master_addr": FOREIGN,
            "environment.cann_set_env": str(tmp_path / "no-cann" / "set_env.sh"),
        },
    )
    result = doctor(str(project), NPU_WIZARD_RESERVED_PORTS_FILE=str(reserved))
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    # compact: the header, a line per check, one fix line under each problem, the verdict; nothing more
    checks = [line for line in lines if line[:4] in ("PASS", "WARN", "FAIL", "SKIP")]
    fixes = [number for number, line in enumerate(lines) if line.lstrip().startswith("fix: ")]
    assert len(lines) == 2 + len(checks) + len(fixes), result.stdout
    assert all(lines[number - 1][:4] in ("WARN", "FAIL") for number in fixes), result.stdout
    failed = {line.split()[1] for line in lines if line.startswith("FAIL")}
    assert {"torch_npu", "CANN", "HCCL_IF_IP", "HCCL", "master"} <= failed, result.stdout
    for index, line in enumerate(lines):
        if line.startswith("FAIL"):
            assert lines[index + 1].lstrip().startswith("fix: "), line
    assert "node 0 of 2 (203.0.113.77, assumed: no host IP of the project is here)" in lines[0]


def test_json_parses_and_every_fail_carries_a_fix(tmp_path: Path) -> None:
    project = render_project(
        tmp_path, project_name="npu", device="npu", **{"environment.cann_set_env": str(tmp_path / "none.sh")}
    )
    result = doctor(str(project), "--json")
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert (report["project"], report["node"], report["device"], report["ok"]) == ("npu", 0, "npu", False)
    names = [check["name"] for check in report["checks"]]
    assert names[:5] == ["python", "torch", "torch_npu", "CANN", "devices"]
    assert all(check["fix"] for check in report["checks"] if check["status"] == "FAIL")
    assert report["counts"]["FAIL"] == sum(check["status"] == "FAIL" for check in report["checks"])


def test_exit_codes_for_no_project_a_wrong_node_and_bad_usage(tmp_path: Path) -> None:
    missing = doctor(str(tmp_path))
    assert missing.returncode == 1 and "no answers.yaml" in missing.stderr
    project = render_project(tmp_path, project_name="one", device="cpu")
    wrong = doctor(str(project), "--node", "3")
    assert wrong.returncode == 1 and "--node 3: this project has nodes 0 to 0" in wrong.stderr
    assert doctor("--bogus").returncode == 2


def test_doctor_never_imports_torch_itself() -> None:
    probe = "import sys, wizard.cli, wizard.doctor; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "False", result.stderr


# ---- the software probe, in a subprocess -------------------------------------------------


def test_probe_explains_torch_npu_failing_without_cann(tmp_path: Path) -> None:
    folder = stand_in_torch_npu(tmp_path, without_cann_body())
    found = probe_software(user_env(PYTHONPATH=str(folder)))
    assert found.torch and found.torch_npu is None
    assert found.torch_npu_error.startswith(NO_CANN)
    assert found.torch_npu_fix.startswith("CANN is not sourced: import torch_npu could not load libhccl.so")
    result = software.check_torch_npu(found, answers(device="npu", hardware="atlas-a2", devices_per_node=2))
    assert result.status == "FAIL" and result.fix == found.torch_npu_fix


def test_probe_reads_the_installed_torch_npu_and_its_devices(tmp_path: Path) -> None:
    body = (
        "import types, torch\n"
        "__version__ = '2.9.0.post6'\n"
        "torch.npu = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 8)\n"
    )
    found = probe_software(user_env(PYTHONPATH=str(stand_in_torch_npu(tmp_path, body))))
    assert (found.torch_npu, found.npu_count) == ("2.9.0.post6", 8)
    result = software.check_torch_npu(found, answers(device="npu", hardware="atlas-a2", devices_per_node=2))
    installed = found.torch.split("+")[0]
    if installed.startswith("2.9.0"):
        pytest.skip("this venv's torch happens to pair with the stand-in")
    assert result.status == "FAIL" and result.detail == f"2.9.0.post6 needs torch 2.9.0, but torch is {found.torch}"


def test_probe_sees_import_torch_fail_on_autoloading_torch_npu(tmp_path: Path) -> None:
    folder = stand_in_torch_npu(tmp_path, "def _autoload():\n    pass\n" + without_cann_body(), autoload=True)
    found = probe_software(user_env(PYTHONPATH=str(folder)))
    assert found.autoload_error and "Failed to load the backend extension: torch_npu" in found.autoload_error
    assert found.torch, "the second probe, with TORCH_DEVICE_BACKEND_AUTOLOAD=0, imports torch"
    result = software.check_torch_npu(found, answers(device="npu", hardware="atlas-a2", devices_per_node=2))
    assert result.status == "FAIL" and result.detail.startswith("`import torch` fails: RuntimeError: Failed to load")
    assert result.fix.startswith("CANN is not sourced") and "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in result.fix


def test_a_missing_interpreter_is_a_failure_with_its_fix() -> None:
    found = probe_software(user_env(PYTHON="/nonexistent/python3"))
    result = software.check_python(found)
    assert result.status == "FAIL" and "set PYTHON" in result.fix
