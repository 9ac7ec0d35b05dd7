"""--force replaces a project without destroying what is alive, mounted or grown at run time."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.factories import answers, answers_yaml
from wizard.answers.model import Answers
from wizard.cli import main
from wizard.errors import TargetError
from wizard.render.journal import PAUSE_AT_ENV, PAUSE_FILE_ENV
from wizard.render.render import render
from wizard.render.replace import mounts_inside

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
    from tests.runs import clean_up, node_env, render_cpu, run_dirs, start_runner, started_pid, wait_for
    from wizard.answers.model import load_text

    # one rank: the runner and a training rank are all the refusal needs; a second rank, or a torchrun beside it
    # (the shell launcher starts the rank itself), only adds a torch process on both loaded cores. One thread, as
    # torchrun gives each of 2+ ranks a node (a lone rank takes a thread per core).
    project = render_cpu(tmp_path, "shell", devices_per_node=1, epochs=50)
    runner = start_runner(project, env=node_env(project / "runs" / "unused", OMP_NUM_THREADS="1"))
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


def mnist_at(data_dir: str) -> Answers:
    """Answers that read MNIST from `data_dir`."""
    return answers(training__dataset="mnist", training__data_dir=data_dir)


def download(folder: Path) -> Path:
    """What torchvision leaves in a data folder: a file of the dataset, returned."""
    raw = folder / "MNIST" / "raw"
    raw.mkdir(parents=True)
    (raw / "train-images-idx3-ubyte").write_bytes(b"images")
    return raw / "train-images-idx3-ubyte"


@pytest.mark.parametrize("where", ["absolute, inside the project", "under a folder the render makes", "./data"])
def test_force_keeps_the_data_folder_however_it_is_written(tmp_path: Path, where: str) -> None:
    project = tmp_path / "out" / PROJECT
    data_dir = {
        "absolute, inside the project": str(project / "datasets"),
        "under a folder the render makes": "launch/data",
        "./data": "./data",
    }[where]
    render(mnist_at(data_dir), tmp_path / "out")
    dataset = download(project / data_dir)
    for _ in range(2):
        render(mnist_at(data_dir), tmp_path / "out", force=True)
        assert dataset.read_bytes() == b"images"
    assert (project / "launch" / "run-node.sh").is_file() and leftovers(tmp_path / "out") == []


@pytest.mark.parametrize(
    ("data_dir", "why"),
    [
        (".", "is the project folder itself"),
        ("..", "holds the project folder"),
        ("launch", "is launch in .*, which the render makes"),
    ],
)
@pytest.mark.parametrize("clean", [False, True])
def test_force_and_clean_are_refused_for_a_data_folder_that_is_the_project_holds_it_or_is_made_by_it(
    tmp_path: Path, data_dir: str, why: str, clean: bool
) -> None:
    project = render(mnist_at(data_dir), tmp_path / "out").project_dir
    dataset = download(project / data_dir)
    with pytest.raises(TargetError, match=f"training.data_dir '{re.escape(data_dir)}' \\(the new answers\\) {why}"):
        render(mnist_at(data_dir), tmp_path / "out", force=True, clean=clean)
    assert dataset.read_bytes() == b"images" and (project / "train.py").is_file()
    assert [p.name for p in (tmp_path / "out").iterdir() if p.name.startswith(".")] == []


ANSWERS = "project_name: demo\ndevice: cpu\ndevices_per_node: 2\nlauncher: torchrun\namp: 'off'\n"
SET_ASIDE = 5  # old checkpoint folders to carry over: the signal comes after the first, with the rest to go


def cli(tmp_path: Path, *options: str) -> list[str]:
    """The command line of `npu-wizard --answers A -o tmp_path/out OPTIONS`."""
    (tmp_path / "a.yaml").write_text(ANSWERS)
    return [
        sys.executable,
        "-m",
        "wizard",
        "--answers",
        str(tmp_path / "a.yaml"),
        "-o",
        str(tmp_path / "out"),
        *options,
    ]


def set_aside_in(project: Path) -> int:
    """How many checkpoints.old-* folders `project` holds."""
    try:
        return sum(1 for entry in os.scandir(project) if entry.name.startswith("checkpoints.old-"))
    except FileNotFoundError:
        return 0


def force_interrupted_while_carrying(tmp_path: Path, signum: int) -> tuple[Path, int, str]:
    """`--force` on a project with SET_ASIDE old checkpoint folders, sent `signum` while it moves them over.

    The render stops at its test hook once the first folder is in the new project, and is sent the signal there:
    checked to hold some of the folders then, not all.
    """
    assert subprocess.run(cli(tmp_path), capture_output=True, timeout=120).returncode == 0
    project = tmp_path / "out" / PROJECT
    for number in range(SET_ASIDE):
        (project / f"checkpoints.old-{number:05d}").mkdir()
    (project / "train.py").write_text("edited")
    paused = tmp_path / "paused"
    env = {**os.environ, PAUSE_AT_ENV: "after-first-carry", PAUSE_FILE_ENV: str(paused)}
    render_process = subprocess.Popen(cli(tmp_path, "--force"), stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120  # a safety net: the render stops there at once on a quiet machine
    while not paused.exists() and render_process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert paused.exists() and render_process.poll() is None, render_process.communicate(timeout=120)
    assert 0 < set_aside_in(project) < SET_ASIDE  # some carried over into the new project, not all
    os.kill(render_process.pid, signum)
    _, stderr = render_process.communicate(timeout=120)
    return project, render_process.returncode, stderr


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_or_sigterm_during_force_puts_the_old_project_back(tmp_path: Path, signum: int, code: int) -> None:
    project, returncode, stderr = force_interrupted_while_carrying(tmp_path, signum)
    assert (returncode, stderr) == (code, "npu-wizard: interrupted\n")
    assert set_aside_in(project) == SET_ASIDE and (project / "train.py").read_text() == "edited"
    assert leftovers(project.parent) == []


def test_the_render_after_a_killed_force_says_where_the_rest_of_the_old_project_is(tmp_path: Path) -> None:
    project, returncode, _ = force_interrupted_while_carrying(tmp_path, signal.SIGKILL)
    assert returncode == -signal.SIGKILL
    [staging] = [project.parent / name for name in leftovers(project.parent)]
    again = subprocess.run(cli(project.parent.parent, "--force"), capture_output=True, text=True, timeout=120)
    assert again.returncode == 0
    assert f"warning: {staging} holds the project an interrupted --force replaced" in again.stderr
    assert "checkpoints.old-" in again.stderr and f"rm -r {staging}\n" in again.stderr
    # Nothing lost: what was not carried over yet is in the staging folder the warning names.
    assert set_aside_in(project) + set_aside_in(staging / ".replaced") == SET_ASIDE


def test_the_render_after_a_force_killed_between_its_two_renames_puts_the_old_project_back(tmp_path: Path) -> None:
    # The state a SIGKILL leaves between setting the old project aside and moving the new one in.
    project = rendered(tmp_path)
    grow(project)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    staging = tmp_path / "out" / f".{PROJECT}.staging-{dead.pid}-x1y2z3"
    staging.mkdir()
    project.rename(staging / ".replaced")
    render(answers(), staging)  # the new render, not yet moved in
    result = render(answers(), tmp_path / "out", force=True)
    assert f"restored {project} from {staging}, where an interrupted --force had set it aside" in [
        str(warning) for warning in result.warnings
    ]
    assert (project / "checkpoints" / "step-8.pt").read_bytes() == b"weights"
    assert leftovers(tmp_path / "out") == []


def test_the_render_after_a_render_killed_while_it_wrote_names_its_staging_folder(tmp_path: Path) -> None:
    project = rendered(tmp_path)
    staging = tmp_path / "out" / f".{PROJECT}.staging-4194305-a1b2c3"  # above any pid Linux hands out
    render(answers(), staging)  # half a render, as a SIGKILL leaves it
    result = render(answers(), tmp_path / "out", force=True)
    assert [str(warning) for warning in result.warnings] == [
        f"{staging} is left from a render that was interrupted (1 entry: demo/): look inside, then delete it: "
        f"rm -r {staging}"
    ]
    assert project.is_dir() and staging.is_dir()


# A project whose answers run the user's own script: their code lives in the project folder beside npu-wizard's.
OWN_CODE = {
    "src/main.py": "from src.model import MODEL\n",
    "src/model.py": "MODEL = 'mine'\n",
    "configs/base.yaml": "lr: 0.1\n",
    ".git/HEAD": "ref: refs/heads/main\n",
    "notes.md": "my notes\n",
    "launch/mine.sh": "echo my own helper\n",  # in a folder npu-wizard makes
}


def own_script_answers(tmp_path: Path, script: str, name: str = "a.yaml", **training: str) -> Path:
    """An answers file of project demo whose ranks run the user's `script`."""
    path = tmp_path / name
    document = {
        "project_name": PROJECT,
        "device": "cpu",
        "devices_per_node": 2,
        "launcher": "torchrun",
        "amp": "off",
        "training": {"script": script, **training},
    }
    path.write_text(answers_yaml(document))
    return path


