"""--force replaces a project without destroying what is alive, mounted or grown at run time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.factories import answers
from wizard.errors import TargetError
from wizard.render import render
from wizard.replace import mounts_inside

PROJECT = "demo"


def rendered(tmp_path: Path) -> Path:
    """A fresh project at tmp_path/out/demo."""
    return render(answers(), tmp_path / "out").project_dir


def grow(project: Path) -> None:
    """What a run leaves: a checkpoint and a run folder."""
    (project / "checkpoints").mkdir()
    (project / "checkpoints" / "step-8.pt").write_bytes(b"weights")
    (project / "runs" / "20260101-000000" / "logs").mkdir(parents=True)
    (project / "runs" / "20260101-000000" / "logs" / "node-0.log").write_text("trained\n")
    (project / "checkpoints.old-20260101-000000").mkdir()  # what run --fresh sets aside


def leftovers(output: Path) -> list[str]:
    """Staging or retired folders a render left beside the project."""
    return sorted(p.name for p in output.iterdir() if p.name != PROJECT)


def test_force_keeps_checkpoints_and_runs(tmp_path: Path) -> None:
    project = rendered(tmp_path)
    grow(project)
    (project / "train.py").write_text("edited")
    render(answers(), tmp_path / "out", force=True)
    assert (project / "checkpoints" / "step-8.pt").read_bytes() == b"weights"
    assert (project / "runs" / "20260101-000000" / "logs" / "node-0.log").read_text() == "trained\n"
    assert (project / "checkpoints.old-20260101-000000").is_dir()
    assert (project / "train.py").read_text() != "edited"
    assert leftovers(tmp_path / "out") == []


def test_force_clean_drops_them(tmp_path: Path) -> None:
    project = rendered(tmp_path)
    grow(project)
    render(answers(), tmp_path / "out", force=True, clean=True)
    assert not (project / "checkpoints").exists()
    assert not (project / "runs").exists()
    assert not (project / "checkpoints.old-20260101-000000").exists()
    assert leftovers(tmp_path / "out") == []


def test_a_symlinked_checkpoint_folder_moves_as_a_link_and_its_data_is_untouched(tmp_path: Path) -> None:
    project = rendered(tmp_path)
    disk = tmp_path / "disk"
    disk.mkdir()
    (disk / "step-8.pt").write_bytes(b"weights")
    (project / "checkpoints").symlink_to(disk)
    render(answers(), tmp_path / "out", force=True)
    assert (project / "checkpoints").is_symlink()
    render(answers(), tmp_path / "out", force=True, clean=True)
    assert not (project / "checkpoints").exists()
    assert (disk / "step-8.pt").read_bytes() == b"weights"


@pytest.fixture
def bind_mount(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """tmp_path/disk bound onto the project's checkpoints/ (as a checkpoint disk would be)."""
    project = rendered(tmp_path)
    disk, point = tmp_path / "disk", project / "checkpoints"
    disk.mkdir()
    (disk / "step-8.pt").write_bytes(b"weights")
    point.mkdir()
    mounted = subprocess.run(["mount", "--bind", str(disk), str(point)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"mount --bind is not permitted here: {mounted.stderr.decode().strip()}")
    try:
        yield project, point
    finally:
        # wherever a render may have moved it: never leave a mount behind
        for mount in reversed(mounts_inside(tmp_path)):
            subprocess.run(["umount", str(mount)], check=True)


@pytest.mark.parametrize("clean", [False, True])
def test_a_mount_point_inside_the_project_is_refused_and_left_alone(
    bind_mount: tuple[Path, Path], tmp_path: Path, clean: bool
) -> None:
    project, point = bind_mount
    with pytest.raises(TargetError, match=f"{point} is a mount point inside {project}"):
        render(answers(), tmp_path / "out", force=True, clean=clean)
    assert (point / "step-8.pt").read_bytes() == b"weights"
    assert leftovers(tmp_path / "out") == []


def test_the_cli_refuses_a_mount_point_with_exit_1(bind_mount: tuple[Path, Path], tmp_path: Path) -> None:
    _project, point = bind_mount
    answers_file = tmp_path / "a.yaml"
    answers_file.write_text("project_name: demo\ndevice: cpu\ndevices_per_node: 2\nlauncher: torchrun\namp: 'off'\n")
    result = subprocess.run(
        [sys.executable, "-m", "wizard", "--answers", str(answers_file), "-o", str(tmp_path / "out"), "--force"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert f"{point} is a mount point" in result.stderr and "Traceback" not in result.stderr
    assert (point / "step-8.pt").read_bytes() == b"weights"


def test_force_is_refused_while_a_runner_of_the_project_is_alive(tmp_path: Path) -> None:
    project = rendered(tmp_path)
    grow(project)
    # A process that is an npu-wizard runner for /proc (its command line names wizard).
    runner = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(120)", "wizard", "run"])
    try:
        run_json = project / "runs" / "20260101-000000" / "run.json"
        run_json.write_text(json.dumps({"project": str(project), "runner_pid": runner.pid}))
        with pytest.raises(TargetError) as refused:
            render(answers(), tmp_path / "out", force=True)
        assert f"runs/20260101-000000 by npu-wizard run, pid {runner.pid}" in str(refused.value)
        assert "stop it first" in str(refused.value)
        assert (project / "runs" / "20260101-000000" / "logs" / "node-0.log").exists()
    finally:
        runner.kill()
        runner.wait()
    render(answers(), tmp_path / "out", force=True)  # once it is gone, --force goes ahead
    assert leftovers(tmp_path / "out") == []


def test_a_stale_run_json_with_a_reused_pid_does_not_block(tmp_path: Path) -> None:
    project = rendered(tmp_path)
    grow(project)
    # The pid is alive but is not an npu-wizard process: the run.json is stale, its pid reused.
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (project / "runs" / "20260101-000000" / "run.json").write_text(json.dumps({"runner_pid": other.pid}))
        render(answers(), tmp_path / "out", force=True)
    finally:
        other.kill()
        other.wait()


def test_force_is_refused_while_a_launch_script_of_the_project_runs_without_a_runner(tmp_path: Path) -> None:
    project = rendered(tmp_path)
    run_dir = project / "runs" / "latest"
    run_dir.mkdir(parents=True)
    rank = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"], env={**os.environ, "NPU_WIZARD_RUN_DIR": str(run_dir)}
    )
    try:
        with pytest.raises(TargetError, match=rf"runs/latest: 1 process\(es\) of its job, pid {rank.pid}"):
            render(answers(), tmp_path / "out", force=True)
    finally:
        rank.kill()
        rank.wait()


def test_force_is_refused_while_npu_wizard_run_trains_the_project(tmp_path: Path) -> None:
    from tests.runs import clean_up, render_cpu, run_dirs, start_runner, started_pid, wait_for
    from wizard.answers import load_text

    project = render_cpu(tmp_path, "torchrun", epochs=50)
    runner = start_runner(project)
    try:
        run_dir = wait_for(lambda: (run_dirs(project) or [None])[-1], 120, "the run folder")
        wait_for(lambda: started_pid(run_dir, 0), 180, "rank 0 to train")
        again = load_text((project / "answers.yaml").read_text())
        with pytest.raises(TargetError, match=f"{run_dir.name} by npu-wizard run, pid {runner.pid}"):
            render(again, project.parent, force=True)
        assert runner.poll() is None and (run_dir / "run.json").is_file()
    finally:
        clean_up(project, runner)


def test_force_keeps_a_dataset_downloaded_into_the_data_folder_unless_clean(tmp_path: Path) -> None:
    mnist = answers(training__dataset="mnist", training__data_dir="datasets/mnist")
    project = render(mnist, tmp_path / "out").project_dir
    raw = project / "datasets" / "mnist" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    (raw / "train-images-idx3-ubyte").write_bytes(b"images")
    render(answers(training__dataset="mnist", training__data_dir="elsewhere"), tmp_path / "out", force=True)
    assert (raw / "train-images-idx3-ubyte").read_bytes() == b"images"  # the old answers' folder is kept too
    render(mnist, tmp_path / "out", force=True, clean=True)
    assert not (project / "datasets").exists()
    assert leftovers(tmp_path / "out") == []


@pytest.mark.parametrize("name", ["retired", "staging"])
def test_force_replaces_a_project_whatever_its_name(tmp_path: Path, name: str) -> None:
    # The old project was set aside as <staging>/retired: the new project "retired" itself.
    project = render(answers(project_name=name), tmp_path / "out").project_dir
    grow(project)
    for _ in range(2):
        (project / "train.py").write_text("edited")
        render(answers(project_name=name), tmp_path / "out", force=True)
        assert (project / "train.py").read_text() != "edited"
        assert (project / "checkpoints" / "step-8.pt").read_bytes() == b"weights"
        assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [name]
