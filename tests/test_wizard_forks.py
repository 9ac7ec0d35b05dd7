"""tests.wizard_forks gives a test what a real `python -m ...` process would: held to real subprocesses here.

Each check runs the same command both ways, as a real subprocess and forked from a server, and compares what a
test can see: exit status, stdout, stderr, the files written, the child's sys.path, argv, folder, environment
and __main__ namespace; then the ways out (an uncaught exception, sys.exit with a message, a signal, a timeout)
and the server's own end.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tests import wizard_forks
from tests.leaks import NODE, marked

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "cpu-demo.yaml"

PROBE = """\
import json, os, stat, sys
print(json.dumps({
    "argv": sys.argv, "cwd": os.getcwd(), "path": sys.path, "env": dict(os.environ),
    "main": sorted(k for k in vars(sys.modules["__main__"]) if not k.startswith("__")),
    "name": __name__, "file": __file__, "stdin": sys.stdin.read(), "stdin_tty": sys.stdin.isatty(),
    "encoding": sys.stdout.encoding, "flags": [sys.flags.dont_write_bytecode, sys.flags.utf8_mode],
    "stdio": [
        [s.name, s.seekable(), s.line_buffering, s.write_through, s.errors, stat.S_IFMT(os.fstat(s.fileno()).st_mode)]
        for s in (sys.stdin, sys.stdout, sys.stderr)
    ],
    "own_environ": open("/proc/self/environ", "rb").read().count(b"NPU_WIZARD_FORKS_CHECK=yes"),
}))
"""


def both(
    module: str, args: list[str], **options: object
) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """The command as a real subprocess and forked, with the same options."""
    timeout = options.pop("timeout", 120)
    real = subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=timeout, **options
    )
    forked = wizard_forks.run_module(module, args, timeout=timeout, forked=True, **options)  # type: ignore[arg-type]
    return real, forked


def forked_wizard(args: list[str], **options: object) -> subprocess.CompletedProcess:
    """`python -m wizard ARGS`, always forked (never the first call's real subprocess)."""
    return wizard_forks.run_module("wizard", args, forked=True, **options)  # type: ignore[arg-type]


def probe_module(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.py").write_text(textwrap.dedent(text))
    return folder


def test_a_render_matches_a_real_process_in_status_output_and_files(tmp_path: Path) -> None:
    real, refused = both("wizard", ["--answers", str(EXAMPLE), "-o", "real"], cwd=tmp_path)
    assert real.returncode == 0, real.stderr
    # the fork came second: the folder exists, and it is refused; a real process refuses it in the same words
    refused_for_real = subprocess.run(real.args, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert (refused.returncode, refused.stdout, refused.stderr) == (
        refused_for_real.returncode,
        refused_for_real.stdout,
        refused_for_real.stderr,
    )
    assert refused.returncode == 1 and "already exists" in refused.stderr
    forked = forked_wizard(["--answers", str(EXAMPLE), "-o", "forked"], cwd=tmp_path)
    assert (forked.returncode, forked.stderr) == (real.returncode, real.stderr)
    assert forked.stdout == real.stdout.replace("real/", "forked/")
    written = {p.relative_to(tmp_path / "real"): p.read_bytes() for p in (tmp_path / "real").rglob("*") if p.is_file()}
    forked_files = {
        p.relative_to(tmp_path / "forked"): p.read_bytes() for p in (tmp_path / "forked").rglob("*") if p.is_file()
    }
    assert written == forked_files and len(written) > 20  # no rendered file holds the folder's name


@pytest.mark.parametrize(
    "args",
    [
        ["--version"],
        ["--bogus"],
        ["--answers", "missing.yaml", "-o", "out"],
        ["doctor", "--help"],
        ["update", "nowhere"],
    ],
)
def test_the_commands_answers_and_refusals_match_a_real_process(args: list[str], tmp_path: Path) -> None:
    real, forked = both("wizard", args, cwd=tmp_path)
    assert (forked.returncode, forked.stdout, forked.stderr) == (real.returncode, real.stdout, real.stderr)


def test_input_reaches_stdin_as_text_or_bytes(tmp_path: Path) -> None:
    answers = EXAMPLE.read_text()
    command = [sys.executable, "-m", "wizard", "--answers", "-", "-o", "real"]
    real = subprocess.run(command, input=answers, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    as_text = forked_wizard(["--answers", "-", "-o", "text"], input=answers, cwd=tmp_path)
    as_bytes = forked_wizard(["--answers", "-", "-o", "bytes"], input=answers.encode(), cwd=tmp_path, text=False)
    assert real.returncode == as_text.returncode == as_bytes.returncode == 0, real.stderr + as_text.stderr
    assert as_text.stdout == real.stdout.replace("real", "text")
    assert as_bytes.stdout == real.stdout.replace("real", "bytes").encode()
    assert (tmp_path / "text" / "cpu-demo" / "train.py").read_bytes() == (
        tmp_path / "real" / "cpu-demo" / "train.py"
    ).read_bytes()


def test_the_child_has_a_real_processs_argv_folder_path_environment_and_namespace(tmp_path: Path) -> None:
    folder = probe_module(tmp_path / "here", "probe", PROBE)
    env = {**os.environ, "NPU_WIZARD_FORKS_CHECK": "yes"}
    env.pop("HOME", None)
    real, forked = both("probe", ["one", "two words"], cwd=folder, env=env, input="typed\r\nline\n")
    assert real.returncode == forked.returncode == 0, real.stderr + forked.stderr
    assert real.stderr == forked.stderr == ""
    seen_real, seen_forked = json.loads(real.stdout), json.loads(forked.stdout)
    assert seen_real["own_environ"] == 1 and seen_forked["own_environ"] == 0  # the server's: a known difference
    seen_real.pop("own_environ"), seen_forked.pop("own_environ")
    assert seen_forked == seen_real
    assert seen_forked["argv"] == [str(folder / "probe.py"), "one", "two words"]
    assert seen_forked["env"]["NPU_WIZARD_FORKS_CHECK"] == "yes" and "HOME" not in seen_forked["env"]
    assert seen_forked["path"][0] == str(folder) and seen_forked["main"] == ["json", "os", "stat", "sys"]
    assert seen_forked["stdin"] == "typed\r\nline\n"  # stdin keeps its line ends, in a real process too


@pytest.mark.skipif(wizard_forks.OFF, reason="NPU_WIZARD_TEST_FORKS=0: no servers")
def test_other_interpreter_settings_get_a_server_started_with_them(tmp_path: Path) -> None:
    folder = probe_module(tmp_path / "here", "probe", PROBE)
    extra = probe_module(tmp_path / "extra", "unused", "")
    env = {**os.environ, "PYTHONPATH": str(extra), "LC_ALL": "C.UTF-8", "PYTHONUTF8": "1"}
    real, forked = both("probe", [], cwd=folder, env=env)
    seen_real, seen_forked = json.loads(real.stdout), json.loads(forked.stdout)
    assert seen_forked == seen_real and str(extra) in seen_forked["path"]
    assert seen_forked["flags"][1] == 1
    assert wizard_forks.interpreter_settings(env) in wizard_forks._servers


@pytest.mark.skipif(wizard_forks.OFF, reason="NPU_WIZARD_TEST_FORKS=0: no servers")
def test_settings_asked_for_once_get_a_real_process_and_a_server_from_the_second_call(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}  # settings no other test asks for
    settings = wizard_forks.interpreter_settings(env)
    first = wizard_forks.wizard(["--version"], env=env)
    assert settings not in wizard_forks._servers
    second = wizard_forks.wizard(["--version"], env=env)
    server = wizard_forks._servers[settings]
    assert server is not None and server.process.poll() is None
    assert first.stdout == second.stdout and first.returncode == second.returncode == 0


def test_the_ways_out_match_a_real_process(tmp_path: Path) -> None:
    folder = probe_module(
        tmp_path / "here",
        "ways",
        """\
        import atexit, os, signal, sys, threading, time
        atexit.register(lambda: print("atexit ran"))
        how = sys.argv[1]
        print("started", flush=True)
        if how == "raise":
            raise ValueError("a failure")
        if how == "message":
            sys.exit("a message")
        if how == "code":
            sys.exit(3)
        if how == "signal":
            os.kill(os.getpid(), signal.SIGTERM)
        if how == "interrupt":
            threading.Thread(target=lambda: (time.sleep(0.2), print("thread done"))).start()
            raise KeyboardInterrupt
        if how == "thread":
            threading.Thread(target=lambda: (time.sleep(0.2), print("thread done"))).start()
        """,
    )
    for how in ("raise", "message", "code", "signal", "interrupt", "thread", "none"):
        real, forked = both("ways", [how], cwd=folder)
        assert (forked.returncode, forked.stdout, forked.stderr) == (real.returncode, real.stdout, real.stderr), how
    assert real.stdout == "started\natexit ran\n"
    interrupted = both("ways", ["interrupt"], cwd=folder)[1]
    assert interrupted.returncode == -signal.SIGINT and "thread done" in interrupted.stdout


def test_a_timeout_kills_the_child_and_raises_as_subprocess_run_does(tmp_path: Path) -> None:
    folder = probe_module(
        tmp_path / "here",
        "slow",
        """\
        import os, sys, time
        print(os.getpid(), flush=True)
        sys.stderr.write("waiting\\n")
        time.sleep(600)
        """,
    )
    assert forked_wizard(["--version"]).returncode == 0  # the server is up: the 2 s are the child's alone
    # without the kill the call would end only when the child did, 600 s on, and raise nothing
    with pytest.raises(subprocess.TimeoutExpired) as raised:
        wizard_forks.run_module("slow", [], cwd=folder, timeout=2, forked=True)
    assert isinstance(raised.value.output, bytes)  # as subprocess.run gives it, text or not
    pid = int(raised.value.output.split()[0])
    assert raised.value.stderr == b"waiting\n"
    assert not Path(f"/proc/{pid}").exists()  # the server reaped it before it answered


def test_what_the_child_starts_carries_the_tests_mark(tmp_path: Path) -> None:
    folder = probe_module(
        tmp_path / "here",
        "starter",
        """\
        import subprocess
        child = subprocess.Popen(["sleep", "600"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print(child.pid)
        """,
    )
    forked = wizard_forks.run_module("starter", [], cwd=folder, timeout=60, forked=True)
    pid = int(forked.stdout)
    try:
        assert pid in marked(NODE, os.environ[NODE])  # tests/leaks.py finds it as this test's
    finally:
        os.kill(pid, signal.SIGKILL)


def test_the_server_ends_with_the_process_that_started_it(tmp_path: Path) -> None:
    script = f"""\
        import os, sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from tests import wizard_forks
        assert wizard_forks.run_module("wizard", ["--version"], forked=True).returncode == 0
        (server,) = [s for s in wizard_forks._servers.values()]
        print(server.process.pid, server.folder, flush=True)
        if sys.argv[1] == "stop":
            wizard_forks.stop()
            print("stopped", flush=True)
        else:
            time.sleep(600)
        """
    stopped = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), "stop"], capture_output=True, text=True, timeout=120
    )
    pid, folder = stopped.stdout.split()[:2]
    assert stopped.stdout.endswith("stopped\n") and not Path(folder).exists()
    assert not Path(f"/proc/{pid}").exists()

    owner = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), "sleep"], stdout=subprocess.PIPE, text=True
    )
    assert owner.stdout is not None
    pid, folder = owner.stdout.readline().split()[:2]
    owner.kill()  # no chance to stop its server: the server sees the pipe close and ends
    owner.wait()
    owner.stdout.close()
    deadline = time.monotonic() + 60
    while Path(f"/proc/{pid}").exists() and _state(Path(f"/proc/{pid}")) not in ("Z", "X", ""):
        assert time.monotonic() < deadline, f"the server {pid} outlived its owner"
        time.sleep(0.05)
    assert not Path(folder).exists()  # it removed its socket, its log and its folder itself


