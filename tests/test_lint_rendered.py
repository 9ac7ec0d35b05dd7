"""Every rendered file over the answer matrix passes its linters.

Shell: `bash -n` and shellcheck. Python: py_compile, `ruff check` and
`ruff format --check` with ruff's defaults (the project's own settings do not
apply to generated code). No `cuda`/`nccl` literal anywhere in a project's
own files.
"""

from __future__ import annotations

import py_compile
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.matrix import ALL, case_answers
from wizard.render import render

BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    """A linter from this interpreter's environment, else from PATH."""
    found = BIN / name if (BIN / name).exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[test]'")
    return str(found)


@pytest.fixture(scope="module")
def projects(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("matrix")
    return {case: render(case_answers(case), root / case.replace(":", "-")).project_dir for case in ALL}


@pytest.mark.parametrize("case", ALL)
def test_shell_scripts_pass_bash_n_and_shellcheck(case: str, projects: dict[str, Path]) -> None:
    scripts = sorted(str(p) for p in projects[case].rglob("*.sh"))
    assert scripts
    for script in scripts:
        subprocess.run(["bash", "-n", script], check=True)
    result = subprocess.run([tool("shellcheck"), "--severity=style", *scripts], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("case", ALL)
def test_python_compiles_and_passes_ruff(case: str, projects: dict[str, Path]) -> None:
    project = projects[case]
    sources = sorted(str(p) for p in project.rglob("*.py"))
    for source in sources:
        py_compile.compile(source, doraise=True, cfile=str(Path(source).with_suffix(".pyc.lint")))
    for path in project.rglob("*.pyc.lint"):
        path.unlink()
    for command in (["check", "--isolated", "--no-cache"], ["format", "--isolated", "--no-cache", "--check"]):
        result = subprocess.run([tool("ruff"), *command, *sources], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("case", ALL)
def test_no_cuda_or_nccl_literals_in_generated_files(case: str, projects: dict[str, Path]) -> None:
    project = projects[case]
    for path in project.rglob("*"):
        if path.is_file() and path.relative_to(project).parts[0] not in ("runtime", ".npu-wizard"):
            assert not re.search(r"cuda|nccl", path.read_text(), re.IGNORECASE), path
