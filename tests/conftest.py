"""Fixtures shared by several test modules."""

from __future__ import annotations

import os
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

# Renders keep compiled templates in a cache of the suite's own (wizard/templates.py), not the user's.
os.environ.setdefault("NPU_WIZARD_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"npu-wizard-tests-{os.getuid()}"))


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
