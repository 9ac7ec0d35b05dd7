"""The Python the launch scripts run, and the check that it (and its launcher) can be found before any node starts.

`npu-wizard run` starts the launch scripts with the interpreter it runs in itself (the torchrun
beside it goes first on PATH: launch/run-node.sh puts the interpreter's folder there), unless the
project names another (`run.python`) or PYTHON is set for this run. A missing interpreter or
torchrun is refused by each engine's `check`, with the fix, before anything starts: here for the
manual engine, over the same ssh on every host for the ssh engine, on the login node for Slurm.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Mapping

from wizard.answers.model import Answers

ENV_PYTHON = "PYTHON"
LAUNCHER_MARK = "npu-wizard-launcher:"
LAUNCHER_PROGRAMS = {"torchrun": ("torchrun",), "torch-npu-run": ("torch_npu_run", "torchrun")}
"""The programs beside the interpreter (or on PATH) a launcher starts, any one of them."""


def interpreter(answers: Answers, env: Mapping[str, str]) -> str:
    """The Python the launch scripts run: PYTHON where set, else the project's run.python, else npu-wizard's own.

    A path relative to where npu-wizard runs (PYTHON=venv/bin/python) is made absolute here: launch/run-node.sh
    runs in the project's folder, where it would name another file. A bare name (python3) is looked up on PATH.
    """
    python = env.get(ENV_PYTHON) or os.environ.get(ENV_PYTHON) or answers.get("run.python") or sys.executable
    return os.path.abspath(python) if "/" in python else python


def fix(where: str) -> str:
    """How to name another interpreter."""
    return (
        f"set run.python in answers.yaml to the Python that has torch {where} (e.g. your virtual environment's "
        "bin/python; npu-wizard update PROJECT writes it into the launch scripts), or PYTHON=/path/to/python for "
        "one run"
    )


def launcher_problem(answers: Answers, python: str, path: str | None = None) -> str | None:
    """Why the launch scripts cannot start the ranks with `python` on this host; None where they can."""
    path = os.environ.get("PATH", os.defpath) if path is None else path
    found = python if "/" in python else shutil.which(python, path=path)
    if not found or not os.path.isfile(found) or not os.access(found, os.X_OK):
        return f"the Python {python} for the ranks is not there (or not executable) on this host: {fix('here')}"
    programs = LAUNCHER_PROGRAMS.get(answers["launcher"], ())
    beside = os.pathsep.join([os.path.dirname(found), path])
    if programs and not any(shutil.which(program, path=beside) for program in programs):
        return (
            f"{programs[-1]} (the {answers['launcher']} launcher) is neither beside {found} nor on PATH on this "
            f"host: install torch into that Python ({found} -m pip install torch), or {fix('here')}"
        )
    return None


def launcher_check(answers: Answers, python: str) -> str:
    """Shell words that print LAUNCHER_MARK and what is missing where `python` or its launcher is not found."""
    quoted = shlex.quote(python)
    words = [
        f'if ! f="$(command -v {quoted})"; then echo "{LAUNCHER_MARK} no Python {quoted}"; ',
    ]
    programs = LAUNCHER_PROGRAMS.get(answers["launcher"], ())
    if programs:
        found = " || ".join(f'PATH="${{f%/*}}:$PATH" command -v {program} >/dev/null' for program in programs)
        words.append(f'elif ! {{ {found}; }}; then echo "{LAUNCHER_MARK} no {programs[-1]} beside $f nor on PATH"; ')
    words.append("fi")
    return "".join(words)


def remote_problems(outputs: list[str], hosts: tuple[str, ...]) -> list[str]:
    """Each host whose check (launcher_check) found something missing, with what."""
    problems = []
    for node, output in enumerate(outputs):
        for line in output.splitlines():
            if line.startswith(LAUNCHER_MARK):
                problems.append(f"node {node} ({hosts[node]}): {line[len(LAUNCHER_MARK) :].strip()}")
    return problems
