"""runtime/folders.keep_out_of_git: the .gitignore a run's folder gets, written once and never taken away."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime import folders
from runtime.folders import GITIGNORE_TEXT, keep_out_of_git
from tests.test_runtime_checkpoint import DiskFullFileDouble


def test_a_second_call_leaves_the_gitignore_the_first_wrote(tmp_path: Path) -> None:
    """Two ranks (or two runs) making the same folder: the later call finds the file and leaves it."""
    keep_out_of_git(tmp_path)
    keep_out_of_git(tmp_path)
    assert (tmp_path / ".gitignore").read_text() == GITIGNORE_TEXT


def test_a_users_own_gitignore_is_left_as_it_is(tmp_path: Path) -> None:
    (tmp_path / ".gitignore").write_text("*.pt\n")
    keep_out_of_git(tmp_path)
    assert (tmp_path / ".gitignore").read_text() == "*.pt\n"


def test_a_full_disk_leaves_no_empty_gitignore_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = Path.open

    def full_disk_open(self: Path, *args: object, **kwargs: object) -> object:
        opened = real_open(self, *args, **kwargs)  # type: ignore[arg-type]
        return DiskFullFileDouble(opened) if self.name == ".gitignore" else opened

    monkeypatch.setattr(folders.Path, "open", full_disk_open)
    with pytest.raises(OSError, match="No space left"):
        keep_out_of_git(tmp_path)
    assert not (tmp_path / ".gitignore").exists()