def test_resource_limits_hold_in_the_child_as_a_preexec_fn_sets_them(tmp_path: Path) -> None:
    folder = probe_module(
        tmp_path / "here",
        "limited",
        """\
        import resource
        print(resource.getrlimit(resource.RLIMIT_AS))
        try:
            block = bytearray(3 << 30)
        except MemoryError:
            print("MemoryError")
        """,
    )
    limit = (2 << 30, 2 << 30)
    real = subprocess.run(
        [sys.executable, "-m", "limited"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, limit),
    )
    forked = wizard_forks.run_module("limited", [], cwd=folder, limits={resource.RLIMIT_AS: limit}, forked=True)
    assert (forked.returncode, forked.stdout, forked.stderr) == (real.returncode, real.stdout, real.stderr)
    assert real.stdout == f"{limit}\nMemoryError\n"


def test_a_folder_that_would_shadow_what_the_server_imported_gets_a_real_process(tmp_path: Path) -> None:
    folder = probe_module(tmp_path / "here", "probe_json", "import json\nprint(json.__file__)\n")
    (folder / "json.py").write_text("raise SystemExit(7)  # the user's json.py, which a fresh process imports\n")
    (folder / "wizard").mkdir()  # a folder without __init__.py: a namespace portion, which shadows nothing
    real = subprocess.run([sys.executable, "-m", "probe_json"], cwd=folder, capture_output=True, timeout=120)
    for _ in range(2):  # the second call would be a fork, but for json.py
        again = wizard_forks.run_module("probe_json", [], cwd=folder, text=False, timeout=120)
        assert (again.returncode, again.stdout) == (real.returncode, real.stdout) == (7, b"")
    server = next(s for s in wizard_forks._servers.values() if s is not None) if wizard_forks._servers else None
    if server is not None:
        assert server.shadowed(str(folder))
        assert not server.shadowed(wizard_forks.ROOT)  # its wizard/ and runtime/ are the ones imported
        namespace = tmp_path / "namespace"
        (namespace / "wizard").mkdir(parents=True)  # no __init__: the installed wizard wins in a real process too
        assert not server.shadowed(str(namespace))
        (namespace / "wizard" / "__init__.pyc").write_bytes(b"")  # a sourceless package is a package
        assert server.shadowed(str(namespace))
        project = tmp_path / "project"
        (project / "runtime").mkdir(parents=True)
        (project / "runtime" / "__init__.py").write_text("")
        assert server.shadowed(str(project))  # a project's copy of runtime/ is another package


