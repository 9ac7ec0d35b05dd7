"""The git repository the wizard was started in: its name as a project name, and its training scripts."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

DEFAULT_NAME = "ddp-npu"
MAX_NAME = 64
# What a script that starts a process group says; such scripts are offered first.
PROCESS_GROUP = b"init_process_group"
SKIPPED_FOLDERS = {"node_modules", "site-packages", "__pycache__", "build", "dist", "venv", "env"}
MAX_FILES = 2000  # a huge repository is not read whole: the first files found are enough to suggest from
MAX_BYTES = 1_000_000


def is_repository(folder: Path) -> bool:
    """Whether `folder` is the top of a git repository (it holds .git, a folder or a worktree's file)."""
    return (folder / ".git").exists()


def project_name_from(folder: str) -> str:
    """A valid project name from a folder's name: lowercase, other characters as '-', starting with a letter."""
    name = re.sub(r"[^a-z0-9_-]+", "-", folder.lower()).strip("-_")
    if name and not name[0].isalpha():
        name = "repo-" + name
    return name[:MAX_NAME].rstrip("-_") or DEFAULT_NAME


def scripts_in(repository: Path) -> list[str]:
    """The repository's Python files (relative, '/'-separated): those that start a process group first."""
    found: list[tuple[bool, str]] = []
    for top, folders, files in os.walk(repository):
        folders[:] = sorted(f for f in folders if not f.startswith(".") and f not in SKIPPED_FOLDERS)
        for name in sorted(files):
            if not name.endswith(".py") or name.startswith("."):
                continue
            path = Path(top) / name
            if not _is_regular(path):  # a FIFO named x.py would block the TUI when read; a device is no script
                continue
            found.append((not _starts_process_group(path), path.relative_to(repository).as_posix()))
            if len(found) >= MAX_FILES:
                return _in_order(found)
    return _in_order(found)


def _in_order(found: list[tuple[bool, str]]) -> list[str]:
    """Scripts that start a process group first, then shallower before deeper, then by name."""
    return [relative for _, relative in sorted(found, key=lambda f: (f[0], f[1].count("/"), f[1]))]


def _is_regular(path: Path) -> bool:
    """Whether `path` is a regular file or a link to one: a FIFO, a device or a broken link is no script."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def _starts_process_group(path: Path) -> bool:
    """Whether the script says init_process_group; opened without blocking, and read only if still a regular file."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:  # unreadable: offered among the others, the script check says what is wrong
        return False
    with os.fdopen(descriptor, "rb") as file:
        try:
            return stat.S_ISREG(os.fstat(descriptor).st_mode) and PROCESS_GROUP in file.read(MAX_BYTES)
        except OSError:
            return False
