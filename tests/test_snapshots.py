"""Snapshot tests of rendered projects over the answer matrix.

To accept a change to the templates, re-record the snapshots and review the diff:

    NPU_WIZARD_UPDATE_SNAPSHOTS=1 python -m pytest tests/test_snapshots.py
    git diff tests/snapshots
"""

from __future__ import annotations

import filecmp
import os
import shutil
from pathlib import Path

import pytest

import runtime
from tests.matrix import ALL, case_answers
from wizard.render.render import render

SNAPSHOTS = Path(__file__).parent / "snapshots"
UPDATE = os.environ.get("NPU_WIZARD_UPDATE_SNAPSHOTS") == "1"


def snapshot_name(case: str) -> str:
    return case.replace("example:", "example-")


def rendered_files(project: Path) -> dict[str, str]:
    """The rendered text of every file but the runtime copy and the pristine copy, keyed by relative path."""
    return {
        path.relative_to(project).as_posix(): path.read_text()
        for path in sorted(project.rglob("*"))
        if path.is_file() and path.relative_to(project).parts[0] not in ("runtime", ".npu-wizard")
    }


@pytest.mark.parametrize("case", ALL)
def test_rendered_project_matches_its_snapshot(case: str, tmp_path: Path) -> None:
    project = render(case_answers(case), tmp_path).project_dir
    files = rendered_files(project)
    recorded = SNAPSHOTS / snapshot_name(case)
    if UPDATE:
        shutil.rmtree(recorded, ignore_errors=True)
        for name, text in files.items():
            (recorded / name).parent.mkdir(parents=True, exist_ok=True)
            (recorded / name).write_text(text)
    expected = {p.relative_to(recorded).as_posix(): p.read_text() for p in sorted(recorded.rglob("*")) if p.is_file()}
    assert sorted(files) == sorted(expected), "file list changed; see the module docstring to update"
    for name, text in files.items():
        assert text == expected[name], f"{name} differs from tests/snapshots/{snapshot_name(case)}/{name}"


def test_no_snapshot_is_orphaned() -> None:
    assert sorted(p.name for p in SNAPSHOTS.iterdir()) == sorted(snapshot_name(c) for c in ALL)


def test_the_project_carries_an_exact_copy_of_the_runtime(tmp_path: Path) -> None:
    project = render(case_answers("example:cpu-demo"), tmp_path).project_dir
    package = Path(runtime.__file__).parent
    names = sorted(p.name for p in package.glob("*.py"))
    assert sorted(p.name for p in (project / "runtime").iterdir()) == names
    match, mismatch, errors = filecmp.cmpfiles(package, project / "runtime", names, shallow=False)
    assert (mismatch, errors) == ([], [])
