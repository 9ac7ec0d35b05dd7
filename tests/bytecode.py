"""Compiled Python for the suite's own processes: a pytest plugin.

This machine kind sets PYTHONDONTWRITEBYTECODE, so every Python process the suite starts (an `npu-wizard`
render, a launch script's double, a doctor probe) compiled the project's modules anew, and every xdist worker
rewrote every test module's asserts anew at collection.

- Before any worker starts, the run's first process compiles the repository's own modules into their
  __pycache__ folders: the packages wizard and runtime, and the helper modules of tests (never a data folder
  such as tests/snapshots/). The bytecode is checked-hash: an import reads the source, hashes it and uses the
  bytecode only when the hashes match, so an edit never runs stale code (a timestamp pyc is trusted on the
  source's whole-second mtime and its size). The variable still keeps every process from writing bytecode of
  its own, for a module a test writes and rewrites in a temporary folder most of all.
- While a worker collects the tests, and then only, bytecode may be written: pytest caches the test modules it
  rewrites (__pycache__/*-pytest-*.pyc beside each test module, trusted on the source's mtime and size, as
  pytest does wherever bytecode may be written), and Python writes a pyc for any other module first imported
  then that has none (a package of the venv); nothing a test writes is imported while collecting. The modules
  of `pytest_plugins` (tests.costs, tests.leaks, this one) are loaded before collection and rewritten each time.

A folder that cannot be written only leaves the suite as slow as before.
"""

from __future__ import annotations

import importlib.util
import py_compile
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("wizard", "runtime", "tests")
_HEADER = 16
_CHECKED_HASH = 0b11  # the pyc's flags: hash-based, checked against the source at each import


def _is_test_module(path: Path) -> bool:
    """What pytest rewrites itself: test_*.py and conftest.py."""
    return path.name == "conftest.py" or path.name.startswith("test_")


def _importable(source: Path, package: Path) -> bool:
    """Whether `source` is a module of `package`: each folder from the package down to it is a package too. A
    rendered project kept as a snapshot (tests/snapshots/) holds .py files that nothing imports."""
    return all((folder / "__init__.py").is_file() for folder in source.parents if folder.is_relative_to(package))


def up_to_date(source: Path, cached: Path) -> bool:
    """Whether `cached` is checked-hash bytecode of `source` as it is now."""
    try:
        header = cached.read_bytes()[:_HEADER]
        flags = int.from_bytes(header[4:8], "little")
        return (
            header[:4] == importlib.util.MAGIC_NUMBER
            and flags == _CHECKED_HASH
            and header[8:16] == importlib.util.source_hash(source.read_bytes())
        )
    except OSError:
        return False


def compile_checked(root: Path = ROOT) -> list[Path]:
    """Compile each module of the packages whose bytecode is missing or stale; return those compiled."""
    compiled = []
    for package in PACKAGES:
        for source in sorted((root / package).rglob("*.py")):
            if not _importable(source, root / package) or (package == "tests" and _is_test_module(source)):
                continue
            cached = Path(importlib.util.cache_from_source(str(source)))
            if up_to_date(source, cached):
                continue
            try:
                py_compile.compile(
                    str(source),
                    cfile=str(cached),
                    doraise=True,
                    invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
                )
            except (OSError, py_compile.PyCompileError):
                continue  # a read-only checkout, or a module with a syntax error its own test will name
            compiled.append(source)
    return compiled


def pytest_configure(config: pytest.Config) -> None:
    """In the run's first process (xdist's controller, or a run without xdist): compile what is missing."""
    if not hasattr(config, "workerinput"):
        compile_checked()


@pytest.hookimpl(hookwrapper=True)
def pytest_collection(session: pytest.Session) -> Iterator[None]:
    """Let pytest cache its rewritten test modules while it collects, and only then."""
    before = sys.dont_write_bytecode
    sys.dont_write_bytecode = False
    try:
        yield
    finally:
        sys.dont_write_bytecode = before
