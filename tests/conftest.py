"""Fixtures shared by several test modules."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest


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
    import textual.constants

    # App() reads the level when it is made; the variable reaches apps started in a subprocess
    monkeypatch.setattr(textual.constants, "TEXTUAL_ANIMATIONS", "none")
    monkeypatch.setenv("TEXTUAL_ANIMATIONS", "none")
