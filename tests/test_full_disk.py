"""A full disk and a read-only project: `update`, `--into` and `run` say so in one line and leave nothing half written.

Real file systems: a 2 MiB tmpfs mounted by the test (filled with fallocate to a
chosen number of KiB left) and a read-only bind mount, each unmounted after.
Mounting needs root; elsewhere these tests are skipped.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.runs import free_port, node_env, run_dirs
from tests.test_update import edit_answers, files_of, update
from tests.wizard_forks import wizard
from wizard.answers.model import resolve
from wizard.render.render import render

DISK_BYTES = 2 << 20
RAW = {
    "project_name": "demo",
    "device": "cpu",
    "nodes": 1,
    "devices_per_node": 1,
    "launcher": "shell",
    "amp": "off",
    "training.script": "mine.py",
}
ANSWERS_FILE = """\
schema: 1
project_name: demo
device: cpu
devices_per_node: 1
launcher: shell
training:
  script: mine.py
"""
# Fills what is left of the disk after the run started: the runner's summary.json finds no room.
FILLING_SCRIPT = """\
try:
    with open("filler-of-the-script", "wb") as filler:
        while True:
            filler.write(bytes(65536))
            filler.flush()
except OSError:
    pass
"""


def mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, timeout=60)


def unmount(point: Path) -> None:
    subprocess.run(["umount", "-l", str(point)], check=True, capture_output=True, timeout=60)


def can_mount(tmp_path: Path) -> bool:
    """Whether this process may mount a tmpfs (root, and not refused by a container)."""
    if os.geteuid() != 0:
        return False
    point = tmp_path / "probe"
    point.mkdir()
    try:
        mount("-t", "tmpfs", "-o", "size=64k", "tmpfs", str(point))
    except (subprocess.CalledProcessError, FileNotFoundError):
        return False
    unmount(point)
    return True


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs of its own, unmounted after the test."""
    if not can_mount(tmp_path):
        pytest.skip("mounting a tmpfs needs root")
    point = tmp_path / "disk"
    point.mkdir()
    mount("-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(point))
    try:
        yield point
    finally:
        unmount(point)


def fill(disk: Path, leave_kib: int) -> Path:
    """Take all of `disk` but `leave_kib` KiB with one file; return it (remove it to free the disk)."""
    stats = os.statvfs(disk)
    filler = disk / "filler"
    with filler.open("wb") as file:
        os.posix_fallocate(file.fileno(), 0, stats.f_bavail * stats.f_frsize - leave_kib * 1024)
    return filler


def render_own(folder: Path, script: str = 'print("trained")\n') -> Path:
    """The one-rank CPU project that runs the user's `mine.py`, rendered into `folder`."""
    project = render(resolve({**RAW, "network.master_port": free_port()}), folder).project_dir
    (project / "mine.py").write_text(script)
    return project


def npu_wizard(*args: str) -> subprocess.CompletedProcess[str]:
    """The real command, a process of its own (tests/wizard_forks.py)."""
    return wizard(args, env=node_env(Path("/nonexistent-run-dir")), timeout=240)


def one_line(result: subprocess.CompletedProcess[str], code: int, *expected: str) -> None:
    """Exit `code` and one line on stderr holding each expected text; no traceback."""
    assert result.returncode == code, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr
    for text in expected:
        assert text in result.stderr, result.stderr


@pytest.mark.parametrize("leave_kib", [0, 16])
def test_update_on_a_full_disk_says_so_in_one_line_and_changes_nothing(disk: Path, leave_kib: int) -> None:
    project = render_own(disk)
    edit_answers(project, training__script_args=["--lr", "0.5"])
    before = files_of(project)
    filler = fill(disk, leave_kib)
    result = update(project)
    one_line(result, 1, "(No space left on device), so nothing was changed: free space on that disk")
    assert str(project) in result.stderr
    assert files_of(project) == before  # no lock, no staging, no file changed
    assert sorted(os.listdir(project / ".npu-wizard")) == ["pristine.json.gz"]
    filler.unlink()
    assert update(project).returncode == 0


@pytest.mark.parametrize("folder", [["--folder", "."], []], ids=["older-layout", "npu-folder"])
@pytest.mark.parametrize("leave_kib", [0, 16])
def test_render_into_a_full_disk_says_so_in_one_line_and_leaves_the_folder_as_it_was(
    disk: Path, leave_kib: int, folder: list[str]
) -> None:
    repository = disk / "repo"
    repository.mkdir()
    (repository / "mine.py").write_text('print("trained")\n')
    answers = disk.parent / "answers.yaml"
    answers.write_text(ANSWERS_FILE)
    fill(disk, leave_kib)
    result = npu_wizard("--answers", str(answers), "--into", str(repository), *folder)
    one_line(result, 1, "(No space left on device), so nothing was changed: free space on that disk")
    assert str(repository) in result.stderr
    assert os.listdir(repository) == ["mine.py"]


def test_run_on_a_full_disk_starts_nothing_and_says_so_in_one_line(disk: Path) -> None:
    project = render_own(disk)
    filler = fill(disk, 0)
    result = npu_wizard("run", str(project), "--plain")
    one_line(
        result,
        1,
        f"npu-wizard: cannot run {project}: cannot write {project}/.npu-wizard/run-node-0.lock (No space left on "
        "device), so nothing was started",
        "free space on that disk",
    )
    assert not (project / "runs").exists()
    assert sorted(os.listdir(project / ".npu-wizard")) == ["pristine.json.gz"]

    filler.unlink()
    fill(disk, 4)  # room for the lock's line, none for run.json
    result = npu_wizard("run", str(project), "--plain")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert "run.json (No space left on device), so nothing was started: free space on that disk" in result.stderr
    assert run_dirs(project) == [] and os.listdir(project / "runs") == []  # its run folder went again


def test_a_disk_that_fills_during_the_run_costs_the_summary_file_and_one_warning(disk: Path) -> None:
    project = render_own(disk, FILLING_SCRIPT)
    result = npu_wizard("run", str(project), "--plain")
    (run_dir,) = run_dirs(project)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "outcome: finished" in result.stdout  # the summary is still printed
    assert result.stderr == (
        f"npu-wizard: warning: cannot write {run_dir}/summary.json (No space left on device): free space on that "
        "disk (or raise your quota)\n"
    )


@pytest.fixture
def read_only_project(tmp_path: Path) -> Iterator[Path]:
    """A rendered project bound read-only onto itself, unmounted after the test."""
    if not can_mount(tmp_path):
        pytest.skip("a bind mount needs root")
    project = render_own(tmp_path / "projects")
    mount("--bind", str(project), str(project))
    try:
        mount("-o", "remount,bind,ro", str(project))
        yield project
    finally:
        unmount(project)


def test_run_of_a_read_only_project_says_so_in_one_line(read_only_project: Path) -> None:
    project = read_only_project
    result = npu_wizard("run", str(project), "--plain")
    one_line(
        result,
        1,
        f"npu-wizard: cannot run {project}: cannot write {project}/.npu-wizard/run-node-0.lock (Read-only file "
        "system), so nothing was started",
        "remount it read-write, or copy the folder to a writable disk",
    )
    edit = npu_wizard("update", str(project))
    one_line(edit, 1, "(Read-only file system), so nothing was changed", "remount it read-write")