def test_a_relative_pythonpath_entry_gets_a_real_process(tmp_path: Path) -> None:
    folder = probe_module(tmp_path / "here", "probe", PROBE)
    probe_module(folder / "src", "extra", "")
    env = {**os.environ, "PYTHONPATH": "src:"}
    real = subprocess.run([sys.executable, "-m", "probe"], cwd=folder, env=env, capture_output=True, text=True)
    for _ in range(2):
        again = wizard_forks.run_module("probe", [], cwd=folder, env=env, timeout=120)
        assert json.loads(again.stdout)["path"] == json.loads(real.stdout)["path"]
    assert str(folder / "src") in json.loads(real.stdout)["path"]


def test_umask_and_time_zone_are_the_callers(tmp_path: Path) -> None:
    folder = probe_module(
        tmp_path / "here",
        "where",
        """\
        import os, time
        print(oct(os.umask(0)), time.strftime("%Z"), time.timezone)
        with open("file", "w") as f:
            pass
        """,
    )
    env = {**os.environ, "TZ": "Asia/Tokyo"}
    mask = os.umask(0o077)
    try:
        real, forked = both("where", [], cwd=folder, env=env)
    finally:
        os.umask(mask)
    assert forked.stdout == real.stdout and real.stdout.startswith("0o77 ")
    assert "-32400" in real.stdout or real.stdout.split()[1] != "UTC"  # the zone was read (tzdata present)


