"""`python -m wizard ...` for the tests, as a process forked from one that has already imported npu-wizard.

About 450 of `make test-fast`'s tests run the command line (a render, an update, a doctor, a refused answer) and
read its exit status and output. Each such process spent about 0.15 CPU s, of which about 0.1 s is the
interpreter starting and importing argparse, PyYAML, Jinja and the wizard; the command itself takes about
0.04 s (benchmarks/cli_forks.py measures both). Here a server process (one per pytest worker and interpreter
settings) imports those modules once and forks a child for each command. The child is still a process of its
own, with what a process started as `python -m wizard ARGS` in that folder would have:

- its own stdin (a pipe with the test's input, else /dev/null), stdout and stderr pipes, passed over a Unix
  socket, with standard streams made over them as the interpreter makes them;
- the test's working folder (also sys.path[0], as `-m` puts it there), umask and resource limits (those
  passed, as a preexec_fn sets them);
- exactly the test's environment in os.environ (with the locale variable Python itself sets when it coerces a
  C locale), so what it starts carries the test's marks (tests/leaks.py); TZ read again;
- wizard/__main__.py run as `__main__` in a namespace of its own (runpy, as `-m` does), sys.argv as `-m`
  makes it;
- the interpreter's exit: an uncaught exception's traceback (from runpy's frame on) on stderr and status 1,
  `sys.exit`'s code or message, then the interpreter's own finalization (atexit, non-daemon threads, files
  flushed); a death by signal reported as one;
- a timeout that kills it and raises subprocess.TimeoutExpired as subprocess.run does (the output so far, in
  bytes), even when it closed its stdout or a process it started holds it.

What it does not have is a fresh interpreter, so a call goes to a real `python -m wizard` subprocess wherever
that could show:
- the server has imported what the command would import later: a module or package in the working folder
  that a fresh `python -m` would find first (a `platform.py`, a project's `runtime/`) means a subprocess; so
  does a relative or empty PYTHONPATH entry, and PYTHONSAFEPATH;
- Python reads the `PYTHON*` variables and the locale when it starts: each combination gets a server of its
  own, started with them;
- `npu-wizard run` and `monitor`: npu-wizard finds a live runner by its /proc/PID/cmdline, and a fork's is the
  server's;
- the first call with given settings (a server costs more than one process), a platform that cannot fork and
  pass file descriptors, a server that could not start (its log says why), and NPU_WIZARD_TEST_FORKS=0.
Known differences a test must not lean on (it passes real=True, or calls subprocess itself, where it does):
- /proc/PID/environ and cmdline are the server's: its environment holds the interpreter settings, PATH and the
  session's leak mark, nothing of a test's (tests/test_hostfile.py reads /proc/self/environ as a hostfile);
- the forks of one server share its string-hash seed (tests/test_template_cache.py compares separate
  processes' renders for nondeterminism);
- resource limits apply from the fork on, not to the interpreter's own start; what a fresh interpreter prints
  as it starts would go to the server's log, so a server that printed anything serves nothing;
- calls from one test process run one at a time (a lock), threads or not.

The server stops when its worker's session ends (and on its own, between calls, when the worker is gone: it
holds the read end of a pipe whose write end only the worker has), and removes its folder. A server that
dies during a call takes the child with it (the worker kills it). The children's CPU time is added to what
tests/costs.py records for the test that ran them: the server, not the worker, waits for them.
"""

from __future__ import annotations

import atexit
import builtins
import io
import json
import locale
import os
import resource
import runpy
import selectors
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
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRELOAD = ("wizard.cli", "wizard.render.command", "wizard.render.render")
"""What the server imports before it forks: the modules `npu-wizard --answers` imports (python -X importtime)."""

OFF = os.environ.get("NPU_WIZARD_TEST_FORKS") == "0"
"""NPU_WIZARD_TEST_FORKS=0: every call a real subprocess (benchmarks/cli_forks.py's baseline, or a doubt)."""

INTERPRETER_KEYS = ("LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE")
"""Besides the PYTHON* variables: what Python reads when it starts (the locale and the I/O encoding)."""

REAL_PROCESS_COMMANDS = ("run", "monitor")
"""Commands whose process other processes look for by its command line (wizard/monitor/procs.py)."""

START_S = 120.0
"""How long a server may take to import the wizard and say it is ready: a safety net on a loaded machine."""

