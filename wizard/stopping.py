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