def test_large_input_and_output_do_not_stall(tmp_path: Path) -> None:
    folder = probe_module(tmp_path / "here", "echo", "import sys\nfor line in sys.stdin:\n    sys.stdout.write(line)\n")
    text = "a line of input\n" * 70_000  # about 1 MB each way: far past a pipe's buffer
    real, forked = both("echo", [], cwd=folder, input=text, timeout=120)
    assert forked.stdout == real.stdout == text


def test_a_timeout_ends_the_call_though_the_child_closed_its_output_or_a_process_it_started_holds_it(
    tmp_path: Path,
) -> None:
    folder = probe_module(
        tmp_path / "here",
        "holder",
        """\
        import os, subprocess, sys, time
        if sys.argv[1] == "closed":
            for fd in (0, 1, 2):
                os.close(fd)
        else:
            held = subprocess.Popen(["sleep", "600"])  # inherits stdout: the pipe stays open when this ends
            print(held.pid, flush=True)
        time.sleep(600)
        """,
    )
    assert forked_wizard(["--version"]).returncode == 0  # the server is up
    for how in ("closed", "held"):
        # without the deadline the call would end only when the child did, 600 s on, and raise nothing
        with pytest.raises(subprocess.TimeoutExpired) as raised:
            wizard_forks.run_module("holder", [how], cwd=folder, timeout=2, forked=True)
        if how == "held":
            os.kill(int(raised.value.output.split()[0]), signal.SIGKILL)


