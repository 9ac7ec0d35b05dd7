"""Where a project that is one folder of a repository sits in it (`--into REPO --folder NAME`).

A module of its own, importing nothing of the render, so that the Kubernetes manifests (wizard.render.k8s) and
the pristine record (wizard.render.pristine) can both ask without an import loop.
"""

from __future__ import annotations

import os
from pathlib import Path

STATE_DIR = ".npu-wizard"
# The project's folder inside its repository (`--into REPO --folder NAME`): the ranks start from the repository root.
# "." names the older layout chosen with `--folder .` (the files straight in the repository's root).
REPOSITORY_MARKER = f"{STATE_DIR}/repository"


def repository_folder(project: Path) -> str:
    """The project's folder relative to its repository's root ("" when the project is not one folder of a
    repository: rendered -o, or --into straight into the user's folder)."""
    try:
        folder = (project / REPOSITORY_MARKER).read_text(encoding="utf-8").strip()
    except (FileNotFoundError, NotADirectoryError, UnicodeDecodeError):
        return ""
    parts = folder.split("/")
    if folder in ("", ".") or folder.startswith("/") or any(part in ("", ".", "..") for part in parts):
        return ""
    # the marker is a committed file anyone may edit: it counts only where it names the folder the project
    # really is in, so that the repository's root is never a folder above the repository
    if Path(os.path.abspath(project)).parts[-len(parts) :] != tuple(parts):
        return ""
    return folder


def repository_root(project: Path) -> Path:
    """The folder the ranks of `project` start in, where training.script is found: its repository's root when
    the project is one folder of a repository, else the project itself."""
    folder = repository_folder(project)
    return Path(os.path.normpath(project.joinpath(*[".."] * len(folder.split("/"))))) if folder else project
