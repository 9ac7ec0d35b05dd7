"""`python -m wizard ...` for the tests, as a process forked from one that has already imported npu-wizard.

About 450 of `make test-fast`'s tests run the command line (a render, an update, a doctor, a refused answer) and
read its exit status and output. Each such process spent about 0.15 CPU s, of which about 0.1 s is the
interpreter starting and importing argparse, PyYAML, Jinja and the wizard; the command itself takes about
0.04 s (benchmarks/cli_forks.py measures both). Here one server process per pytest worker imports those modules
once and forks a child for each command. The child is still a process of its own, with everything a process
started as `python -m wizard ARGS` in that folder would have:

- its own stdin (the test's input, else /dev/null), stdout and stderr pipes, passed over a Unix socket;
- the test's working folder (also sys.path[0], as `-m` puts it there) and exactly the test's environment, so
  what it starts carries the test's marks (tests/leaks.py) and its files go where the test said;
- wizard/__main__.py run as `__main__` (runpy, as `-m` does) with sys.argv as `-m` makes it;
- the interpreter's exit: an uncaught exception's traceback on stderr and status 1, `sys.exit`'s code or
  message, atexit functions, non-daemon threads waited for, a death by signal reported as one;
- a timeout that kills it and raises subprocess.TimeoutExpired, as subprocess.run does.

What it does not have is a fresh interpreter: the server's imports are done, and it started with the
interpreter settings it serves (the `PYTHON*` variables, the locale: what Python reads as it starts), so a
call whose settings differ goes to another server, started with those. Its /proc/PID/cmdline and environ are
the server's (`python -m tests.wizard_forks`, the session's mark only): npu-wizard reads other processes' (a
live run's) and these commands are not such processes while a test looks. The first call with given settings
(a server costs more than one process), every call where no server can start or the platform cannot fork and
pass file descriptors, and every call under NPU_WIZARD_TEST_FORKS=0 are real `python -m wizard` subprocesses.
Tests of the command line's own start (tests/test_cli.py, tests/test_packaging.py) and of `npu-wizard run`
and `monitor` as a user starts them (tests/runs.py) start real processes.

The server stops when its worker's session ends (and on its own when the worker is gone: it holds the read end
of a pipe whose write end only the worker has). The children's CPU time is added to what tests/costs.py
records for the test that ran them: the server, not the worker, waits for them.
"""

from __future__ import annotations

import atexit
import builtins
import json
import locale
import os
import runpy
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
PRELOAD = ("wizard.cli", "wizard.render.command", "wizard.render.render")
"""What the server imports before it forks: the modules `npu-wizard --answers` imports (python -X importtime).
Importing them has no effect beyond defining them; a command that needs more imports it in its child."""

OFF = os.environ.get("NPU_WIZARD_TEST_FORKS") == "0"
"""NPU_WIZARD_TEST_FORKS=0: every call a real subprocess (benchmarks/cli_forks.py's baseline, or a doubt)."""

INTERPRETER_KEYS = ("LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE")
"""Besides every PYTHON* variable: what Python reads when it starts (the locale and the I/O encoding)."""

_HEADER = struct.Struct("!I")
_PID = struct.Struct("!q")

_lock = threading.Lock()
_servers: dict[tuple[tuple[str, str], ...], _Server | None] = {}
_seen: dict[tuple[tuple[str, str], ...], int] = {}
_forks_cpu = 0.0


def forks_cpu() -> float:
    """CPU seconds (user and system) of every child the servers have waited for on this process's behalf."""
    return _forks_cpu


def wizard(
    args: Sequence[str | os.PathLike[str]],
    *,
    input: str | bytes | None = None,  # noqa: A002 - the name subprocess.run gives it
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    text: bool = True,
) -> subprocess.CompletedProcess[Any]:
    """`subprocess.run([sys.executable, "-m", "wizard", *args], capture_output=True, ...)`, forked."""
    return run_module("wizard", args, input=input, cwd=cwd, env=env, timeout=timeout, text=text)


def run_module(
    module: str,
    args: Sequence[str | os.PathLike[str]],
    *,
    input: str | bytes | None = None,  # noqa: A002
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    text: bool = True,
    forked: bool = False,
) -> subprocess.CompletedProcess[Any]:
    """`python -m MODULE ARGS` in a forked child (tests/test_wizard_forks.py holds it to a real one's results).
    forked=True: never as a subprocess (a server starts now if none serves these settings; none can: an error)."""
    command = [sys.executable, "-m", module, *map(str, args)]
    environment = dict(os.environ if env is None else env)
    folder = os.path.abspath(os.fspath(cwd) if cwd is not None else os.getcwd())
    data = input.encode(locale.getpreferredencoding(False)) if isinstance(input, str) else input
    with _lock:
        server = _server_for(environment, now=forked)
        if server is None and forked:
            raise RuntimeError("no fork server could start here")
        if server is not None:
            stdout, stderr, returncode = server.run(command, data, folder, environment, timeout, text)
            return subprocess.CompletedProcess(command, returncode, stdout, stderr)
    return subprocess.run(
        command, input=input, cwd=folder, env=environment, capture_output=True, text=text, timeout=timeout
    )


