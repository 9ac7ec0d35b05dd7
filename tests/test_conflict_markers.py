"""Markers left by `npu-wizard update --write-conflicts`: update, run and doctor name the files until resolved.

Real projects, a real update writing the markers, then each command as a user runs it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.runs import node_env
from tests.test_doctor_command import doctor
from tests.test_merge import take_side
from tests.test_update import (
    conflicting_project,
    edit_answers,
    files_of,
    kill,
    project_raw,
    render_project,
    start_paused_update,
    update,
)
from wizard.answers.model import load_text
from wizard.errors import TargetError
from wizard.render.pristine import PRISTINE
from wizard.render.update import plan_update
from wizard.render.update_command import write


def first_marker(path: Path) -> int:
    """The line number of the first `<<<<<<< ` in a file."""
    lines = path.read_text().splitlines()
    return next(number for number, line in enumerate(lines, start=1) if line.startswith("<<<<<<< "))


def run(project: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`npu-wizard run PROJECT --plain ARGS` as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "wizard", "run", str(project), "--plain", "--interval", "1", *args],
        env=node_env(tmp_path / "unused"),
        capture_output=True,
        text=True,
        timeout=300,
    )


def project_with_markers(tmp_path: Path) -> tuple[Path, int]:
    """A 2 -> 4 node update whose conflict in train.py was written with markers; the line of its `<<<<<<<`."""
    project = conflicting_project(tmp_path)
    written = update(project, "--write-conflicts")
    assert written.returncode == 1 and "written with <<<<<<< markers: train.py" in written.stderr, written.stderr
    return project, first_marker(project / "train.py")


@pytest.fixture(scope="module")
def markers(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """One project_with_markers for the tests that leave it as it is: update and run refuse it, doctor reads it.

    Mark its readers @pytest.mark.xdist_group("conflict-markers-project"), so that one worker makes it once.
    """
    return project_with_markers(tmp_path_factory.mktemp("markers"))


@pytest.mark.xdist_group("conflict-markers-project")
def test_update_after_write_conflicts_names_the_files_still_holding_markers_and_changes_nothing(
    markers: tuple[Path, int],
) -> None:
    project, line = markers
    before = (project / "train.py").read_bytes()

    result = update(project)

    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.startswith(
        f"npu-wizard: train.py (line {line}) still holds <<<<<<< conflict markers from npu-wizard update: "
        "in each, keep what you want between <<<<<<< and >>>>>>>, and delete the marker lines, "
        f"then run npu-wizard update {project} again"
    )
    assert (project / "train.py").read_bytes() == before


@pytest.mark.xdist_group("conflict-markers-project")
def test_run_refuses_a_project_with_markers_before_starting_anything(markers: tuple[Path, int], tmp_path: Path) -> None:
    project, line = markers

    result = run(project, tmp_path)

    assert result.returncode == 1, result.stdout + result.stderr
    assert f"npu-wizard: train.py (line {line}) still holds <<<<<<< conflict markers" in result.stderr
    assert f"then run npu-wizard run {project} again" in result.stderr
    assert not (project / "runs").exists()


@pytest.mark.xdist_group("conflict-markers-project")
def test_doctor_fails_a_check_naming_the_files_with_markers(markers: tuple[Path, int]) -> None:
    project, line = markers

    result = doctor(str(project))

    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    (failed,) = [index for index, text in enumerate(lines) if text.startswith("FAIL  conflicts")]
    assert lines[failed].endswith(f"train.py (line {line}) still holds <<<<<<< conflict markers from npu-wizard update")
    assert "keep what you want between <<<<<<< and >>>>>>>" in lines[failed + 1]


def test_resolved_markers_let_update_and_doctor_through(tmp_path: Path) -> None:
    project, _ = project_with_markers(tmp_path)
    train = project / "train.py"
    train.write_text(take_side(train.read_text(), "theirs"))

    assert update(project).stdout.endswith(": nothing to change\n")
    # No interpreter for the software probe: the conflicts check reads the project's files alone, and the probe's
    # `import torch` (seconds of CPU) is test_doctor_command's; every other check still runs and prints its line.
    checked = doctor(str(project), PYTHON="/nonexistent/python3")
    assert "PASS  conflicts" in checked.stdout, checked.stdout
    assert "FAIL  python" in checked.stdout, checked.stdout


def answers_with_markers(tmp_path: Path) -> Path:
    """My answers.yaml says epochs: 3; an update from a file saying epochs: 5 wrote the conflict with markers."""
    project = render_project(tmp_path / "projects", project_raw(2))
    answers = project / "answers.yaml"
    other = yaml.safe_load(answers.read_text())
    other["training"]["epochs"] = 5
    (tmp_path / "five.yaml").write_text(yaml.safe_dump(other))
    answers.write_text(answers.read_text().replace("  epochs: 1\n", "  epochs: 3\n"))
    written = update(project, "--answers", str(tmp_path / "five.yaml"), "--write-conflicts")
    assert "written with <<<<<<< markers: answers.yaml" in written.stderr, written.stdout + written.stderr
    return project


def test_markers_in_answers_yaml_are_named_by_update_run_and_doctor_not_a_yaml_error(tmp_path: Path) -> None:
    project = answers_with_markers(tmp_path)
    line = first_marker(project / "answers.yaml")

    for result in (update(project), run(project, tmp_path, "--dry-run"), doctor(str(project))):
        assert result.returncode == 1, result.stdout + result.stderr
        assert f"npu-wizard: answers.yaml (line {line}) still holds <<<<<<< conflict markers" in result.stderr


def test_markers_are_found_from_the_record_when_the_pristine_copy_is_lost(tmp_path: Path) -> None:
    project, line = project_with_markers(tmp_path)
    (project / PRISTINE).unlink()

    result = run(project, tmp_path, "--dry-run")

    assert result.returncode == 1, result.stdout + result.stderr
    assert f"train.py (line {line}) still holds <<<<<<< conflict markers" in result.stderr


@pytest.mark.parametrize("args", [(), ("--write-conflicts",)], ids=["clean", "write-conflicts"])
def test_a_folder_where_the_conflicts_record_goes_is_refused_naming_it(tmp_path: Path, args: tuple[str, ...]) -> None:
    project = conflicting_project(tmp_path) if args else render_project(tmp_path / "projects", project_raw(2))
    if not args:
        edit_answers(project, nodes=4, network__host_ips=["127.0.0.1"] * 4)
    record = project / ".npu-wizard" / "conflicts.json"
    record.mkdir()
    (record / "notes.txt").write_text("mine\n")
    before = files_of(project)

    result = update(project, *args)

    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert f"{record} is a folder; npu-wizard keeps there, as a plain file, the names" in result.stderr
    assert "nothing was changed: remove it, then run update again" in result.stderr
    assert files_of(project) == before
    assert not (project / ".npu-wizard" / "update").exists()


def test_an_update_refused_for_a_pending_journal_leaves_the_conflicts_record_as_it_was(tmp_path: Path) -> None:
    # The wizard's --edit writes with update_command.write and never finishes an interrupted update.
    project = render_project(tmp_path / "projects", project_raw(2))
    edit_answers(project, nodes=4, network__host_ips=["127.0.0.1"] * 4)
    plan = plan_update(project, load_text((project / "answers.yaml").read_text(), project), keep_answers_file=False)
    assert plan.changes and not plan.conflicts
    kill(start_paused_update(project, "after-first-move", tmp_path / "paused"))  # committed, not finished
    record = project / ".npu-wizard" / "conflicts.json"
    record.write_text('["train.py"]\n')  # an earlier --write-conflicts' files, markers maybe unresolved

    with pytest.raises(TargetError, match="was interrupted; run npu-wizard update"):
        write(plan)

    assert record.read_text() == '["train.py"]\n'


def test_a_recorded_name_through_a_linked_folder_is_never_read(tmp_path: Path) -> None:
    project = render_project(tmp_path / "projects", project_raw(2))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f").write_text("<<<<<<< not the project's\nx\n>>>>>>> not the project's\n")
    (project / "d").symlink_to(outside)
    (project / ".npu-wizard" / "conflicts.json").write_text('["d/f"]\n')

    result = update(project)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "d/f" not in result.stdout + result.stderr
    assert "already matches" in result.stdout