_HEADER = struct.Struct("!I")
_PID = struct.Struct("!q")
_Settings = tuple[tuple[str, str], ...]

_lock = threading.Lock()
_servers: dict[_Settings, _Server | None] = {}
_seen: dict[_Settings, int] = {}
_forks_cpu = 0.0


def forks_cpu() -> float:
    """CPU seconds (user and system) of every child the servers have waited for on this process's behalf."""
    return _forks_cpu


def wizard(
    args: Sequence[str | os.PathLike[str]], *, real: bool = False, **options: Any
) -> subprocess.CompletedProcess[Any]:
    """`subprocess.run([sys.executable, "-m", "wizard", *args], capture_output=True, ...)`, forked where that
    cannot show; `options` as run_module takes them (input, cwd, env, timeout, text, limits). real=True: a
    fresh interpreter, for a test that reads what a fork does not have of its own (its /proc/self/environ, its
    hash seed)."""
    real = real or (bool(args) and str(args[0]) in REAL_PROCESS_COMMANDS)
    return run_module("wizard", args, real=real, **options)


def run_module(
    module: str,
    args: Sequence[str | os.PathLike[str]],
    *,
    input: str | bytes | None = None,  # noqa: A002
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    text: bool = True,
    limits: Mapping[int, tuple[int, int]] | None = None,
    real: bool = False,
    forked: bool = False,
) -> subprocess.CompletedProcess[Any]:
    """`python -m MODULE ARGS` (tests/test_wizard_forks.py holds a fork to a real process's results). `limits`:
    resource limits the process starts with ({resource.RLIMIT_AS: (soft, hard)}). real=True: a subprocess;
    forked=True: a fork, the server started now if none serves these settings (tests only)."""
    command = [sys.executable, "-m", module, *map(str, args)]
    environment = dict(os.environ if env is None else env)
    folder = os.path.abspath(os.fspath(cwd) if cwd is not None else os.getcwd())
    if isinstance(input, str) and not text:
        raise TypeError("input must be bytes when text is False, as for subprocess.run")
    data = input.encode(locale.getpreferredencoding(False)) if isinstance(input, str) else input
    with _lock:
        server = None if real else _server_for(environment, folder, now=forked)
        if server is None and forked:
            raise RuntimeError(f"no fork server serves this call (see {tempfile.gettempdir()}/npu-wizard-forks-*)")
        if server is not None:
            request = {"module": module, "args": command[3:], "cwd": folder, "env": environment, "umask": _umask()}
            request["limits"] = [[which, *values] for which, values in (limits or {}).items()]
            stdout, stderr, returncode = server.run(command, request, data, timeout, text)
            return subprocess.CompletedProcess(command, returncode, stdout, stderr)
    return subprocess.run(
        command,
        input=input,
        cwd=folder,
        env=environment,
        capture_output=True,
        text=text,
        timeout=timeout,
        preexec_fn=(lambda: _set_limits(limits)) if limits else None,
    )


def interpreter_settings(env: Mapping[str, str]) -> _Settings:
    """The variables of `env` that Python reads as it starts: a server serves the environments that agree."""
    return tuple(
        sorted((k, v) for k, v in env.items() if (k.startswith("PYTHON") and k != "PYTHON") or k in INTERPRETER_KEYS)
    )


def _set_limits(limits: Mapping[int, tuple[int, int]] | None) -> None:
    for which, (soft, hard) in (limits or {}).items():
        resource.setrlimit(which, (soft, hard))


