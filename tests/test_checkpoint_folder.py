"""The checkpoint folder holds more than checkpoints: --fresh and resuming touch only this project's.

Real `npu-wizard run` of rendered CPU projects (the shell launcher, 1 node x 2 ranks)
whose NPU_WIZARD_CHECKPOINT_DIR is a folder that also holds a user's files,
or another project's checkpoints.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from runtime import checkpoint
from tests.runs import events_of, kinds, node_env, render_cpu, run_dirs
from wizard.errors import TargetError
from wizard.run.checkpoints import set_aside, written_by


def run(project: Path, tmp_path: Path, folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "wizard", "run", str(project), "--interval", "1", "--plain", *args],
        env=node_env(tmp_path / "unused", NPU_WIZARD_CHECKPOINT_DIR=str(folder)),
        capture_output=True,
        text=True,
        timeout=300,
    )


def home_like(folder: Path) -> dict[str, bytes]:
    """A folder that holds a user's own files, as a home or a work volume does."""
    files = {".ssh/id_ed25519": b"private key", "work/notes.txt": b"notes", "step-notes.txt": b"not a checkpoint"}
    for name, content in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(content)
    return files


@pytest.mark.slow
def test_fresh_moves_only_this_projects_checkpoints_never_the_folder(tmp_path: Path) -> None:
    folder = tmp_path / "home"
    files = home_like(folder)
    project = render_cpu(tmp_path, "shell", samples=256)  # 8 steps an epoch, 2 epochs
    assert run(project, tmp_path, folder).returncode == 0
    saved = sorted(path.name for path in folder.glob("step-*.pt"))
    assert saved

    fresh = run(project, tmp_path, folder, "--fresh")

    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    assert {name: (folder / name).read_bytes() for name in files} == files  # the user's files did not move
    (aside,) = folder.glob("set-aside-*")
    assert f"--fresh: moved the old checkpoints into {aside}" in fresh.stdout
    assert sorted(path.name for path in aside.iterdir()) == saved  # nothing deleted
    assert kinds(events_of(run_dirs(project)[-1])[0], "started")[0]["resumed_step"] == 0


@pytest.mark.slow
def test_a_folder_shared_with_another_project_is_refused_naming_the_file(tmp_path: Path) -> None:
    folder = tmp_path / "shared"
    folder.mkdir()
    first = render_cpu(tmp_path / "a", "shell", samples=256, answers={"project_name": "first"})
    second = render_cpu(tmp_path / "b", "shell", samples=256, answers={"project_name": "second"})
    assert run(first, tmp_path, folder).returncode == 0
    newest = checkpoint.latest_checkpoint(folder)
    assert newest is not None and written_by(newest) == "first"

    shared = run(second, tmp_path, folder)

    assert shared.returncode == 3, shared.stdout + shared.stderr
    assert f"{newest} was written by project 'first'" in shared.stderr
    assert "give each project its own folder" in shared.stderr
    # --fresh in the second project is refused before anything moves
    before = sorted(path.name for path in folder.iterdir())
    fresh = run(second, tmp_path, folder, "--fresh")
    assert fresh.returncode == 1, fresh.stdout + fresh.stderr
    assert "was written by project 'first', not 'second'" in fresh.stderr
    assert sorted(path.name for path in folder.iterdir()) == before


def test_set_aside_moves_checkpoint_files_and_their_leftovers_only(tmp_path: Path) -> None:
    ours = checkpoint.save_checkpoint(tmp_path, 4, {"step": 4}, keep=9, project="mine")
    unnamed = checkpoint.save_checkpoint(tmp_path, 2, {"step": 2}, keep=9)  # written before names were kept
    torn = tmp_path / ".step-000000009.pt.x1y2.tmp"
    torn.write_bytes(b"PK torn")
    damaged = tmp_path / "step-000000001.pt.unreadable"
    damaged.write_bytes(b"zeros")
    kept = [tmp_path / "step-000000003.pt.bak", tmp_path / "stepping.pt", tmp_path / "data"]
    kept[0].write_bytes(b"x")
    kept[1].write_bytes(b"x")
    kept[2].mkdir()

    aside = set_aside(tmp_path, "mine")

    assert aside is not None and aside.parent == tmp_path
    assert sorted(path.name for path in aside.iterdir()) == sorted(path.name for path in (ours, unnamed, torn, damaged))
    assert all(path.exists() for path in kept)
    assert set_aside(tmp_path / "missing", "mine") is None
    theirs = checkpoint.save_checkpoint(tmp_path, 8, {"step": 8}, keep=9, project="other")
    with pytest.raises(TargetError, match="written by project 'other', not 'mine'"):
        set_aside(tmp_path, "mine")
    assert theirs.exists()


def test_the_project_name_is_read_without_unpickling(tmp_path: Path) -> None:
    planted = tmp_path / "step-000000001.pt"
    # its pickle names a global (unpickling it would import one): reading the name unpickles nothing
    torch.save({"npu_wizard_project": "mine", "hook": print}, planted)
    assert written_by(planted) == "mine"
    # a name pickled before the project's is referred to through the pickle's memo
    repeated = tmp_path / "step-000000003.pt"
    torch.save({"model": {"weight": torch.zeros(1)}, "npu_wizard_project": "model"}, repeated)
    assert written_by(repeated) == "model"
    deflated = tmp_path / "step-000000004.pt"
    with zipfile.ZipFile(deflated, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("archive/data.pkl", bytes(range(256)) * 4)
    damaged = bytearray(deflated.read_bytes())
    start = 30 + len("archive/data.pkl")  # the local header, the name, then the compressed stream
    damaged[start : start + 8] = b"\xff" * 8  # zlib refuses it
    deflated.write_bytes(bytes(damaged))
    assert written_by(deflated) is None
    (tmp_path / "step-000000002.pt").write_bytes(b"\0" * 100)
    assert written_by(tmp_path / "step-000000002.pt") is None