def interpreter_settings(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The variables of `env` that Python reads as it starts: a server serves the environments that agree."""
    return tuple(sorted((k, v) for k, v in env.items() if k.startswith("PYTHON") or k in INTERPRETER_KEYS))


def _server_for(env: Mapping[str, str], now: bool = False) -> _Server | None:
    """The running server for these interpreter settings, started when they are asked for the second time; None
    for the first time (a real subprocess), and where none can run."""
    if OFF and not now:
        return None
    settings = interpreter_settings(env)
    _seen[settings] = _seen.get(settings, 0) + 1
    if _seen[settings] == 1 and not now:
        return None  # a server costs more than one process: only settings asked for again get one
    if settings in _servers:
        server = _servers[settings]
        if server is None:
            return None  # it could not start: subprocesses from now on
        if server.process.poll() is None:
            return server
        server.stop()  # it died (killed from outside): start another
    if not hasattr(socket, "send_fds") or not hasattr(os, "fork"):
        _servers[settings] = None
        return None
    if not _servers:
        atexit.register(stop)
    try:
        _servers[settings] = _Server.start(settings)
    except OSError as error:
        _servers[settings] = None
        print(f"tests.wizard_forks: no fork server ({error}); the command line runs as subprocesses", file=sys.stderr)
    return _servers[settings]


def stop() -> None:
    """Stop every server this process started and wait for each (by its PID)."""
    while _servers:
        _, server = _servers.popitem()
        if server is not None:
            server.stop()


class _Server:
    def __init__(self, process: subprocess.Popen[bytes], folder: str, alive_write: int):
        self.process = process
        self.socket_path = os.path.join(folder, "server")
        self.folder = folder
        self.alive_write = alive_write

    @classmethod
    def start(cls, settings: tuple[tuple[str, str], ...]) -> _Server:
        from tests.leaks import NODE  # the server outlives every test: it carries the session's mark only

        folder = tempfile.mkdtemp(prefix="npu-wizard-forks-")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(os.path.join(folder, "server"))
        listener.listen(16)
        alive_read, alive_write = os.pipe()
        env = {key: value for key, value in os.environ.items() if key != NODE}
        env = {key: value for key, value in env.items() if not interpreter_settings({key: value})} | dict(settings)
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "tests.wizard_forks", str(listener.fileno()), str(alive_read)],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                pass_fds=(listener.fileno(), alive_read),
            )
        except OSError:
            os.close(alive_write)
            raise
        finally:
            listener.close()
            os.close(alive_read)
        return cls(process, folder, alive_write)

    def stop(self) -> None:
        os.close(self.alive_write)  # the server's signal to end
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for name in os.listdir(self.folder):
            os.unlink(os.path.join(self.folder, name))
        os.rmdir(self.folder)

    def run(
        self, command: list[str], input: bytes | None, cwd: str, env: dict[str, str], timeout: float | None, text: bool
    ) -> tuple[Any, Any, int]:
        global _forks_cpu
        deadline = None if timeout is None else time.monotonic() + timeout
        stdin_read, stdin_write = os.pipe()
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            connection.connect(self.socket_path)
            request = json.dumps({"module": command[2], "args": command[3:], "cwd": cwd, "env": env}).encode()
            socket.send_fds(connection, [_HEADER.pack(len(request))], [stdin_read, out_write, err_write])
            connection.sendall(request)
        finally:
            for fd in (stdin_read, out_write, err_write):
                os.close(fd)
        try:
            (pid,) = _PID.unpack(_receive(connection, _PID.size))
            stdout, stderr, timed_out = _communicate(stdin_write, out_read, err_read, input, pid, deadline)
            ended = json.loads(_receive_all(connection))
        finally:
            connection.close()
        _forks_cpu += ended["cpu"]
        out, err = (_text(stdout), _text(stderr)) if text else (stdout, stderr)
        if timed_out:
            raise subprocess.TimeoutExpired(command, timeout or 0, output=out, stderr=err)
        return out, err, ended["returncode"]


def _text(data: bytes) -> str:
    """What subprocess.run(text=True) makes of the bytes: the locale's encoding, universal newlines."""
    text = data.decode(locale.getpreferredencoding(False))
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _receive(connection: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            raise RuntimeError("the wizard fork server went away")
        data += chunk
    return data


def _receive_all(connection: socket.socket) -> bytes:
    chunks = []
    while chunk := connection.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _communicate(
    stdin_write: int, out_read: int, err_read: int, input: bytes | None, pid: int, deadline: float | None
) -> tuple[bytes, bytes, bool]:
    """Feed the input, read both outputs to their end; past the deadline, kill the child and say so."""
    pending = input or b""
    if not pending:
        os.close(stdin_write)
    outputs: dict[int, list[bytes]] = {out_read: [], err_read: []}
    open_reads = [out_read, err_read]
    writes = [stdin_write] if pending else []
    timed_out = False
    while open_reads or writes:
        wait = None if deadline is None or timed_out else max(0.0, deadline - time.monotonic())
        if wait == 0.0 and not timed_out:
            timed_out = True
            _kill(pid)
            if writes:
                os.close(stdin_write)
                writes = []
            continue
        readable, writable, _ = select.select(open_reads, writes, [], wait)
        for fd in readable:
            chunk = os.read(fd, 65536)
            if chunk:
                outputs[fd].append(chunk)
            else:
                open_reads.remove(fd)
                os.close(fd)
        if writable:
            try:
                written = os.write(stdin_write, pending[:65536])
            except BrokenPipeError:
                written = len(pending)
            pending = pending[written:]
            if not pending:
                os.close(stdin_write)
                writes = []
    return b"".join(outputs[out_read]), b"".join(outputs[err_read]), timed_out


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish() -> None:
    """This process's tests are done: stop its server before the run looks for leftovers."""
    stop()


# The server: `python -m tests.wizard_forks LISTENER_FD ALIVE_FD`


def _serve(listener_fd: int, alive_fd: int) -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    listener = socket.socket(fileno=listener_fd)
    while True:
        readable, _, _ = select.select([listener, alive_fd], [], [])
        if alive_fd in readable:  # the worker closed its end (stopped, or gone)
            return
        connection, _ = listener.accept()
        try:
            _serve_one(connection, listener, alive_fd)
        except OSError:
            pass  # the worker gave up on this call (a timeout, or it ended)
        finally:
            connection.close()


def _serve_one(connection: socket.socket, listener: socket.socket, alive_fd: int) -> None:
    header, fds, _, _ = socket.recv_fds(connection, _HEADER.size, 3)
    if len(header) < _HEADER.size or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        return
    (size,) = _HEADER.unpack(header)
    request = json.loads(_receive(connection, size))
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        listener.close()
        connection.close()
        os.close(alive_fd)
        _child(request, fds)  # never returns
    for fd in fds:
        os.close(fd)
    connection.sendall(_PID.pack(pid))
    _, status, usage = os.wait4(pid, 0)
    returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    ended = {"returncode": returncode, "cpu": usage.ru_utime + usage.ru_stime}
    connection.sendall(json.dumps(ended).encode())


def _child(request: dict[str, object], fds: list[int]) -> None:
    code = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        os.chdir(str(request["cwd"]))
        os.environ.clear()
        os.environ.update(request["env"])  # type: ignore[arg-type]
        sys.path[0] = os.getcwd()  # as `python -m` puts it
        sys.argv = ["-m", *request["args"]]  # type: ignore[misc]
        code = _run_main(str(request["module"]))
    finally:
        os._exit(code)


def _run_main(module: str) -> int:
    """The module as `python -m` runs it (a package's __main__), then the interpreter's own way out."""
    try:
        main = types.ModuleType("__main__")  # a fresh namespace, not the server's
        main.__builtins__ = builtins  # type: ignore[attr-defined]
        sys.modules["__main__"] = main
        runpy._run_module_as_main(module, alter_argv=True)  # what `python -m` itself calls
        code = 0
    except SystemExit as exit:
        code = _exit_code(exit.code)
    except KeyboardInterrupt as interrupt:
        sys.excepthook(KeyboardInterrupt, interrupt, _from_runpy_on(interrupt))
        _finish()
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # Python ends as killed by SIGINT here
        os.kill(os.getpid(), signal.SIGINT)
        code = 130
    except BaseException as error:
        sys.excepthook(type(error), error, _from_runpy_on(error))
        code = 1
    return _finish(code)


def _from_runpy_on(error: BaseException) -> types.TracebackType | None:
    """The traceback without this module's frame, as the interpreter prints it for `python -m`."""
    if error.__traceback__ is not None:
        error.__traceback__ = error.__traceback__.tb_next
    return error.__traceback__


def _exit_code(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


def _finish(code: int = 0) -> int:
    """What the interpreter does on its way out: wait for non-daemon threads, run atexit, flush."""
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            code = code or 120  # as Python's own exit when stdout cannot be flushed
    return code


if __name__ == "__main__":
    _SERVER = sys.modules["__main__"]  # the server's own module stays alive while a child replaces __main__
    _serve(int(sys.argv[1]), int(sys.argv[2]))