def _umask() -> int:
    """This process's umask, read without changing it (os.umask would, for a moment, for every thread)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o22)
    os.umask(mask)
    return mask


def _paths_a_fork_would_get_wrong(env: Mapping[str, str]) -> bool:
    """PYTHONSAFEPATH, or a PYTHONPATH entry Python would resolve against the working folder at its start."""
    entries = env.get("PYTHONPATH", "")
    return bool(env.get("PYTHONSAFEPATH")) or any(not os.path.isabs(p) for p in entries.split(os.pathsep) if entries)


def _server_for(env: Mapping[str, str], folder: str, now: bool = False) -> _Server | None:
    """The running server for these interpreter settings, started when they are asked for the second time (or
    `now`); None where the call must be a real subprocess."""
    if (OFF and not now) or _paths_a_fork_would_get_wrong(env):
        return None
    settings = interpreter_settings(env)
    _seen[settings] = _seen.get(settings, 0) + 1
    if _seen[settings] == 1 and not now:
        return None  # a server costs more than one process: only settings asked for again get one
    server = _servers.get(settings)
    if settings in _servers and server is None:
        return None  # it could not start: subprocesses from now on
    if server is not None and server.process.poll() is not None:
        del _servers[settings]
        server.stop()  # it died (killed from outside): start another
        server = None
    if server is None:
        if not hasattr(socket, "send_fds") or not hasattr(os, "fork"):
            _servers[settings] = None
            return None
        if not _servers:
            atexit.register(stop)
        try:
            server = _servers[settings] = _Server.start(settings)
        except OSError as error:
            _servers[settings] = None
            print(f"tests.wizard_forks: no fork server ({error}); these calls run as subprocesses", file=sys.stderr)
            return None
    return None if server.shadowed(folder) else server


def stop() -> None:
    """Stop every server this process started and wait for each (by its PID)."""
    while _servers:
        _, server = _servers.popitem()
        if server is not None:
            server.stop()


class _Server:
    def __init__(self, process: subprocess.Popen[bytes], folder: str, alive_write: int) -> None:
        self.process = process
        self.folder = folder
        self.socket_path = os.path.join(folder, "server")
        self.alive_write = alive_write
        self.origins: dict[str, str] = {}

    @classmethod
    def start(cls, settings: _Settings) -> _Server:
        from tests.leaks import SESSION  # the server outlives every test: it carries the session's mark only

        folder = tempfile.mkdtemp(prefix="npu-wizard-forks-")
        alive_read, alive_write = os.pipe()
        ready_read, ready_write = os.pipe()
        env = {"PATH": os.environ.get("PATH", os.defpath), **dict(settings)}
        if SESSION in os.environ:
            env[SESSION] = os.environ[SESSION]
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(os.path.join(folder, "server"))
            listener.listen(16)
            with open(os.path.join(folder, "server.log"), "wb") as log:
                process = subprocess.Popen(
                    [
                        sys.executable,
                        os.path.abspath(__file__),
                        *map(str, (listener.fileno(), alive_read, ready_write)),
                    ],
                    cwd=folder,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    pass_fds=(listener.fileno(), alive_read, ready_write),
                )
        except OSError:
            os.close(alive_write)
            _remove(folder)
            raise
        finally:
            listener.close()
            for fd in (alive_read, ready_write):
                os.close(fd)
        server = cls(process, folder, alive_write)
        try:
            server.origins = json.loads(_read_to_end(ready_read, time.monotonic() + START_S))
            if os.path.getsize(os.path.join(folder, "server.log")):
                # what a fresh interpreter prints as it starts (a warning, an import time) its children would not
                raise ValueError("it wrote to its log as it started")
        except (OSError, ValueError) as error:
            log_text = _tail(os.path.join(folder, "server.log"))
            server.stop()
            raise OSError(f"the server did not start ({error}): {log_text}") from None
        finally:
            os.close(ready_read)
        return server

    def shadowed(self, folder: str) -> bool:
        """Whether `folder` holds a module or package that a fresh `python -m` there would import in place of one
        the server has imported already."""
        try:
            entries = os.listdir(folder)
        except OSError:
            return False
        for entry in entries:
            name, dot, suffix = entry.partition(".")
            if name not in self.origins:
                continue
            path = os.path.join(folder, entry)
            if dot and not (suffix == "py" or suffix == "pyc" or suffix.endswith("so")):
                continue
            if not dot and not _is_package(path):
                continue  # a namespace portion: a regular module further on sys.path wins over it
            if os.path.realpath(path) != os.path.realpath(self.origins[name]):
                return True
        return False

    def stop(self) -> None:  # noqa: D102
        if self.alive_write < 0:
            return
        os.close(self.alive_write)  # the server's signal to end
        self.alive_write = -1
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        _remove(self.folder)

    def run(
        self, command: list[str], request: dict[str, Any], input: bytes | None, timeout: float | None, text: bool
    ) -> tuple[Any, Any, int]:
        global _forks_cpu
        deadline = None if timeout is None else time.monotonic() + timeout
        if input:
            stdin_read, stdin_write = os.pipe()
        else:  # what subprocess.run gives a child under pytest's capture: /dev/null
            stdin_read, stdin_write = os.open(os.devnull, os.O_RDONLY), os.open(os.devnull, os.O_WRONLY)
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        mine = {stdin_write, out_read, err_read}  # what this process keeps, closed by the end of the call
        theirs = [stdin_read, out_write, err_write]  # what the child gets
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        pid = None
        try:
            connection.connect(self.socket_path)
            encoded = json.dumps(request).encode()
            socket.send_fds(connection, [_HEADER.pack(len(encoded))], theirs)
            connection.sendall(encoded)
            for fd in theirs:
                os.close(fd)
            theirs = []
            try:
                (pid,) = _PID.unpack(_receive(connection, _PID.size, deadline))
            except subprocess.TimeoutExpired:
                pid = _pid_if_sent(connection)  # it may have come just now: that child must not run on alone
                raise
            stdout, stderr, status, timed_out = _communicate(
                connection, stdin_write, out_read, err_read, input, pid, deadline, mine
            )
        except subprocess.TimeoutExpired:
            if pid is not None:
                _kill(pid)
            raise subprocess.TimeoutExpired(command, timeout or 0) from None  # no child yet: the server is busy
        except BaseException:
            if pid is not None:
                _kill(pid)
            raise
        finally:
            for fd in [*theirs, *mine]:
                os.close(fd)
            connection.close()
        if not status:  # killed at once in _communicate: nobody else would wait for it
            raise RuntimeError(f"the wizard fork server went away: {_tail(os.path.join(self.folder, 'server.log'))}")
        if timed_out:
            raise subprocess.TimeoutExpired(command, timeout or 0, output=stdout or None, stderr=stderr or None)
        ended = json.loads(status)
        _forks_cpu += ended["cpu"]
        if text:
            return _text(stdout), _text(stderr), ended["returncode"]
        return stdout, stderr, ended["returncode"]


def _is_package(path: str) -> bool:
    """Whether the folder is a regular package: an __init__ module of any kind Python imports."""
    try:
        names = os.listdir(path)
    except OSError:
        return False
    return any(
        name == "__init__.py" or name == "__init__.pyc" or name.startswith("__init__.") and name.endswith(".so")
        for name in names
    )


def _text(data: bytes) -> str:
    """What subprocess.run(text=True) makes of the bytes: the locale's encoding, universal newlines."""
    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as log:
            return log.read()[-2000:].decode(errors="replace").strip() or "(its log is empty)"
    except OSError:
        return "(no log)"


