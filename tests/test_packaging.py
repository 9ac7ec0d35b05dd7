"""A non-editable install works from any folder: the templates travel inside the wheel."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

# One xdist worker runs this file (`--dist loadgroup`), so that its module fixture `wheel` is made once,
# not once per worker: a wheel built by pip, about 2 CPU s
pytestmark = pytest.mark.xdist_group("packaging-wheel")

ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
        check=True,
        timeout=300,
    )
    (built,) = out.glob("npu_wizard-*.whl")
    return built


def test_wheel_holds_the_packages_and_the_templates(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "wizard/cli.py" in names
    assert "runtime/__init__.py" in names
    assert "wizard/_templates/project/cookiecutter.json" in names
    assert "wizard/_templates/project/hooks/pre_gen_project.py" in names
    assert "wizard/_templates/project/{{cookiecutter.project_name}}/train.py" in names
    assert "wizard/_templates/project/{{cookiecutter.project_name}}/launch/_node.sh.j2" in names
    assert any(name.endswith("entry_points.txt") for name in names)


def test_installed_wheel_renders_from_another_folder(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        check=True,
        timeout=300,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    where = subprocess.run(
        [sys.executable, "-c", "import wizard, runtime; print(wizard.__file__); print(runtime.__file__)"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert all(line.startswith(str(site)) for line in where.stdout.split()), where.stdout
    result = subprocess.run(
        [sys.executable, "-m", "wizard", "--answers", str(ROOT / "examples" / "cpu-demo.yaml"), "-o", "out"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert (elsewhere / "out" / "cpu-demo" / "launch" / "node1.sh").is_file()
    assert (elsewhere / "out" / "cpu-demo" / "runtime" / "__init__.py").is_file()