def test_the_interpreter_finalizes_the_child_as_it_would_a_script(tmp_path: Path) -> None:
    folder = probe_module(
        tmp_path / "here",
        "unclosed",
        """\
        import sys
        kept = open(sys.argv[1], "w")
        kept.write("written, never closed: the interpreter's finalization flushes it")
        """,
    )
    real, forked = (
        subprocess.run([sys.executable, "-m", "unclosed", "real.txt"], cwd=folder, timeout=120),
        wizard_forks.run_module("unclosed", ["forked.txt"], cwd=folder, forked=True, timeout=120),
    )
    assert real.returncode == forked.returncode == 0
    assert (folder / "forked.txt").read_text() == (folder / "real.txt").read_text() != ""


def test_run_and_monitor_are_real_processes_and_the_server_holds_no_tests_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NPU_WIZARD_FORKS_SECRET", "not for the server")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}  # settings of this test's own: a server started now
    assert wizard_forks.run_module("wizard", ["--version"], env=env, forked=True).returncode == 0
    server = wizard_forks._servers[wizard_forks.interpreter_settings(env)]
    assert server is not None
    environ = Path(f"/proc/{server.process.pid}/environ").read_bytes().split(b"\0")
    assert not any(item.startswith(b"NPU_WIZARD_FORKS_SECRET=") for item in environ)
    assert not any(item.startswith(f"{NODE}=".encode()) for item in environ)
    before = wizard_forks.forks_cpu()
    for command in (["run", str(tmp_path / "none")], ["monitor", str(tmp_path / "none")]):
        done = wizard_forks.wizard(command, env=env, timeout=120)
        assert done.returncode != 0 and "Traceback" not in done.stderr
    assert wizard_forks.forks_cpu() == before  # neither was forked


def test_an_environment_without_a_locale_gets_what_python_adds_to_it(tmp_path: Path) -> None:
    folder = probe_module(tmp_path / "here", "probe", PROBE)
    env = {"PATH": os.environ.get("PATH", os.defpath)}  # no LANG, no LC_*: Python coerces the C locale
    real, forked = both("probe", [], cwd=folder, env=env)
    seen_real, seen_forked = json.loads(real.stdout), json.loads(forked.stdout)
    assert seen_forked["env"] == seen_real["env"] and seen_forked["encoding"] == seen_real["encoding"]


def test_a_locale_python_changes_as_it_starts_is_changed_in_the_child_too(tmp_path: Path) -> None:
    folder = probe_module(tmp_path / "here", "probe", PROBE)
    env = {"PATH": os.environ.get("PATH", os.defpath), "LC_CTYPE": "C"}  # coerced to C.UTF-8, not only added
    real, forked = both("probe", [], cwd=folder, env=env)
    assert json.loads(forked.stdout)["env"] == json.loads(real.stdout)["env"]


def test_a_server_that_dies_mid_call_takes_its_child_with_it(tmp_path: Path) -> None:
    folder = probe_module(
        tmp_path / "here",
        "long",
        """\
        import os, sys, time
        with open("started.part", "w") as f:
            f.write(str(os.getpid()))
        os.replace("started.part", "started")
        time.sleep(600)
        open("done", "w").close()
        """,
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "own")}  # a server of this test's own
    assert wizard_forks.run_module("wizard", ["--version"], env=env, forked=True).returncode == 0
    server = wizard_forks._servers[wizard_forks.interpreter_settings(env)]
    assert server is not None

    def kill_the_server_once_the_child_runs() -> None:
        deadline = time.monotonic() + 120
        while not (folder / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        server.process.kill()

    killer = threading.Thread(target=kill_the_server_once_the_child_runs)
    killer.start()
    with pytest.raises(RuntimeError, match="went away"):
        wizard_forks.run_module("long", [], cwd=folder, env=env, forked=True, timeout=300)
    killer.join()
    child = Path(f"/proc/{(folder / 'started').read_text()}")
    deadline = time.monotonic() + 60
    while child.exists() and _state(child) not in ("Z", "X", ""):
        assert time.monotonic() < deadline, "the child ran on after its server died"
        time.sleep(0.05)
    assert not (folder / "done").exists()


def _state(proc: Path) -> str:
    try:
        return (proc / "stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return ""
