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
from wizard.answers.model import resolve
from wizard.render.render import render

# One xdist worker runs this file (`--dist loadgroup`), so that its module fixture `projects` is made once,
# not once per worker: the whole answer matrix rendered, about 1.5 CPU s
pytestmark = pytest.mark.xdist_group("lint-rendered-projects")

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


def lint_shell(scripts: list[str]) -> None:
    """bash -n and shellcheck (every severity) pass on `scripts`."""
    assert scripts
    for script in scripts:
        subprocess.run(["bash", "-n", script], check=True)
    result = subprocess.run([tool("shellcheck"), "--severity=style", *scripts], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def lint_python(project: Path) -> None:
    """Every Python file of `project` compiles and passes ruff check and ruff format with ruff's defaults."""
    sources = sorted(str(p) for p in project.rglob("*.py"))
    for source in sources:
        py_compile.compile(source, doraise=True, cfile=str(Path(source).with_suffix(".pyc.lint")))
    for path in project.rglob("*.pyc.lint"):
        path.unlink()
    # from the project folder, as its user runs ruff: its own modules (runtime, model) are first-party there
    for command in (["check", "--isolated", "--no-cache"], ["format", "--isolated", "--no-cache", "--check"]):
        result = subprocess.run([tool("ruff"), *command, *sources], capture_output=True, text=True, cwd=project)
        assert result.returncode == 0, result.stdout + result.stderr


def no_cuda_or_nccl(project: Path) -> None:
    """No cuda/nccl literal in the project's own files (the runtime copy may name them)."""
    for path in project.rglob("*"):
        # k8s/project.yaml is the ConfigMap copy of the project's files, runtime/ included
        relative = path.relative_to(project)
        skipped = relative.parts[0] in ("runtime", ".npu-wizard") or relative.as_posix() == "k8s/project.yaml"
        if path.is_file() and not skipped:
            # Slurm hands a GRES of NPUs over as CUDA_VISIBLE_DEVICES (it has no Ascend plugin);
            # launch/entry.sh copies it to ASCEND_RT_VISIBLE_DEVICES. Only that name may appear.
            text = path.read_text().replace("CUDA_VISIBLE_DEVICES", "")
            assert not re.search(r"cuda|nccl", text, re.IGNORECASE), path


@pytest.mark.parametrize("case", ALL)
def test_shell_scripts_pass_bash_n_and_shellcheck(case: str, projects: dict[str, Path]) -> None:
    lint_shell(sorted(str(p) for pattern in ("*.sh", "*.sbatch") for p in projects[case].rglob(pattern)))


@pytest.mark.parametrize("case", ALL)
def test_python_compiles_and_passes_ruff(case: str, projects: dict[str, Path]) -> None:
    lint_python(projects[case])


@pytest.mark.parametrize("case", ALL)
def test_no_cuda_or_nccl_literals_in_generated_files(case: str, projects: dict[str, Path]) -> None:
    no_cuda_or_nccl(projects[case])


def test_a_4096_node_project_passes_the_same_lint(tmp_path: Path) -> None:
    # The node scripts differ from node 0's only in the node's rank, IP and ranks: that is
    # checked for all 4096, and the linters run on the first, second and last (the widest
    # numbers) with every other script; linting all 4096 would take minutes.
    ips = [f"10.{node // 65536}.{node // 256 % 256}.{node % 256}" for node in range(1, 4097)]
    raw = {"nodes": 4096, "devices_per_node": 16, "hardware": "atlas-a3", "launcher": "torch-npu-run"}
    answers = resolve({**raw, "network.host_ips": ips, "network.master_addr": ips[0]})
    project = render(answers, tmp_path).project_dir
    launch = project / "launch"
    first = (launch / "node0.sh").read_text().splitlines()
    varying = {1, first.index("export NODE_RANK=0"), first.index("export NODE_ADDR=10.0.0.1")}
    for node, ip in enumerate(ips):
        lines = (launch / f"node{node}.sh").read_text().splitlines()
        assert [line for n, line in enumerate(lines) if n not in varying] == [
            line for n, line in enumerate(first) if n not in varying
        ]
        assert (
            f"launch script for node {node} of 4096 (host IP {ip}), ranks {16 * node}-{16 * node + 15} of" in lines[1]
        )
        assert (lines[first.index("export NODE_RANK=0")], lines[first.index("export NODE_ADDR=10.0.0.1")]) == (
            f"export NODE_RANK={node}",
            f"export NODE_ADDR={ip}",
        )
    assert sorted(p.name for p in launch.iterdir()) == sorted([*(f"node{n}.sh" for n in range(4096)), "run-node.sh"])
    shown = [launch / "node0.sh", launch / "node1.sh", launch / "node4095.sh", launch / "run-node.sh"]
    lint_shell([str(p) for p in [*shown, *project.glob("sysctl/*.sh")]])
    lint_python(project)
    no_cuda_or_nccl(project)
