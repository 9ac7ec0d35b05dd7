"""`npu-wizard --answers A --into DIR`: npu-wizard's files added to the user's own git repository, never over theirs."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.factories import answers_yaml
from tests.runs import free_port, node_env
from tests.wizard_forks import wizard
from wizard.render.journal import PAUSE_AT_ENV, PAUSE_FILE_ENV
from wizard.render.pristine import PRISTINE, load

# A repository as a user brings it: their own training script, package, data, README and requirements.
USER_FILES = {
    "README.md": "# my model\n\nTrain with python mytrain.py.\n",
    "requirements.txt": "torch\nnumpy\n",
    "mytrain.py": "import torch\n\nprint('my own training loop')\n",
    "src/model.py": "import torch.nn as nn\n\nMODEL = nn.Linear(4, 2)\n",
    "data/train.bin": "\x00\x01\x02 some bytes\n",
}


def npu_wizard(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The real command, a process of its own (tests/wizard_forks.py)."""
    return wizard(args, cwd=cwd, timeout=300)


def git(repo: Path, *args: str) -> str:
    """A git command in `repo`; its stdout."""
    author = ["-c", "user.name=Test", "-c", "user.email=test@example.com", "-c", "commit.gpgsign=false"]
    result = subprocess.run(["git", *author, *args], cwd=repo, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def user_repo(root: Path, files: dict[str, str]) -> Path:
    """A git repository holding `files`, all committed."""
    repo = root / "repo"
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo.parent, "init", "-q", "-b", "main", str(repo))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "my project")
    return repo


# What each cluster engine adds besides the node scripts: its folder and the files in it.
ENGINE_FILES = {
    "slurm": {"slurm/job.sbatch"},
    "pytorchjob": {"k8s/pytorchjob.yaml", "k8s/project.yaml"},
}
ENGINE_ANSWERS: dict[str, dict[str, str]] = {
    "slurm": {"engine": "slurm", "time": "00:20:00"},
    "pytorchjob": {"engine": "pytorchjob", "image": "registry.example.com/train:cpu"},
}


def answers_file(root: Path, nodes: int = 2, engine: str = "manual", **training: Any) -> Path:
    """A CPU project's answers: `nodes` x 1 process, simulated nodes on loopback for the manual engine."""
    path = root / "answers.yaml"
    document: dict[str, Any] = {
        "project_name": "ddp-mine",
        "device": "cpu",
        "nodes": nodes,
        "devices_per_node": 1,
        "launcher": "torchrun",
        "amp": "off",
        "network": {"host_ips": ["127.0.0.1"] * nodes, "master_port": free_port()},
        "training": {"samples": 64, "batch_size": 16, "epochs": 1, "log_every": 2, **training},
    }
    if engine != "manual":
        document["network"] = {"master_port": document["network"]["master_port"]}
        document["cluster"] = ENGINE_ANSWERS[engine]
    path.write_text(answers_yaml(document))
    return path


def tree_hash(root: Path, *, lock_taken: bool = False, mtimes: bool = True) -> str:
    """Every entry under `root` (.git included): its path, type, mode, content, and each folder's mtime.

    `lock_taken`: but the mtime of .npu-wizard/, where update takes and drops its lock file; `mtimes`: no
    folder's mtime (a folder made and removed again changes its parent's).
    """
    digest = hashlib.sha256()
    for folder, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        info = os.lstat(folder)
        skip = not mtimes or (lock_taken and Path(folder) == root / ".npu-wizard")
        mtime = "-" if skip else info.st_mtime_ns
        digest.update(f"{folder} {info.st_mode:o} {mtime}\n".encode())
        for name in sorted(files):
            path = Path(folder) / name
            info = os.lstat(path)
            content = os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
            digest.update(f"{path} {info.st_mode:o} {hashlib.sha256(content).hexdigest()}\n".encode())
    return digest.hexdigest()