def wizard(*args: str | Path) -> int:
    """npu-wizard's command line, in this process."""
    return main([str(arg) for arg in args])


def add(project: Path, files: dict[str, str]) -> None:
    """Write the user's `files` into `project`."""
    for name, text in files.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)


def tree(root: Path) -> dict[str, str]:
    """Every file and link under `root`: its text, or where it links."""
    found = {}
    for folder, _dirs, files in os.walk(root):
        for name in files:
            path = Path(folder) / name
            key = path.relative_to(root).as_posix()
            found[key] = f"-> {os.readlink(path)}" if path.is_symlink() else path.read_bytes().hex()
    return found


@pytest.mark.parametrize("clean", [False, True])
def test_force_keeps_every_file_of_the_users_beside_their_script(tmp_path: Path, clean: bool) -> None:
    answers_file = own_script_answers(tmp_path, "src/main.py")
    assert wizard("--answers", answers_file, "-o", tmp_path / "out") == 0
    project = tmp_path / "out" / PROJECT
    add(project, OWN_CODE)
    grow(project)
    (project / "launch" / "run-node.sh").write_text("edited")
    assert wizard("--answers", answers_file, "-o", tmp_path / "out", "--force", *(["--clean"] if clean else [])) == 0
    assert {name: (project / name).read_text() for name in OWN_CODE} == OWN_CODE
    assert (project / "launch" / "run-node.sh").read_text() != "edited"  # npu-wizard's own file: replaced
    assert (project / "checkpoints").exists() is not clean and (project / "runs").exists() is not clean
    assert leftovers(tmp_path / "out") == []


