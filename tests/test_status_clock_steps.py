"""The status stream's deadlines are durations: a step of the system clock (NTP) moves none (issue 36 item 20).

The server stamps arrivals and a lost connection's end with its wall clock (`clock`, shown to people and
compared with the ranks' own timestamps), and measures the loss grace and the authentication deadline
with a monotonic one (`ticker`). Here the wall clock is a double that steps by an hour when told; the
ticker is the real monotonic clock.
"""

from __future__ import annotations

import time

import pytest

from tests.runs import wait_for
from tests.test_status_stream import AUTH, TOKEN, connect, drained, hello
from wizard.monitor.status_server import StatusServer

# Mostly waiting (on a deadline, a socket, another process), little CPU: run early (tests/conftest.py)
pytestmark = pytest.mark.waits

HOUR = 3600.0


class SteppedWallClock:
    """time.time, moved by `step` seconds once `jump()` is called (an NTP step), as a double for the system clock."""

    def __init__(self, step: float) -> None:
        self.step = step
        self.offset = 0.0

    def jump(self) -> None:
        """The system clock steps now."""
        self.offset = self.step

    def __call__(self) -> float:
        return time.time() + self.offset


def test_a_forward_step_does_not_report_a_dropped_connection_lost_before_its_grace() -> None:
    wall = SteppedWallClock(HOUR)
    listening = StatusServer("127.0.0.1", 0, TOKEN, clock=wall, loss_grace=2.0)
    try:
        client = connect(listening, AUTH, hello(5, 4545))
        drained(listening, 1, "the hello")
        client.close()  # a send timed out: the publisher would reconnect within the grace
        dropped = time.monotonic()
        wait_for(listening.ended, 30, "the server to see the connection end")
        wall.jump()
        (lost,) = drained(listening, 1, "the loss once the grace is over")
        assert (lost["event"], lost["rank"]) == ("lost", 5)
        assert time.monotonic() - dropped >= 1.9  # the hour the wall clock jumped is no hour of silence
    finally:
        listening.close()


def test_a_backward_step_does_not_hold_back_the_loss_of_a_connection_that_never_comes_back() -> None:
    wall = SteppedWallClock(-HOUR)
    listening = StatusServer("127.0.0.1", 0, TOKEN, clock=wall, loss_grace=1.0)
    try:
        client = connect(listening, AUTH, hello(2, 4646))
        drained(listening, 1, "the hello")
        client.close()
        wait_for(listening.ended, 30, "the server to see the connection end")
        wall.jump()
        (lost,) = drained(listening, 1, "the loss one grace after the drop, the step notwithstanding")
        assert (lost["event"], lost["rank"], lost["pid"]) == ("lost", 2, 4646)
    finally:
        listening.close()


def test_a_forward_step_does_not_close_a_silent_connection_before_its_authentication_deadline() -> None:
    wall = SteppedWallClock(HOUR)
    listening = StatusServer("127.0.0.1", 0, TOKEN, clock=wall, auth_deadline=1.5)
    try:
        client = connect(listening)  # says nothing yet
        wait_for(lambda: listening.counts.accepted == 1, 30, "the connection to be accepted")
        accepted = time.monotonic()
        wall.jump()
        wait_for(lambda: listening.counts.timed_out == 1, 30, "the silent connection to be closed")
        assert time.monotonic() - accepted >= 1.4  # at its deadline, not at the step
        client.close()
    finally:
        listening.close()