def wait_for(condition: Callable[[], bool], timeout: float = 120) -> None:
    """Poll `condition` until it holds; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def contents(repo: Path, names: list[str]) -> dict[str, bytes]:
    """The bytes of the named files of `repo`."""
    return {name: (repo / name).read_bytes() for name in names}


def new_files(repo: Path) -> list[str]:
    """What `git status` shows as new (untracked) in `repo`, file by file; fails on any other change."""
    lines = git(repo, "status", "--porcelain", "--untracked-files=all").splitlines()
    changed = [line for line in lines if not line.startswith("?? ")]
    assert not changed, f"git shows changes to tracked files: {changed}"
    return sorted(line[3:] for line in lines)


def generated(repo: Path) -> set[str]:
    """The files npu-wizard generated in `repo`, as its pristine copy names them, and its own state."""
    return {*load(repo).files, PRISTINE, ".npu-wizard/into", ".npu-wizard/repository"}


def test_a_folder_with_the_users_launch_and_readme_is_refused_naming_each_clash(tmp_path: Path) -> None:
    repo = user_repo(
        tmp_path,
        {**USER_FILES, "launch/run-node.sh": "#!/bin/sh\npython mytrain.py\n", "launch/node0.sh": "mine\n"},
    )
    answers = answers_file(tmp_path)
    before = tree_hash(repo)
    result = npu_wizard("--answers", str(answers), "--into", str(repo), "--folder", ".")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "already has 2 path(s) npu-wizard would write" in result.stderr
    assert "\n  launch/node0.sh\n  launch/run-node.sh\n" in result.stderr
    assert "README.md" not in result.stderr  # npu-wizard's README goes in as NPU-WIZARD.md
    assert "nothing was written" in result.stderr
    assert tree_hash(repo) == before


def test_a_users_train_py_clashes_with_the_generated_script(tmp_path: Path) -> None:
    repo = user_repo(tmp_path, {**USER_FILES, "train.py": "print('mine')\n"})
    before = tree_hash(repo)
    result = npu_wizard("--answers", str(answers_file(tmp_path)), "--into", str(repo), "--folder", ".")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "already has 1 path(s)" in result.stderr
    assert "\n  train.py\n" in result.stderr
    assert result.stderr.splitlines()[-1] == (
        "to run your own train.py instead of the generated one, set `training.script: train.py` in the answers "
        "(npu-wizard then generates no train.py)"
    )
    assert tree_hash(repo) == before


def test_a_users_train_py_renamed_as_the_refusal_says_is_the_script_that_runs(tmp_path: Path) -> None:
    repo = user_repo(tmp_path, {**USER_FILES, "train.py": "print('mine')\n"})
    git(repo, "mv", "train.py", "my_train.py")
    result = npu_wizard(
        "--answers", str(answers_file(tmp_path, script="my_train.py")), "--into", str(repo), "--folder", "."
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (repo / "my_train.py").read_text() == "print('mine')\n" and not (repo / "train.py").exists()
    assert "my_train.py" in (repo / "launch" / "run-node.sh").read_text()


def test_a_users_train_py_named_as_the_refusal_says_is_the_script_that_runs(tmp_path: Path) -> None:
    repo = user_repo(tmp_path, {**USER_FILES, "train.py": "print('mine')\n"})
    result = npu_wizard(
        "--answers", str(answers_file(tmp_path, script="train.py")), "--into", str(repo), "--folder", "."
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (repo / "train.py").read_text() == "print('mine')\n"
    assert "-m runtime.userscript train.py" in (repo / "launch" / "run-node.sh").read_text()
    assert "train.py" not in load(repo).files


def test_into_a_clean_repository_adds_only_npu_wizards_files(tmp_path: Path) -> None:
    repo = user_repo(tmp_path, USER_FILES)
    result = npu_wizard("--answers", str(answers_file(tmp_path)), "--into", str(repo), "--folder", ".")
    assert result.returncode == 0, result.stderr
    assert f"next: read {repo / 'NPU-WIZARD.md'}" in result.stdout
    assert contents(repo, list(USER_FILES)) == {name: text.encode() for name, text in USER_FILES.items()}
    added = new_files(repo)
    assert set(added) == generated(repo)
    expected = {"NPU-WIZARD.md", "requirements-npu-wizard.txt", "answers.yaml", "train.py", "launch/run-node.sh"}
    assert expected <= set(added)
    assert {"launch/node0.sh", "launch/node1.sh", "runtime/events.py", "sysctl/reserve-ports.sh"} <= set(added)
    assert not any(name.startswith("ddp-mine") for name in os.listdir(repo))  # straight into the folder
    assert "`requirements-npu-wizard.txt`" in (repo / "NPU-WIZARD.md").read_text()
    assert os.access(repo / "launch" / "node0.sh", os.X_OK)
    assert yaml.safe_load((repo / "answers.yaml").read_text())["project_name"] == "ddp-mine"


@pytest.mark.parametrize("engine", sorted(ENGINE_FILES))
def test_into_a_clean_repository_with_a_cluster_engine_adds_its_folder_and_only_npu_wizards_files(
    tmp_path: Path, engine: str
) -> None:
    repo = user_repo(tmp_path, USER_FILES)
    result = npu_wizard("--answers", str(answers_file(tmp_path, engine=engine)), "--into", str(repo), "--folder", ".")
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr, result.stderr
    assert contents(repo, list(USER_FILES)) == {name: text.encode() for name, text in USER_FILES.items()}
    added = new_files(repo)
    assert set(added) == generated(repo)
    assert {name for name in added if name.startswith(("slurm/", "k8s/"))} == ENGINE_FILES[engine]
    assert {"NPU-WIZARD.md", "launch/entry.sh", "launch/run-node.sh", "train.py", "runtime/events.py"} <= set(added)


@pytest.mark.parametrize(("engine", "theirs"), [("slurm", "slurm/job.sbatch"), ("pytorchjob", "k8s/pytorchjob.yaml")])
def test_a_users_own_cluster_file_where_npu_wizard_writes_its_own_is_refused_naming_it(
    tmp_path: Path, engine: str, theirs: str
) -> None:
    folder = theirs.split("/")[0]
    repo = user_repo(tmp_path, {**USER_FILES, theirs: "my own job\n", f"{folder}/notes.txt": "no clash\n"})
    before = tree_hash(repo)
    result = npu_wizard("--answers", str(answers_file(tmp_path, engine=engine)), "--into", str(repo), "--folder", ".")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "already has 1 path(s) npu-wizard would write" in result.stderr
    assert f"\n  {theirs}\n" in result.stderr and "nothing was written" in result.stderr
    assert tree_hash(repo) == before


def test_a_second_render_into_the_folder_is_refused_pointing_at_update_and_force(tmp_path: Path) -> None:
    repo = user_repo(tmp_path, USER_FILES)
    answers = answers_file(tmp_path)
    assert npu_wizard("--answers", str(answers), "--into", str(repo), "--folder", ".").returncode == 0
    before = tree_hash(repo)
    result = npu_wizard("--answers", str(answers), "--into", str(repo), "--folder", ".")
    assert result.returncode == 1
    assert f"npu-wizard update {repo}" in result.stderr and "--force" in result.stderr
    assert tree_hash(repo) == before


def test_update_with_changed_answers_changes_npu_wizards_files_only(tmp_path: Path) -> None:
    repo = user_repo(tmp_path, USER_FILES)
    assert (
        npu_wizard("--answers", str(answers_file(tmp_path, nodes=2)), "--into", str(repo), "--folder", ".").returncode
        == 0
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "npu-wizard's files")
    (repo / "launch" / "mine.sh").write_text("echo my own helper\n")  # the user's file in npu-wizard's folder
    (repo / "answers.yaml").write_text(answers_file(tmp_path, nodes=3).read_text())
    result = npu_wizard("update", str(repo))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "added    launch/node2.sh" in result.stdout
    assert contents(repo, list(USER_FILES)) == {name: text.encode() for name, text in USER_FILES.items()}
    assert (repo / "launch" / "mine.sh").read_text() == "echo my own helper\n"
    lines = git(repo, "status", "--porcelain", "--untracked-files=all").splitlines()
    touched = {line[3:] for line in lines} - {"launch/mine.sh"}
    assert "launch/node2.sh" in touched and "NPU-WIZARD.md" in touched
    assert touched <= generated(repo)


def test_update_merges_a_user_edit_to_the_launch_script(tmp_path: Path) -> None:
    repo = user_repo(tmp_path, USER_FILES)
    assert npu_wizard("--answers", str(answers_file(tmp_path)), "--into", str(repo), "--folder", ".").returncode == 0
    script = repo / "launch" / "run-node.sh"
    mine = script.read_text().replace("\nset -", "\n# my own note on this script\nset -", 1)
    assert "# my own note" in mine
    script.write_text(mine)
    answers = yaml.safe_load((repo / "answers.yaml").read_text())
    answers["network"]["master_port"] += 2
    (repo / "answers.yaml").write_text(yaml.safe_dump(answers, sort_keys=False))
    result = npu_wizard("update", str(repo))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "merged   launch/run-node.sh (your edits kept)" in result.stdout
    text = script.read_text()
    assert "# my own note on this script" in text
    assert f'MASTER_PORT="${{MASTER_PORT:-{answers["network"]["master_port"]}}}"' in text
    assert contents(repo, list(USER_FILES)) == {name: text.encode() for name, text in USER_FILES.items()}


def test_update_refuses_a_new_file_that_lands_on_a_users_file(tmp_path: Path) -> None:
    repo = user_repo(tmp_path, USER_FILES)
    assert (
        npu_wizard("--answers", str(answers_file(tmp_path, nodes=2)), "--into", str(repo), "--folder", ".").returncode
        == 0
    )
    (repo / "launch" / "node2.sh").write_text("my own node 2\n")
    (repo / "answers.yaml").write_text(answers_file(tmp_path, nodes=3).read_text())
    before = tree_hash(repo, lock_taken=True)
    result = npu_wizard("update", str(repo))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "\n  launch/node2.sh\n" in result.stderr
    assert tree_hash(repo, lock_taken=True) == before


def test_force_replaces_npu_wizards_files_and_keeps_the_users(tmp_path: Path) -> None:
    repo = user_repo(tmp_path, USER_FILES)
    assert (
        npu_wizard("--answers", str(answers_file(tmp_path, nodes=3)), "--into", str(repo), "--folder", ".").returncode
        == 0
    )
    (repo / "launch" / "mine.sh").write_text("echo my own helper\n")
    (repo / "launch" / "run-node.sh").write_text("# edited away\n")
    (repo / "runs").mkdir()
    (repo / "runs" / "kept.txt").write_text("a run of mine\n")
    result = npu_wizard(
        "--answers", str(answers_file(tmp_path, nodes=2)), "--into", str(repo), "--folder", ".", "--force"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "replaced npu-wizard's files in" in result.stdout
    assert contents(repo, list(USER_FILES)) == {name: text.encode() for name, text in USER_FILES.items()}
    assert (repo / "launch" / "mine.sh").read_text() == "echo my own helper\n"
    assert (repo / "runs" / "kept.txt").read_text() == "a run of mine\n"
    assert not (repo / "launch" / "node2.sh").exists()  # npu-wizard's own, no longer generated
    assert (repo / "launch" / "run-node.sh").read_text() == load(repo).files["launch/run-node.sh"]
    assert set(new_files(repo)) == generated(repo) | {"launch/mine.sh", "runs/kept.txt"}


def test_force_keeps_the_users_edits_to_files_npu_wizard_no_longer_makes(tmp_path: Path) -> None:
    repo = user_repo(tmp_path, USER_FILES)
    assert (
        npu_wizard("--answers", str(answers_file(tmp_path, nodes=4)), "--into", str(repo), "--folder", ".").returncode
        == 0
    )
    with (repo / "train.py").open("a") as script:
        script.write("# my change\n")
    (repo / "launch" / "node2.sh").write_text("my own node 2\n")
    (repo / "my_train.py").write_text("print('my own loop')\n")
    edited = contents(repo, ["train.py", "launch/node2.sh"])
    again = answers_file(tmp_path, nodes=2, script="my_train.py")
    dry = npu_wizard("--answers", str(again), "--into", str(repo), "--folder", ".", "--force", "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    listed = dry.stdout.split("would keep 2 of your edited files npu-wizard no longer makes:\n", 1)[1]
    assert listed.splitlines()[:2] == ["  launch/node2.sh", "  train.py"]
    result = npu_wizard("--answers", str(again), "--into", str(repo), "--folder", ".", "--force")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "kept 2 of your edited files npu-wizard no longer makes: launch/node2.sh, train.py" in result.stdout
    assert contents(repo, list(edited)) == edited
    assert not (repo / "launch" / "node3.sh").exists()  # npu-wizard's as it wrote it, no longer generated
    assert contents(repo, list(USER_FILES)) == {name: text.encode() for name, text in USER_FILES.items()}
    assert set(new_files(repo)) == generated(repo) | {"train.py", "launch/node2.sh", "my_train.py"}


def test_force_never_overwrites_a_users_file_either(tmp_path: Path) -> None:
    repo = user_repo(tmp_path, USER_FILES)
    assert (
        npu_wizard("--answers", str(answers_file(tmp_path, nodes=2)), "--into", str(repo), "--folder", ".").returncode
        == 0
    )
    (repo / "launch" / "node2.sh").write_text("my own node 2\n")
    before = tree_hash(repo)
    result = npu_wizard(
        "--answers", str(answers_file(tmp_path, nodes=3)), "--into", str(repo), "--folder", ".", "--force"
    )
    assert result.returncode == 1
    assert "\n  launch/node2.sh\n" in result.stderr
    assert tree_hash(repo) == before


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["-o", "elsewhere"], "not allowed with argument"),
        (["--force", "--clean"], "--clean does not go with --into"),
    ],
)
def test_unclear_mixes_with_into_are_refused_in_one_line(tmp_path: Path, extra: list[str], message: str) -> None:
    repo = user_repo(tmp_path, USER_FILES)
    before = tree_hash(repo)
    result = npu_wizard("--answers", str(answers_file(tmp_path)), "--into", str(repo), "--folder", ".", *extra)
    assert result.returncode == 2
    assert message in result.stderr.splitlines()[-1]
    assert tree_hash(repo) == before


def test_into_without_answers_is_refused() -> None:
    result = npu_wizard("--into", ".")
    assert result.returncode == 2
    assert "--into needs --answers FILE" in result.stderr


def test_into_a_missing_folder_or_a_file_is_refused(tmp_path: Path) -> None:
    answers = str(answers_file(tmp_path))
    missing = npu_wizard("--answers", answers, "--into", str(tmp_path / "nowhere"))
    assert missing.returncode == 1
    assert "does not exist; --into adds npu-wizard's files to a folder you have" in missing.stderr
    assert not (tmp_path / "nowhere").exists()
    (tmp_path / "plain").write_text("a file\n")
    plain = npu_wizard("--answers", answers, "--into", str(tmp_path / "plain"))
    assert plain.returncode == 1
    assert "is not a folder" in plain.stderr
    assert (tmp_path / "plain").read_text() == "a file\n"


def test_dry_run_lists_the_files_and_writes_nothing(tmp_path: Path) -> None:
    repo = user_repo(tmp_path, USER_FILES)
    before = tree_hash(repo)
    result = npu_wizard("--answers", str(answers_file(tmp_path)), "--into", str(repo), "--folder", ".", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "  NPU-WIZARD.md\n" in result.stdout
    assert tree_hash(repo) == before
    # the list is exactly what a real render adds to the same repository
    listing = result.stdout.split(f" files to {repo}:\n", 1)[1].splitlines()
    listed_files = {line.strip() for line in listing if line.startswith("  ")}
    real = user_repo(tmp_path / "real", USER_FILES)
    assert npu_wizard("--answers", str(answers_file(tmp_path)), "--into", str(real), "--folder", ".").returncode == 0
    added = git(real, "status", "--porcelain", "-uall").splitlines()
    assert listed_files == {line[3:] for line in added if line.startswith("?? ")}
    assert f"would add {len(listed_files)} files to {repo}:" in result.stdout


@pytest.mark.slow
def test_run_and_monitor_work_on_the_folder_and_git_status_shows_nothing_of_the_run(tmp_path: Path) -> None:
    repo = user_repo(tmp_path, USER_FILES)
    answers = answers_file(tmp_path, tensorboard="true")
    assert npu_wizard("--answers", str(answers), "--into", str(repo), "--folder", ".").returncode == 0
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "npu-wizard's files")
    run = subprocess.run(
        [sys.executable, "-m", "wizard", "run", str(repo), "--plain", "--interval", "1"],
        env=node_env(tmp_path / "unused"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "2 ranks: finished 2" in run.stdout
    (run_dir,) = (p for p in (repo / "runs").iterdir() if p.is_dir())
    watched = npu_wizard("monitor", str(repo), "--plain")
    assert watched.returncode == 0, watched.stderr
    assert "outcome: finished" in watched.stdout
    assert sorted(p.name for p in (run_dir / "events").iterdir()) == ["rank-0.jsonl", "rank-1.jsonl"]
    assert contents(repo, list(USER_FILES)) == {name: text.encode() for name, text in USER_FILES.items()}
    # the run's folder, its TensorBoard events and the checkpoints are there, and git shows none of them
    assert list((run_dir / "tensorboard").iterdir()) and list((repo / "checkpoints").glob("step-*.pt"))
    assert git(repo, "status", "--porcelain", "--untracked-files=all", "--ignored=no") == ""


def test_update_rebase_after_the_state_is_lost_still_leaves_the_users_files_alone(tmp_path: Path) -> None:
    repo = user_repo(tmp_path, USER_FILES)
    assert (
        npu_wizard("--answers", str(answers_file(tmp_path, nodes=2)), "--into", str(repo), "--folder", ".").returncode
        == 0
    )
    shutil.rmtree(repo / ".npu-wizard")
    (repo / "answers.yaml").write_text(answers_file(tmp_path, nodes=3).read_text())
    result = npu_wizard("update", str(repo), "--rebase")
    assert result.returncode == 1, result.stdout + result.stderr  # markers written for the user to resolve
    assert "conflict NPU-WIZARD.md" in result.stdout and "added    launch/node2.sh" in result.stdout
    assert "README.md" not in result.stdout.replace("sysctl/README.md", "")
    assert "requirements.txt" not in result.stdout
    assert (repo / ".npu-wizard" / "into").is_file()
    assert contents(repo, list(USER_FILES)) == {name: text.encode() for name, text in USER_FILES.items()}


def test_force_is_refused_while_an_update_of_the_folder_is_at_work(tmp_path: Path) -> None:
    repo = user_repo(tmp_path, USER_FILES)
    assert (
        npu_wizard("--answers", str(answers_file(tmp_path, nodes=2)), "--into", str(repo), "--folder", ".").returncode
        == 0
    )
    (repo / "answers.yaml").write_text(answers_file(tmp_path, nodes=3).read_text())
    flag = tmp_path / "paused"
    env = {**os.environ, PAUSE_AT_ENV: "before-commit", PAUSE_FILE_ENV: str(flag)}
    update = subprocess.Popen([sys.executable, "-m", "wizard", "update", str(repo)], env=env)
    try:
        wait_for(lambda: flag.exists() or update.poll() is not None)
        assert update.poll() is None
        result = npu_wizard(
            "--answers", str(answers_file(tmp_path, nodes=2)), "--into", str(repo), "--folder", ".", "--force"
        )
    finally:
        update.kill()
        update.wait(timeout=30)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"another npu-wizard update of {repo} is running (held by pid {update.pid}: npu-wizard update" in (
        result.stderr
    )
    assert not (repo / "launch" / "node2.sh").exists()
    assert contents(repo, list(USER_FILES)) == {name: text.encode() for name, text in USER_FILES.items()}


def test_doctor_checks_the_folder_and_names_its_requirements_file(tmp_path: Path) -> None:
    repo = user_repo(tmp_path, USER_FILES)
    assert npu_wizard("--answers", str(answers_file(tmp_path)), "--into", str(repo), "--folder", ".").returncode == 0
    bare = tmp_path / "bare"  # a Python without torch, as on a node not yet set up
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    result = subprocess.run(
        [sys.executable, "-m", "wizard", "doctor", str(repo), "--json"],
        env={**os.environ, "PYTHON": str(bare / "bin" / "python")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert (report["project"], report["device"]) == ("repo", "cpu")
    torch = next(check for check in report["checks"] if check["name"] == "torch")
    assert torch["status"] == "FAIL"
    assert "pip install -r requirements-npu-wizard.txt," in torch["fix"]


def start_paused_render(repo: Path, answers: Path, flag: Path, point: str = "before-commit") -> subprocess.Popen[bytes]:
    """A render into `repo` stopped at `point` of its journal (the test hook), once it is there."""
    env = {**os.environ, PAUSE_AT_ENV: point, PAUSE_FILE_ENV: str(flag)}
    render = subprocess.Popen(
        [sys.executable, "-m", "wizard", "--answers", str(answers), "--into", str(repo), "--folder", "."], env=env
    )
    wait_for(lambda: flag.exists() or render.poll() is not None)
    assert render.poll() is None
    return render


def test_a_render_stopped_by_sigterm_before_its_commit_leaves_the_folder_as_it_was(tmp_path: Path) -> None:
    repo = user_repo(tmp_path, USER_FILES)
    before = tree_hash(repo, mtimes=False)
    render = start_paused_render(repo, answers_file(tmp_path), tmp_path / "paused")
    render.send_signal(signal.SIGTERM)
    assert render.wait(timeout=60) == 143
    assert tree_hash(repo, mtimes=False) == before


def test_a_render_killed_before_its_commit_can_be_run_again(tmp_path: Path) -> None:
    repo = user_repo(tmp_path, USER_FILES)
    answers = answers_file(tmp_path)
    render = start_paused_render(repo, answers, tmp_path / "paused")
    render.kill()
    render.wait(timeout=60)
    assert (repo / ".npu-wizard" / "update").is_dir()  # its staging is left, nothing else
    assert all(name.startswith(".npu-wizard/update") for name in new_files(repo))
    result = npu_wizard("--answers", str(answers), "--into", str(repo), "--folder", ".")
    assert result.returncode == 0, result.stdout + result.stderr
    assert set(new_files(repo)) == generated(repo)
    assert contents(repo, list(USER_FILES)) == {name: text.encode() for name, text in USER_FILES.items()}


def test_a_render_killed_after_its_commit_is_finished_by_the_next_one(tmp_path: Path) -> None:
    repo = user_repo(tmp_path, USER_FILES)
    answers = answers_file(tmp_path)
    render = start_paused_render(repo, answers, tmp_path / "paused", "after-first-move")
    render.kill()
    render.wait(timeout=60)
    result = npu_wizard("--answers", str(answers), "--into", str(repo), "--folder", ".")
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"finished the interrupted render or update of {repo} first; {repo} already holds npu-wizard's" in (
        result.stderr
    )
    assert set(new_files(repo)) == generated(repo)
    assert contents(repo, list(USER_FILES)) == {name: text.encode() for name, text in USER_FILES.items()}


@pytest.mark.parametrize("extra", [["--force"], ["--force", "--clean"], ["--force", "--dry-run"]])
def test_force_with_o_is_refused_on_a_folder_rendered_into(tmp_path: Path, extra: list[str]) -> None:
    repo = user_repo(tmp_path, {**USER_FILES, "src/main.py": "print('mine')\n", "notes.md": "my notes\n"})
    document = yaml.safe_load(answers_file(tmp_path, script="src/main.py").read_text())
    answers = tmp_path / "as-project.yaml"
    answers.write_text(answers_yaml({**document, "project_name": repo.name}))
    assert npu_wizard("--answers", str(answers), "--into", str(repo), "--folder", ".").returncode == 0
    before = tree_hash(repo)
    result = npu_wizard("--answers", str(answers), "-o", str(repo.parent), *extra)
    assert result.returncode == 1, result.stdout + result.stderr
    line = result.stderr.splitlines()[-1]
    assert f"{repo} was rendered with --into" in line
    assert f"npu-wizard --answers FILE --into {repo} --force" in line and f"npu-wizard update {repo}" in line
    assert tree_hash(repo) == before
    assert (repo / ".git").is_dir() and (repo / "notes.md").read_text() == "my notes\n"


def suggested_commands(message: str) -> list[list[str]]:
    """The npu-wizard commands a refusal suggests, as words (each ends before its parenthesis)."""
    found = re.findall(
        r"npu-wizard ((?:--answers|update) .+?) \((?:npu-wizard's files replaced|your edits kept)", message
    )
    return [shlex.split(command) for command in found]


@pytest.mark.parametrize(
    ("same_name", "extra"), [(True, ["--force"]), (True, []), (True, ["--force", "--dry-run"]), (False, ["--force"])]
)
def test_into_a_project_rendered_with_o_is_refused_with_commands_that_work(
    tmp_path: Path, same_name: bool, extra: list[str]
) -> None:
    first = yaml.safe_load(answers_file(tmp_path).read_text())
    (tmp_path / "first.yaml").write_text(answers_yaml(first))
    assert npu_wizard("--answers", str(tmp_path / "first.yaml"), "-o", str(tmp_path / "out")).returncode == 0
    project = tmp_path / "out" / first["project_name"]
    if not same_name:
        project = project.rename(tmp_path / "out" / "renamed")
    (project / "notes.md").write_text("my notes\n")
    changed = tmp_path / "changed.yaml"
    changed.write_text(answers_yaml({**first, "training": {**first["training"], "epochs": 3}}))
    before = tree_hash(project)
    shutil.copytree(project, tmp_path / "as-it-was", symlinks=True)

    refused = npu_wizard("--answers", str(changed), "--into", str(project), "--folder", ".", *extra)

    assert refused.returncode == 1 and len(refused.stderr.splitlines()) == 1, refused.stdout + refused.stderr
    assert f"npu-wizard: {project} is a project npu-wizard rendered with -o, not a folder of yours" in refused.stderr
    assert "--rebase" not in refused.stderr
    assert tree_hash(project) == before
    commands = suggested_commands(refused.stderr)
    assert [words[0] for words in commands] == (["--answers", "update"] if same_name else ["update"])
    for words in commands:  # each way out, from the project as it was
        shutil.rmtree(project)
        shutil.copytree(tmp_path / "as-it-was", project, symlinks=True)
        followed = npu_wizard(*words, cwd=tmp_path)
        assert followed.returncode == 0, followed.stdout + followed.stderr
        assert yaml.safe_load((project / "answers.yaml").read_text())["training"]["epochs"] == 3
        assert (project / "notes.md").read_text() == "my notes\n" and not (project / "NPU-WIZARD.md").exists()
