"""How `npu-wizard run` hears TERM and HUP: as Ctrl-C, so every way of stopping it stops the job."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

# kill, timeout, systemd, Slurm and a dropped ssh session end a runner with these: stop the job as Ctrl-C does
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class StopSignal(KeyboardInterrupt):
    """SIGTERM or SIGHUP reached the runner; raised in the main thread as SIGINT raises KeyboardInterrupt."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def stop_signals_raise() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise StopSignal (the main thread only)."""

    def handler(signum: int, _frame: object) -> None:
        raise StopSignal(signum)

    if not main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, action in previous.items():
            signal.signal(sig, action)


def main_thread() -> bool:
    """Whether this is the main thread (the only one Python delivers signals to)."""
    return threading.current_thread() is threading.main_thread()


def interruption(signum: int) -> KeyboardInterrupt:
    """What a stop signal raises: KeyboardInterrupt for Ctrl-C, StopSignal for SIGTERM and SIGHUP."""
    return KeyboardInterrupt() if signum == signal.SIGINT else StopSignal(signum)


@contextlib.contextmanager
def deferred_signals() -> Iterator[list[int]]:
    """Within the block, Ctrl-C, SIGTERM and SIGHUP are only noted (the list); after it the first is raised.

    For a few steps that must be taken all together or undone (the block
    checks the list to undo them); a signal ignored on entry stays ignored.
    """
    caught: list[int] = []
    if not main_thread():
        yield caught
        return

    def note(signum: int, _frame: object) -> None:
        caught.append(signum)

    previous = {
        sig: signal.signal(sig, note)
        for sig in (signal.SIGINT, *STOP_SIGNALS)
        if signal.getsignal(sig) is not signal.SIG_IGN
    }
    try:
        yield caught
    finally:
        for sig, action in previous.items():
            signal.signal(sig, action)
    if caught:
        raise interruption(caught[0])