def test_force_keeps_the_files_beside_a_top_level_script(tmp_path: Path) -> None:
    answers_file = own_script_answers(tmp_path, "main.py")
    assert wizard("--answers", answers_file, "-o", tmp_path / "out") == 0
    project = tmp_path / "out" / PROJECT
    add(project, {"main.py": "import model\n", "model.py": "MODEL = 'mine'\n"})
    for clean in ([], ["--clean"]):
        assert wizard("--answers", answers_file, "-o", tmp_path / "out", "--force", *clean) == 0
        assert (project / "model.py").read_text() == "MODEL = 'mine'\n"
        assert (project / "main.py").read_text() == "import model\n"


def test_force_with_another_script_keeps_the_folder_of_the_old_one(tmp_path: Path) -> None:
    assert wizard("--answers", own_script_answers(tmp_path, "src/main.py"), "-o", tmp_path / "out") == 0
    project = tmp_path / "out" / PROJECT
    add(project, {**OWN_CODE, "app/main.py": "print('the new one')\n"})
    moved = own_script_answers(tmp_path, "app/main.py", "b.yaml")
    assert wizard("--answers", moved, "-o", tmp_path / "out", "--force", "--clean") == 0
    assert {name: (project / name).read_text() for name in OWN_CODE} == OWN_CODE
    assert (project / "app" / "main.py").read_text() == "print('the new one')\n"


