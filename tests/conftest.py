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
