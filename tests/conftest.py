"""Fixtures shared by several test modules."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import tempfile
from collections.abc import Iterator

import pytest

# A suite started in the background by a non-interactive shell (CI, nohup ... &) inherits
# SIGINT ignored, and so would every process it starts: bash cannot trap a signal ignored
# at entry and Python raises no KeyboardInterrupt. Ctrl-C tests need the terminal's default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Renders keep compiled templates in a cache of the suite's own (wizard/render/template_cache.py), not the user's:
# a private folder (mode 0700) made for this run, never a predictable path another local user could make first.
# Set before the tests are collected, so that xdist's workers and every process a test starts inherit it.
_OWN_CACHE: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    """Give the run a private template cache, unless the one who started it named one."""
    if "NPU_WIZARD_CACHE_DIR" not in os.environ:
        _OWN_CACHE.append(tempfile.mkdtemp(prefix="npu-wizard-tests-cache-"))
        os.environ["NPU_WIZARD_CACHE_DIR"] = _OWN_CACHE[0]


def pytest_unconfigure(config: pytest.Config) -> None:
    """Delete the run's cache folder (xdist's workers leave the one their controller made)."""
    for folder in _OWN_CACHE:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port some other program listens on (127.0.0.1), as a leftover run would."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


@pytest.fixture(autouse=True)
def _no_animations(monkeypatch: pytest.MonkeyPatch) -> None:
    """Textual animations off in every test: a screen is drawn in its final state however busy the machine is."""
    # The variable reaches apps started in a subprocess; App() reads the constant when it is made.
    monkeypatch.setenv("TEXTUAL_ANIMATIONS", "none")
    try:
        import textual.constants
    except ImportError:  # the runtime-only venv of the oldest torch has no Textual
        return
    monkeypatch.setattr(textual.constants, "TEXTUAL_ANIMATIONS", "none")
