"""Files of a project that take a standard-library module's place for every rank.

A launch script puts the project first on PYTHONPATH for a user's script, and
Python puts the script's own folder first of all: there a `random.py` or a
`logging/` package is what `import random` or `import logging` finds, in the
script, in torch and in every library the ranks import, ahead of the standard
library. The launch-time preflight and `npu-wizard doctor` name such files.
Nothing here imports what it looks at.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

from .checks import PASS, WARN, Result

SHOWN = 5


def stdlib_names() -> frozenset[str]:
    """The standard library's top-level module names, less the built-in ones no file can replace."""
    names = getattr(sys, "stdlib_module_names", None)
    if names is None:  # before Python 3.10: what the standard library's folder holds
        folder = sysconfig.get_paths()["stdlib"]
        try:
            names = {name.split(".")[0] for name in os.listdir(folder)}
        except OSError:
            names = set()
    builtin = set(sys.builtin_module_names) | {"__future__", "__main__"}
    return frozenset(
        name for name in names if name.isidentifier() and name not in builtin
    )


def module_name(entry: os.DirEntry[str]) -> str | None:
    """The module `entry` is to `import`: NAME.py, NAME.*.so, or a NAME/ folder with an __init__.py."""
    name = entry.name
    try:
        if entry.is_dir():
            # a folder without __init__.py is a namespace package: any module of that name wins over it
            return (
                name
                if os.path.isfile(os.path.join(entry.path, "__init__.py"))
                else None
            )
    except OSError:
        return None
    if name.endswith(".py"):
        return name[:-3]
    if name.endswith(".so"):
        return name.split(".", 1)[0]
    return None


def shadowing_files(folder: Path, names: frozenset[str] | None = None) -> list[str]:
    """The entries of `folder` (file names, a package with a trailing /) that hide a standard-library module."""
    names = stdlib_names() if names is None else names
    try:
        entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
    except OSError:
        return []
    found = []
    for entry in entries:
        name = module_name(entry)
        if name in names:
            found.append(entry.name + ("/" if entry.is_dir() else ""))
    return found


def check_shadowing(project: Path, script: str) -> Result:
    """WARN naming each file of the project's folder, or the script's, that hides a standard-library module."""
    folders = {Path(project): "the project folder (first on PYTHONPATH)"}
    script_folder = (Path(project) / script).parent
    if script_folder.resolve() != Path(project).resolve():
        folders[script_folder] = "the script's folder (first on sys.path)"
    found = []
    for folder, where in folders.items():
        relative = os.path.relpath(folder, project)
        for name in shadowing_files(folder):
            path = name if relative == "." else f"{relative}/{name}"
            module = name.rstrip("/").split(".", 1)[0]
            found.append(f"{path} (in {where}) hides the standard library's {module}")
    if not found:
        return Result(
            "stdlib names",
            PASS,
            "no file of the project hides a standard-library module",
        )
    more = f" and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
    return Result(
        "stdlib names",
        WARN,
        f"{'; '.join(found[:SHOWN])}{more}: every rank, torch included, imports it in the module's place",
        "rename it (and its imports), or move it into a package of your own",
    )