def test_force_refuses_a_file_of_the_users_where_the_new_render_writes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert wizard("--answers", own_script_answers(tmp_path, "main.py"), "-o", tmp_path / "out") == 0
    project = tmp_path / "out" / PROJECT
    add(project, {"main.py": "print('mine')\n", "train.py": "print('my own train.py')\n"})
    before = tree(project)
    capsys.readouterr()
    generated_script = own_script_answers(tmp_path, "", "b.yaml")  # no script of the user's: the generated one
    assert wizard("--answers", generated_script, "-o", tmp_path / "out", "--force") == 1
    line = capsys.readouterr().err.splitlines()[-1]
    assert "holds 1 path(s) of yours that the new render writes: train.py;" in line
    assert "to run your own train.py instead of the generated one, set `training.script: train.py`" in line
    assert tree(project) == before and leftovers(tmp_path / "out") == []
    yours = own_script_answers(tmp_path, "train.py", "c.yaml")
    assert wizard("--answers", yours, "-o", tmp_path / "out", "--force") == 0
    assert (project / "train.py").read_text() == "print('my own train.py')\n"


def test_force_without_a_record_of_the_generated_files_names_the_users_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    answers_file = own_script_answers(tmp_path, "src/main.py")
    assert wizard("--answers", answers_file, "-o", tmp_path / "out") == 0
    project = tmp_path / "out" / PROJECT
    (project / ".npu-wizard" / "pristine.json.gz").unlink()  # as an older npu-wizard left it
    add(project, OWN_CODE)
    grow(project)
    before = tree(project)
    capsys.readouterr()
    for clean in ([], ["--clean"], ["--dry-run"]):
        assert wizard("--answers", answers_file, "-o", tmp_path / "out", "--force", *clean) == 1
        line = capsys.readouterr().err.splitlines()[-1]
        assert "has no record of the files npu-wizard generated there" in line
        assert "holds 5 path(s) a render would not make: .git, configs, launch/mine.sh, notes.md, ..." in line
        assert f"npu-wizard update {project} --rebase" in line
        assert tree(project) == before
    for name in (".git", "configs", "src"):  # with only its run-time folders besides npu-wizard's it is replaced
        shutil.rmtree(project / name)
    (project / "notes.md").unlink()
    (project / "launch" / "mine.sh").unlink()
    assert wizard("--answers", answers_file, "-o", tmp_path / "out", "--force") == 0
    assert (project / "checkpoints" / "step-8.pt").read_bytes() == b"weights"


def test_force_dry_run_lists_what_is_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    answers_file = own_script_answers(tmp_path, "src/main.py")
    assert wizard("--answers", answers_file, "-o", tmp_path / "out") == 0
    project = tmp_path / "out" / PROJECT
    add(project, OWN_CODE)
    grow(project)
    before = tree(project)
    capsys.readouterr()
    assert wizard("--answers", answers_file, "-o", tmp_path / "out", "--force", "--dry-run") == 0
    kept = capsys.readouterr().out.split("would keep 8 paths of the old project:\n", 1)[1].splitlines()
    assert kept == [
        "  .git",
        "  checkpoints",
        "  checkpoints.old-20260101-000000",
        "  configs",
        "  launch/mine.sh",
        "  notes.md",
        "  runs",
        "  src",
    ]
    assert wizard("--answers", answers_file, "-o", tmp_path / "out", "--force", "--clean", "--dry-run") == 0
    kept = capsys.readouterr().out.split("would keep 5 paths of the old project:\n", 1)[1].splitlines()
    assert kept == ["  .git", "  configs", "  launch/mine.sh", "  notes.md", "  src"]
    assert tree(project) == before


