"""Short ssh and rsync commands run side by side, each stoppable at once.

The host check, the copy and each cancel round run one command per host at
once. They run as child processes in sessions of their own, their output in
temporary files, and the caller's thread only waits on them in short sleeps: a
signal that reaches the runner (Ctrl-C, or TERM and HUP raised as StopSignal by
wizard.stopping) interrupts the wait at once, and every command still running is
killed, with whatever it started (rsync's ssh), before the exception goes on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from typing import IO

from wizard.stopping import deferred_signals


def run_all(commands: Sequence[Sequence[str]], timeout: float) -> list[subprocess.CompletedProcess[str]]:
    """Run every command at once; each one still running after `timeout` seconds is killed (exit code 124)."""
    with contextlib.ExitStack() as files:
        started: list[tuple[subprocess.Popen[bytes] | None, IO[bytes], IO[bytes]]] = []
        codes: list[int] = []
        try:
            for command in commands:
                out, err = files.enter_context(tempfile.TemporaryFile()), files.enter_context(tempfile.TemporaryFile())
                # a signal between the fork and Popen's return would lose the child: it waits until it is listed
                with deferred_signals():
                    try:
                        process: subprocess.Popen[bytes] | None = subprocess.Popen(
                            list(command), stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True
                        )
                    except OSError as error:
                        err.write(f"{command[0]}: cannot run it ({error.strerror or error})".encode())
                        process = None
                    started.append((process, out, err))
            deadline = time.monotonic() + timeout
            for process, _out, err in started:
                if process is None:
                    codes.append(127)
                    continue
                try:
                    codes.append(process.wait(timeout=max(0.0, deadline - time.monotonic())))
                except subprocess.TimeoutExpired:
                    err.write(f"\nno answer within {timeout:.0f}s".encode())
                    codes.append(124)
        finally:  # on a timeout, and on a signal's exception: nothing started here outlives the call
            for process, _out, _err in started:
                if process is not None and process.poll() is None:
                    _kill_session(process)
        return [
            subprocess.CompletedProcess(list(command), code, _text(out), _text(err))
            for command, code, (_process, out, err) in zip(commands, codes, started, strict=True)
        ]


def _kill_session(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _text(handle: IO[bytes]) -> str:
    handle.seek(0)
    return handle.read().decode(errors="replace")  # a login banner in GBK, say, is not UTF-8
