"""What the ssh engine copies to every host (wizard/run/engines/ssh_copy.py): what git would keep, and no history.

Each case is a real git repository (or a folder outside one) with real .gitignore files.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from wizard.run.engines.base import EngineError
from wizard.run.engines.ssh_copy import copy_list


def git(repo: Path, *args: str) -> None:
    """A git command in `repo` that must succeed."""
    author = ["-c", "user.name=Test", "-c", "user.email=test@example.com", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", *author, *args], cwd=repo, check=True, capture_output=True, timeout=60)


def folder(root: Path, files: dict[str, str]) -> Path:
    """`root` holding `files`."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


PROJECT = {
    "train.py": "print('train')\n",
    "launch/node0.sh": "#!/bin/bash\n",
    "answers.yaml": "project_name: mine\n",
    "src/model.py": "MODEL = 1\n",
    "src/.gitignore": "*.tmp\n!keep.tmp\n",
    "src/scratch.tmp": "scratch\n",
    "src/keep.tmp": "kept by the nested .gitignore's own negation\n",
    ".gitignore": "*.log\n/data/\n/build/\n",
    "debug.log": "noise\n",
    "data/train.bin": "0123456789",
    "build/out.o": "object\n",
    "runs/20260101-000000/logs/node-0.log": "old run\n",
    "checkpoints/step-000000001.pt": "weights\n",
    "src/__pycache__/model.cpython-311.pyc": "bytecode\n",
}


def test_a_repository_copies_what_git_keeps_and_never_its_history_runs_or_checkpoints(tmp_path: Path) -> None:
    repo = folder(tmp_path / "repo", PROJECT)
    git(repo, "init", "-q")
    git(repo, "add", "train.py", "src/model.py", ".gitignore")
    git(repo, "commit", "-q", "-m", "mine")
    copied = copy_list(repo)
    assert copied.files == (
        ".gitignore",
        "answers.yaml",
        "launch/node0.sh",
        "src/.gitignore",
        "src/keep.tmp",
        "src/model.py",
        "train.py",
    )
    assert copied.size == sum((repo / name).stat().st_size for name in copied.files)
    assert copied.summary().startswith(f"copies 7 file(s), {copied.size} bytes")


def test_npu_wizardignore_keeps_an_ignored_data_folder_and_leaves_out_more(tmp_path: Path) -> None:
    repo = folder(tmp_path / "repo", {**PROJECT, ".npu-wizardignore": "# the ranks read data/\n!data/\nsrc/*.tmp\n"})
    git(repo, "init", "-q")
    copied = copy_list(repo)
    assert "data/train.bin" in copied.files and copied.kept == 1
    assert "src/keep.tmp" not in copied.files and "build/out.o" not in copied.files
    assert ".npu-wizardignore" in copied.files
    assert "1 of them ignored by git but kept by .npu-wizardignore" in copied.summary()


@pytest.mark.parametrize("where", ["no repository", "a repository that ignores the folder"])
def test_a_folder_git_does_not_track_still_follows_its_own_gitignore_files(tmp_path: Path, where: str) -> None:
    if where == "no repository":
        project = folder(tmp_path / "out" / "mine", PROJECT)
    else:
        outer = folder(tmp_path / "checkout", {".gitignore": "/out/\n"})
        git(outer, "init", "-q")
        project = folder(outer / "out" / "mine", PROJECT)
    copied = copy_list(project)
    assert "train.py" in copied.files and "src/keep.tmp" in copied.files
    assert not {"debug.log", "data/train.bin", "src/scratch.tmp"} & set(copied.files)
    assert not [name for name in copied.files if name.startswith(("runs/", "checkpoints/", ".git/"))]


def test_an_unreadable_npu_wizardignore_is_named(tmp_path: Path) -> None:
    project = folder(tmp_path / "mine", PROJECT)
    (project / ".npu-wizardignore").write_bytes(b"\xff\xfe!data/\n")
    with pytest.raises(EngineError, match=r"cannot read .*\.npu-wizardignore"):
        copy_list(project)


def test_listing_a_repository_never_runs_the_command_its_config_names(tmp_path: Path) -> None:
    repo = folder(tmp_path / "repo", {"train.py": "print('train')\n"})
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    ran = tmp_path / "fsmonitor-ran"
    git(repo, "config", "core.fsmonitor", f"touch {ran}; false")  # a folder someone handed over, .git/ and all
    assert copy_list(repo).files == ("train.py",)
    assert not ran.exists()  # before: git ls-files ran the repository's core.fsmonitor command


def test_a_submodule_and_a_nested_clone_are_copied_file_by_file_without_their_git(tmp_path: Path) -> None:
    lib = folder(tmp_path / "lib", {"mod.py": "X = 1\n"})
    git(lib, "init", "-q")
    git(lib, "add", "-A")
    git(lib, "commit", "-qm", "lib")
    repo = folder(tmp_path / "repo", {"train.py": "import mod\n"})
    git(repo, "init", "-q")
    git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib), "third_party/lib")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "project")
    clone = folder(repo / "vendor", {"util.py": "Y = 2\n", "out.log": "noise\n", ".gitignore": "*.log\n"})
    git(clone, "init", "-q")  # a clone inside the project that the project's git does not track
    files = copy_list(repo).files
    # before: "third_party/lib" (rsync makes it an empty folder) and "vendor/" (rsync copies all of it, .git too)
    assert "third_party/lib/mod.py" in files and "vendor/util.py" in files and "vendor/.gitignore" in files
    assert not any(name.rstrip("/") in ("third_party/lib", "vendor") for name in files)
    assert not any("/.git/" in name or name.endswith("/.git") or name.endswith(".log") for name in files)


def test_a_submodule_not_checked_out_is_listed_as_its_empty_folder(tmp_path: Path) -> None:
    lib = folder(tmp_path / "lib", {"mod.py": "X = 1\n"})
    git(lib, "init", "-q")
    git(lib, "add", "-A")
    git(lib, "commit", "-qm", "lib")
    made = folder(tmp_path / "made", {"train.py": "print('train')\n"})
    git(made, "init", "-q")
    git(made, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib), "lib")
    git(made, "add", "-A")
    git(made, "commit", "-qm", "project")
    git(tmp_path, "clone", "-q", str(made), "cloned")  # without --recurse-submodules: lib/ stays empty
    assert copy_list(tmp_path / "cloned").files == (".gitmodules", "lib", "train.py")
