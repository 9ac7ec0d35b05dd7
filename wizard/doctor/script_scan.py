"""The code a user's script runs: the script and the modules of its own repository it imports, read, never run.

doctor's backend scan looks for nccl and cuda in that code, so a script that
delegates its setup to a module of its own (`from mypkg.dist import setup`) is
read there too. Imports are followed as plain `python SCRIPT` resolves them: from
the script's folder, then the repository's root; a module outside the repository
(torch, the standard library) is not read. The walk is bounded in files and bytes.
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterator
from pathlib import Path

MAX_MODULES = 200
MAX_MODULE_BYTES = 4 * 1024 * 1024  # a module is read this far


def imported_modules(root: Path, script: str, skip: Collection[str] = ()) -> list[str]:
    """The script and each module of `root` it imports, directly or through another, as paths relative to `root`.

    `skip` names files not to follow (npu-wizard's own); at most MAX_MODULES are listed, the script first.
    """
    found = [script]
    seen = {script, *skip}
    index = 0
    while index < len(found) and len(found) < MAX_MODULES:
        current = found[index]
        index += 1
        for module in _imports_of(root, current):
            if module not in seen:
                seen.add(module)
                found.append(module)
    return found[:MAX_MODULES]


def read_module(root: Path, name: str) -> str | None:
    """The text of the module `name` of `root` (its first MAX_MODULE_BYTES); None where it cannot be read."""
    try:
        with (root / name).open("rb") as file:
            return file.read(MAX_MODULE_BYTES).decode(errors="replace")
    except OSError:
        return None


def _imports_of(root: Path, name: str) -> Iterator[str]:
    """The modules of `root` that the module `name` imports (relative to `root`), in the order written."""
    text = read_module(root, name)
    if text is None:
        return
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return
    folder = Path(name).parent
    bases = [folder, Path(".")] if folder != Path(".") else [Path(".")]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield from _resolve(root, bases, alias.name.split("."))
        elif isinstance(node, ast.ImportFrom):
            parts = node.module.split(".") if node.module else []
            if node.level:  # from . import x, from ..pkg import y: from the module's own package
                package = folder
                for _ in range(node.level - 1):
                    package = package.parent
                search = [package]
            else:
                search = bases
            for alias in node.names:
                yield from _resolve(root, search, [*parts, alias.name] if alias.name != "*" else parts)
            if parts:
                yield from _resolve(root, search, parts)


def _resolve(root: Path, bases: list[Path], parts: list[str]) -> Iterator[str]:
    """The files of `root` that the dotted name `parts` loads from the first base that has it, packages' too."""
    for base in bases:
        files = list(_files_along(root, base, parts))
        if files:
            yield from files
            return


def _files_along(root: Path, base: Path, parts: list[str]) -> Iterator[str]:
    """base/a/__init__.py, base/a/b.py, ... for a.b: each file the import runs, as far as `root` holds them."""
    folder = base
    for depth, part in enumerate(parts):
        if not part.isidentifier():
            return
        module = folder / f"{part}.py"
        package = folder / part / "__init__.py"
        if (root / package).is_file():
            yield package.as_posix()
            folder = folder / part
        elif (root / module).is_file():
            yield module.as_posix()
            return
        elif (root / folder / part).is_dir() and depth < len(parts) - 1:
            folder = folder / part  # a namespace package: no __init__.py
        else:
            return
