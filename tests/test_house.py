"""The house of wizard/: each shared piece of machinery lives in one module, which every caller imports.

Issue 36 item 32: the run and update locks, the run-folder reader and the atomic writes each had two copies.
Read from the source with `ast`, like tests/test_layout.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

WIZARD = Path(__file__).resolve().parent.parent / "wizard"


def calls_of(name: str) -> list[str]:
    """The modules of wizard/ (paths relative to it) that call `name`, an attribute such as `fcntl.flock`."""
    owner, _, attribute = name.rpartition(".")
    found = set()
    for path in sorted(WIZARD.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == attribute
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == owner
            ):
                found.add(str(path.relative_to(WIZARD)))
    return sorted(found)


def test_one_module_takes_and_reads_every_lock_of_a_project() -> None:
    """The run locks and the update lock, and the no-flock fallback, are taken in wizard/render/project_locks.py."""
    assert calls_of("fcntl.flock") == ["render/project_locks.py"]


def test_one_module_writes_a_file_atomically() -> None:
    """A new file beside the target, moved into place (the run folder's records, the report): wizard/atomic_files.py.

    The bundle's archive (0600, and never replacing a file without --force) and RUN/hang/ (written relative to
    its opened folder, wizard/monitor/safe_folder.py) are written their own way on purpose.
    """
    assert calls_of("tempfile.mkstemp") == ["atomic_files.py"]


def names_of(name: str) -> list[str]:
    """The modules of wizard/ that name the attribute `name` (such as `stat.S_IFIFO`) anywhere."""
    owner, _, attribute = name.rpartition(".")
    found = set()
    for path in sorted(WIZARD.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr == attribute:
                if isinstance(node.value, ast.Name) and node.value.id == owner:
                    found.add(str(path.relative_to(WIZARD)))
    return sorted(found)


def test_one_module_reads_a_run_folder_refusing_what_is_no_regular_file() -> None:
    """monitor, run, report and bundle read run folders through wizard/monitor/run_files.py (the bundle's own
    copy, bundle/safe.py, with its own words for the same refusals, is gone)."""
    assert names_of("stat.S_IFIFO") == ["monitor/run_files.py"]
    assert not (WIZARD / "bundle" / "safe.py").exists()


def class_of(path: Path, name: str) -> ast.ClassDef:
    """The class `name` defined in the module at `path`."""
    (found,) = [n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef) and n.name == name]
    return found


def declared(protocol: ast.ClassDef) -> set[str]:
    """The attributes and methods a Protocol class names."""
    return {n.target.id for n in protocol.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)} | {
        n.name for n in protocol.body if isinstance(n, ast.FunctionDef)
    }


def used_of_self(part: ast.ClassDef) -> set[str]:
    """Every `self.NAME` a class reads or writes."""
    return {
        n.attr
        for n in ast.walk(part)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"
    }


def set_by_job() -> set[str]:
    """What wizard.run.job.Job defines: its methods and every attribute its __init__ sets."""
    job = class_of(WIZARD / "run" / "job.py", "Job")
    (init,) = [n for n in job.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
    targets = [t for n in ast.walk(init) if isinstance(n, (ast.Assign, ast.AnnAssign)) for t in _targets(n)]
    return {n.name for n in job.body if isinstance(n, ast.FunctionDef)} | {
        t.attr
        for t in targets
        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
    }


def _targets(node: ast.Assign | ast.AnnAssign) -> list[ast.expr]:
    return list(node.targets) if isinstance(node, ast.Assign) else [node.target]


@pytest.mark.parametrize(
    ("module", "part", "protocol"),
    [("job_stacks", "JobStacks", "StacksOfJob"), ("job_restarts", "JobRestarts", "RestartsOfJob")],
)
def test_a_part_of_job_uses_only_what_its_protocol_declares_and_job_defines_all_of_it(
    module: str, part: str, protocol: str
) -> None:
    """JobStacks and JobRestarts are parts of Job: each names what it uses of Job in a Protocol, uses nothing
    else of it, and Job sets or defines every name the Protocol holds (none falls back to the Protocol's stub)."""
    path = WIZARD / "run" / f"{module}.py"
    own = {n.name for n in class_of(path, part).body if isinstance(n, ast.FunctionDef)}
    names = declared(class_of(path, protocol))
    assert used_of_self(class_of(path, part)) - own - names == set()
    assert names - set_by_job() == set()