def test_clean_refuses_to_delete_a_data_folder_that_holds_the_script(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The project read MNIST from src/; the new answers run the user's script, which they put there.
    assert render(mnist_at("src"), tmp_path / "out").project_dir == tmp_path / "out" / PROJECT
    project = tmp_path / "out" / PROJECT
    download(project / "src")
    add(project, OWN_CODE)
    before = tree(project)
    answers_file = own_script_answers(tmp_path, "src/main.py")
    assert wizard("--answers", answers_file, "-o", tmp_path / "out", "--force", "--clean") == 1
    line = capsys.readouterr().err.splitlines()[-1]
    assert "training.script src/main.py lies in src, the data folder --clean deletes" in line
    assert tree(project) == before
    assert wizard("--answers", answers_file, "-o", tmp_path / "out", "--force") == 0
    assert {name: (project / name).read_text() for name in OWN_CODE} == OWN_CODE


def test_force_on_a_folder_that_is_no_project_names_its_files_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "out" / PROJECT
    add(folder, {"thesis.tex": "my thesis\n", "figures/loss.png": "png\n"})
    before = tree(folder)
    answers_file = own_script_answers(tmp_path, "train.py")
    assert wizard("--answers", answers_file, "-o", tmp_path / "out", "--force") == 1
    line = capsys.readouterr().err.splitlines()[-1]
    assert "is not an npu-wizard project (no answers.yaml) and holds 2 path(s) a render would not make" in line
    assert "figures, thesis.tex" in line
    assert tree(folder) == before and leftovers(tmp_path / "out") == []


def test_force_moves_only_the_users_files_out_of_a_folder_npu_wizard_no_longer_makes(tmp_path: Path) -> None:
    project = render(answers(cluster__engine="slurm"), tmp_path / "out").project_dir
    add(project, {"slurm/my-partition.txt": "npu\n"})
    render(answers(), tmp_path / "out", force=True)
    assert sorted(os.listdir(project / "slurm")) == ["my-partition.txt"]  # job.sbatch was npu-wizard's


def test_clean_drops_the_data_folder_but_not_the_users_file_beside_it(tmp_path: Path) -> None:
    project = render(mnist_at("datasets/mnist"), tmp_path / "out").project_dir
    download(project / "datasets" / "mnist")
    add(project, {"datasets/README.md": "where the data comes from\n"})
    render(mnist_at("datasets/mnist"), tmp_path / "out", force=True, clean=True)
    assert sorted(os.listdir(project / "datasets")) == ["README.md"]


def test_force_keeps_a_file_npu_wizard_no_longer_makes_when_it_was_edited(tmp_path: Path) -> None:
    project = render(answers(nodes=2, network__host_ips=["127.0.0.1"] * 2), tmp_path / "out").project_dir
    (project / "train.py").write_text("my model, grown from the generated script\n")
    assert wizard("--answers", own_script_answers(tmp_path, "main.py"), "-o", tmp_path / "out", "--force") == 0
    assert (project / "train.py").read_text() == "my model, grown from the generated script\n"
    assert not (project / "launch" / "node1.sh").exists()  # unedited and no longer made: npu-wizard's to drop


def test_force_keeps_a_fifo_where_npu_wizard_wrote_a_file_it_no_longer_makes_and_never_reads_it(
    tmp_path: Path,
) -> None:
    project = render(answers(nodes=2, network__host_ips=["127.0.0.1"] * 2), tmp_path / "out").project_dir
    (project / "train.py").unlink()
    os.mkfifo(project / "train.py")  # reading it would wait for a writer forever
    command = [sys.executable, "-m", "wizard", "--answers", str(own_script_answers(tmp_path, "main.py"))]
    result = subprocess.run(
        [*command, "-o", str(tmp_path / "out"), "--force"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (project / "train.py").is_fifo()  # not npu-wizard's as it wrote it: the user's, kept
    assert "kept 1 paths of the old project: train.py" in result.stdout