def _remove(folder: str) -> None:
    for name in ("server", "server.log"):
        try:
            os.unlink(os.path.join(folder, name))
        except FileNotFoundError:
            pass
    try:
        os.rmdir(folder)
    except FileNotFoundError:
        pass


def _receive(connection: socket.socket, size: int, deadline: float | None) -> bytes:
    """`size` bytes, or TimeoutExpired past the deadline, or OSError if the other end closed first."""
    data = b""
    while len(data) < size:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired("wizard fork server", 0)
            connection.settimeout(left)
        try:
            chunk = connection.recv(size - len(data))
        except TimeoutError:
            raise subprocess.TimeoutExpired("wizard fork server", 0) from None
        finally:
            connection.settimeout(None)
        if not chunk:
            raise OSError("the wizard fork server went away")
        data += chunk
    return data


def _pid_if_sent(connection: socket.socket) -> int | None:
    try:
        data = connection.recv(_PID.size, socket.MSG_DONTWAIT | socket.MSG_PEEK)
    except OSError:
        return None
    return _PID.unpack(data)[0] if len(data) == _PID.size else None


def _read_to_end(fd: int, deadline: float) -> bytes:
    chunks = []
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            if not selector.select(max(0.0, deadline - time.monotonic())):
                raise OSError(f"not ready within {START_S:.0f} s")
            chunk = os.read(fd, 65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


def _communicate(
    connection: socket.socket,
    stdin_write: int,
    out_read: int,
    err_read: int,
    input: bytes | None,
    pid: int,
    deadline: float | None,
    mine: set[int],
) -> tuple[bytes, bytes, bytes, bool]:
    """Feed the input and read both outputs and the server's word on the child, as subprocess.run does: to the
    outputs' end and the child's, or to the deadline, where the child (not yet reaped) is killed."""
    pending = input or b""
    outputs: dict[int, list[bytes]] = {out_read: [], err_read: []}
    status: list[bytes] = []
    ended = timed_out = False
    with selectors.DefaultSelector() as selector:
        for fd in (out_read, err_read):
            selector.register(fd, selectors.EVENT_READ)
        selector.register(connection, selectors.EVENT_READ)
        if pending:
            os.set_blocking(stdin_write, False)
            selector.register(stdin_write, selectors.EVENT_WRITE)
        else:
            _close(stdin_write, mine)
        while True:
            open_outputs = any(fd in mine for fd in (out_read, err_read))
            if ended and (not open_outputs or timed_out):
                break
            left = None if deadline is None or timed_out else deadline - time.monotonic()
            if left is not None and left <= 0:
                timed_out = True
                if ended:
                    break  # reaped already: its outputs are held by a process it started, as subprocess.run sees
                _kill(pid)
                if stdin_write in mine:
                    selector.unregister(stdin_write)
                    _close(stdin_write, mine)
                continue
            for key, _ in selector.select(left):
                fd = key.fd
                if fd == stdin_write:
                    try:
                        written = os.write(stdin_write, pending[:65536])
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:
                        written = len(pending)
                    pending = pending[written:]
                    if not pending:
                        selector.unregister(stdin_write)
                        _close(stdin_write, mine)
                elif fd == connection.fileno():
                    chunk = connection.recv(65536)
                    if chunk:
                        status.append(chunk)
                    else:
                        ended = True
                        selector.unregister(connection)
                        if not status:  # the server went away: its child would run on, its parent gone
                            _kill(pid)
                            break
                else:
                    chunk = os.read(fd, 65536)
                    if chunk:
                        outputs[fd].append(chunk)
                    else:
                        selector.unregister(fd)
                        _close(fd, mine)
    return b"".join(outputs[out_read]), b"".join(outputs[err_read]), b"".join(status), timed_out


def _close(fd: int, mine: set[int]) -> None:
    mine.discard(fd)
    os.close(fd)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def pytest_sessionfinish() -> None:
    """This process's tests are done: stop its servers before the run looks for leftovers."""
    stop()


# The server: `python tests/wizard_forks.py LISTENER_FD ALIVE_FD READY_FD`, in its folder (see _Server.start)


INTERRUPTED = -1
"""_run_main's word for an uncaught KeyboardInterrupt, already printed."""


class _ChildExit(Exception):  # noqa: N818 - not an error: how a child leaves the server's frames
    """Raised in a forked child to unwind the server's frames: the interpreter then exits as after a script."""

    def __init__(self, code: int) -> None:
        self.code = code


_CHANGED_AT_START: dict[str, str] = {}
"""What the interpreter set in its own environment as it started (LC_CTYPE where it coerced a C locale): the
same settings make the same changes, so every child gets them."""


def _serve(listener_fd: int, alive_fd: int, ready_fd: int) -> None:
    import importlib

    server_pid = os.getpid()
    folder = os.getcwd()
    try:
        with open("/proc/self/environ", "rb") as environ:
            pairs = (item.split(b"=", 1) for item in environ.read().split(b"\0") if b"=" in item)
            given = {os.fsdecode(key): os.fsdecode(value) for key, value in pairs}
        _CHANGED_AT_START.update({k: v for k, v in os.environ.items() if given.get(k) != v})
        sys.path[0] = folder  # an empty folder, not tests/: nothing there can stand in for what it imports
        for name in PRELOAD:
            importlib.import_module(name)
        origins = {}
        for name, module in list(sys.modules.items()):
            spec = getattr(module, "__spec__", None)
            if "." in name or spec is None or not spec.has_location:
                continue  # a submodule, or built in or frozen: found before any folder is searched
            locations = spec.submodule_search_locations
            origins[name] = list(locations)[0] if locations else spec.origin
        with os.fdopen(ready_fd, "w") as ready:
            json.dump(origins, ready)
        listener = socket.socket(fileno=listener_fd)
        with selectors.DefaultSelector() as selector:
            selector.register(listener, selectors.EVENT_READ)
            selector.register(alive_fd, selectors.EVENT_READ)
            while True:
                if any(key.fd == alive_fd for key, _ in selector.select()):
                    return  # the worker closed its end (stopped, or gone)
                connection, _ = listener.accept()
                try:
                    _serve_one(connection, listener, alive_fd)
                except OSError:
                    pass  # the worker gave up on this call (a timeout, or it ended)
                finally:
                    connection.close()
    finally:
        if os.getpid() == server_pid:
            _remove(folder)


def _serve_one(connection: socket.socket, listener: socket.socket, alive_fd: int) -> None:
    header, fds, _, _ = socket.recv_fds(connection, _HEADER.size, 3)
    if len(header) < _HEADER.size or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        return
    try:
        (size,) = _HEADER.unpack(header)
        request = json.loads(_receive(connection, size, None))
    except (OSError, ValueError):
        for fd in fds:
            os.close(fd)
        raise OSError("a request cut short") from None
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        pid = os.fork()
    except OSError:
        for fd in fds:
            os.close(fd)
        raise
    if pid == 0:
        listener.close()
        connection.close()
        os.close(alive_fd)
        raise _ChildExit(_child(request, fds))
    for fd in fds:
        os.close(fd)
    try:
        connection.sendall(_PID.pack(pid))
    except OSError:
        _kill(pid)  # the worker is gone or gave up: nobody would read what it does
    _, status, usage = os.wait4(pid, 0)
    returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    connection.sendall(json.dumps({"returncode": returncode, "cpu": usage.ru_utime + usage.ru_stime}).encode())


def _child(request: dict[str, Any], fds: list[int]) -> int:
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        _set_limits({which: (soft, hard) for which, soft, hard in request["limits"]})
        os.umask(request["umask"])
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ.update(_CHANGED_AT_START)
        _fresh_stdio()
        time.tzset()
        sys.path[0] = os.getcwd()  # as `python -m` puts it
        sys.argv = ["-m", *request["args"]]
    except BaseException as error:  # the child could not be set up: say so where the test looks
        os.write(2, f"tests.wizard_forks: {error!r}\n".encode())
        os._exit(70)
    return _run_main(request["module"])


def _fresh_stdio() -> None:
    """Standard streams over the child's own descriptors, made as the interpreter makes them at its start: the
    server's were made for its /dev/null and log file (whether they are ttys, whether they can seek)."""
    for fd, name, mode in ((0, "stdin", "rb"), (1, "stdout", "wb"), (2, "stderr", "wb")):
        old = getattr(sys, name)
        raw = io.FileIO(fd, mode, closefd=False)
        raw.name = f"<{name}>"  # type: ignore[misc]  (the interpreter names them so too)
        unbuffered = old.write_through  # -u or PYTHONUNBUFFERED: all three write through, stdout and stderr raw
        if unbuffered and mode == "wb":
            buffer: Any = raw
        else:
            buffer = io.BufferedReader(raw) if mode == "rb" else io.BufferedWriter(raw)
        stream = io.TextIOWrapper(
            buffer,
            encoding=old.encoding,
            errors=old.errors,
            newline="\n",
            line_buffering=not unbuffered and (raw.isatty() or fd == 2),
            write_through=unbuffered,
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _run_main(module: str) -> int:
    """The module as `python -m` runs it (a package's __main__); what the interpreter does with an exception."""
    try:
        main = types.ModuleType("__main__")  # a fresh namespace, not the server's
        main.__builtins__ = builtins  # type: ignore[attr-defined]
        sys.modules["__main__"] = main
        runpy._run_module_as_main(module, alter_argv=True)  # what `python -m` itself calls
        return 0
    except SystemExit as exit:
        return _exit_code(exit.code)
    except KeyboardInterrupt as interrupt:
        sys.excepthook(KeyboardInterrupt, interrupt, _from_runpy_on(interrupt))
        return INTERRUPTED
    except BaseException as error:
        sys.excepthook(type(error), error, _from_runpy_on(error))
        return 1


def _from_runpy_on(error: BaseException) -> types.TracebackType | None:
    """The traceback without this module's frame, as the interpreter prints it for `python -m`."""
    if error.__traceback__ is not None:
        error.__traceback__ = error.__traceback__.tb_next
    return error.__traceback__


def _exit_code(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    print(value, file=sys.stderr)
    return 1


if __name__ == "__main__":
    _SERVER = sys.modules["__main__"]  # the server's own module stays alive while a child replaces __main__
    try:
        _serve(*map(int, sys.argv[1:4]))
    except _ChildExit as leaving:
        if leaving.code == INTERRUPTED:  # the interpreter's own way: finalize, then end as killed by SIGINT
            sys.excepthook = lambda *exc_info: None  # printed already, from runpy's frame on
            raise KeyboardInterrupt from None
        sys.exit(leaving.code)  # the interpreter's own exit: atexit, threads, finalization, flushed streams
