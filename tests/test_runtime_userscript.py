"""runtime.userscript runs a user's own script unchanged as one rank, and records the rank as train.py would."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import runtime
from runtime.events import read_events
from tests.runs import free_port, kinds, wait_for

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent / "user_scripts"
TORCHRUN = str(Path(sys.executable).parent / "torchrun")


def shim_env(run_dir: Path, **extra: str) -> dict[str, str]:
    """What a launch script gives a rank: the run folder, heartbeats, runtime/ on PYTHONPATH."""
    return {
        **os.environ,
        "NPU_WIZARD_RUN_DIR": str(run_dir),
        "NPU_WIZARD_HEARTBEAT_S": "0.2",
        "PYTHONPATH": str(REPO),
        **extra,
    }


def run_shim(tmp_path: Path, script: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`python -m runtime.userscript script.py ARGS` from `tmp_path`, with `script` as the script's text."""
    (tmp_path / "script.py").write_text(textwrap.dedent(script))
    return subprocess.run(
        [sys.executable, "-m", "runtime.userscript", *args],
        cwd=tmp_path,
        env=shim_env(tmp_path / "run", **env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def rank_events(tmp_path: Path, rank: int = 0) -> list[dict]:
    return read_events(tmp_path / "run")[rank]


def test_the_script_runs_as_python_would_run_it(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    script = """
        import sys
        print(repr((__name__, __file__, sys.argv, sys.path[0])))
    """
    (tmp_path / "src" / "script.py").write_text(textwrap.dedent(script))
    result = run_shim(tmp_path, "", "src/script.py", "--epochs", "1", "a b")
    assert result.returncode == 0, result.stderr
    expected = ("__main__", "src/script.py", ["src/script.py", "--epochs", "1", "a b"], str(tmp_path / "src"))
    assert result.stdout.strip() == repr(expected)
    assert (tmp_path / "run" / "logs" / "rank-0.log").read_text().strip() == repr(expected)


RUNTIME = Path(runtime.__file__).resolve().parent
PARSES_LOCAL_RANK = """
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("{option}", type=int, default=-1)
    parser.add_argument("--x", action="store_true")
    print("local rank", parser.parse_args().local_rank)
"""


# torch 2 says --local-rank; scripts written for older torch declare only --local_rank, which argparse
# would not match with --local-rank
@pytest.mark.parametrize("option", ["--local-rank", "--local_rank"])
def test_torch_launch_local_rank_reaches_a_script_that_declares_it_in_its_spelling(tmp_path: Path, option: str) -> None:
    result = run_shim(
        tmp_path, textwrap.dedent(PARSES_LOCAL_RANK.format(option=option)), "--local-rank=1", "script.py", "--x"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "local rank 1"


def test_torch_launch_local_rank_reaches_a_script_whose_options_are_declared_beside_it(tmp_path: Path) -> None:
    (tmp_path / "options").mkdir()
    (tmp_path / "options" / "cli.py").write_text(textwrap.dedent(PARSES_LOCAL_RANK.format(option="--local-rank")))
    result = run_shim(tmp_path, "import sys; print(sys.argv)", "--local-rank=1", "script.py", "--x")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['script.py', '--local-rank=1', '--x']"


def test_a_fifo_named_like_a_module_beside_the_script_is_never_waited_on(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.py")  # before: opening it to look for --local-rank waited for a writer forever
    (tmp_path / "options").mkdir()
    (tmp_path / "options" / "cli.py").write_text(textwrap.dedent(PARSES_LOCAL_RANK.format(option="--local-rank")))
    result = run_shim(tmp_path, "import sys; print(sys.argv)", "--local-rank=1", "script.py")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['script.py', '--local-rank=1']"


# beside the project's runtime/, as in a rendered project: its own mention of the option does not count
@pytest.mark.parametrize("beside", ["alone", "in-a-project"])
def test_torch_launch_local_rank_is_left_out_for_a_script_that_reads_the_environment(
    tmp_path: Path, beside: str
) -> None:
    if beside == "in-a-project":
        shutil.copytree(RUNTIME, tmp_path / "runtime", ignore=shutil.ignore_patterns("__pycache__"))
    code = """
        import argparse, os
        parser = argparse.ArgumentParser()
        parser.add_argument("--x", action="store_true")
        parser.parse_args()
        print("local rank", os.environ["LOCAL_RANK"])
    """
    result = run_shim(tmp_path, textwrap.dedent(code), "--local-rank=1", "script.py", "--x", LOCAL_RANK="1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "local rank 1"
    assert (
        "runtime.userscript: torch.distributed.launch's --local-rank=1 is not passed to script.py: no --local-rank or "
        "--local_rank option in it or in the code beside it (LOCAL_RANK=1 is in its environment)"
    ) in result.stderr


def test_a_normal_end_is_a_finished_event(tmp_path: Path) -> None:
    result = run_shim(tmp_path, "print('hi')", "script.py", RANK="3", LOCAL_RANK="1", WORLD_SIZE="4", NODE_RANK="1")
    assert result.returncode == 0, result.stderr
    found = read_events(tmp_path / "run")
    assert list(found) == [3]
    started = kinds(found[3], "started")[0]
    assert (started["local_rank"], started["node"], started["world_size"]) == (1, 1, 4)
    assert started["pid"] > 0 and started["host"] and started["script"] == "script.py"
    assert kinds(found[3], "finished")[0]["exit_code"] == 0
    assert not kinds(found[3], "error")


@pytest.mark.parametrize(("call", "code"), [("sys.exit(0)", 0), ("sys.exit()", 0), ("sys.exit(3)", 3)])
def test_sys_exit_keeps_its_code(tmp_path: Path, call: str, code: int) -> None:
    result = run_shim(tmp_path, f"import sys\n{call}\n", "script.py")
    assert result.returncode == code
    ended = rank_events(tmp_path)[-1]
    if code == 0:
        assert ended["event"] == "finished"
    else:
        assert (ended["event"], ended["type"], ended["exit_code"]) == ("error", "SystemExit", 3)
        assert 'File "script.py", line 2, in <module>' in ended["traceback"]


def test_sys_exit_with_words_prints_them_and_exits_1(tmp_path: Path) -> None:
    result = run_shim(tmp_path, "import sys\nsys.exit('no data found')\n", "script.py")
    # the rank's stderr and stdout both pass through the tee into its log, and on to the console's stdout
    assert (result.returncode, result.stdout.strip()) == (1, "no data found")
    assert rank_events(tmp_path)[-1]["message"] == "no data found"


def test_an_exception_is_an_error_event_with_the_scripts_traceback(tmp_path: Path) -> None:
    script = """
        def load():
            raise ValueError("bad shard 7")

        load()
    """
    result = run_shim(tmp_path, script, "script.py")
    assert result.returncode == 1
    error = rank_events(tmp_path)[-1]
    assert (error["event"], error["type"], error["message"], error["exit_code"]) == (
        "error",
        "ValueError",
        "bad shard 7",
        1,
    )
    # as `python script.py` shows it: the script's frames only, on stderr and in the rank's log
    expected = 'Traceback (most recent call last):\n  File "script.py", line 5, in <module>'
    assert error["traceback"].startswith(expected)
    assert result.stdout.startswith(expected) and "runpy" not in result.stdout and "userscript" not in result.stdout
    assert "ValueError: bad shard 7" in (tmp_path / "run" / "logs" / "rank-0.log").read_text()


def test_a_missing_script_is_named(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "runtime.userscript", "nope.py"],
        cwd=tmp_path,
        env=shim_env(tmp_path / "run"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "cannot open 'nope.py'" in result.stdout
    assert rank_events(tmp_path)[-1]["type"] == "FileNotFoundError"


def test_the_shim_imports_no_torch() -> None:
    code = "import sys, runtime.userscript, runtime.report; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "False", result.stderr


def test_heartbeats_say_how_long_the_rank_has_been_silent(tmp_path: Path) -> None:
    # the script prints, stays silent until told to print again, then waits to be told to end
    script = """
        import pathlib, time
        def wait(name):
            deadline = time.monotonic() + 60
            while not pathlib.Path(name).exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        print("first", flush=True)
        wait("speak")
        print("second", flush=True)
        wait("end")
    """
    (tmp_path / "script.py").write_text(textwrap.dedent(script))
    shim = subprocess.Popen(
        [sys.executable, "-m", "runtime.userscript", "script.py"], cwd=tmp_path, env=shim_env(tmp_path / "run")
    )
    try:

        def beats() -> list[dict]:
            found = read_events(tmp_path / "run").get(0, [])
            return kinds(found, "heartbeat")

        silent = wait_for(lambda: [b for b in beats() if b.get("silent_s", 0) >= 1.0], 60, "a second of silence")
        log = tmp_path / "run" / "logs" / "rank-0.log"
        (tmp_path / "speak").touch()
        wait_for(lambda: "second" in log.read_text(), 60, "the second line")
        spoke_at = log.stat().st_mtime
        after = wait_for(lambda: [b for b in beats() if b["time"] > spoke_at + 0.05], 60, "a heartbeat after it")
        assert after[0]["silent_s"] < silent[0]["silent_s"]
        assert abs((after[0]["time"] - after[0]["silent_s"]) - spoke_at) < 0.05
    finally:
        (tmp_path / "end").touch()
        assert shim.wait(timeout=60) == 0


# A rank that raises, under torchrun: the shim records its error. A script run to its end through the shim under
# torchrun (and each other launcher) is test_script_launch's test_each_launcher_trains_the_tutorial_style_script...
@pytest.mark.slow
def test_torchrun_runs_a_tutorial_ddp_script_through_the_shim_that_records_a_ranks_error(tmp_path: Path) -> None:
    script = tmp_path / "ddp_tutorial.py"
    script.write_text((SCRIPTS / "ddp_tutorial.py").read_text())
    result = subprocess.run(
        [
            TORCHRUN,
            "--nnodes=1",
            "--nproc-per-node=2",
            "--master-addr=127.0.0.1",
            f"--master-port={free_port()}",
            "-m",
            "runtime.userscript",
            "ddp_tutorial.py",
            "--epochs",
            "2",
            "--fail-rank",
            "1",
        ],
        cwd=tmp_path,
        env=shim_env(tmp_path / "run"),
        capture_output=True,
        text=True,
        timeout=240,
    )
    found = read_events(tmp_path / "run")
    assert sorted(found) == [0, 1], result.stderr
    for rank, rank_events in found.items():
        started = kinds(rank_events, "started")[0]
        assert (started["world_size"], started["local_rank"], started["node"]) == (2, rank, 0)
        log = (tmp_path / "run" / "logs" / f"rank-{rank}.log").read_text()
        assert f"[rank {rank}] epoch 0 loss" in log
    assert result.returncode != 0
    error = kinds(found[1], "error")[0]
    assert (error["type"], error["exit_code"]) == ("RuntimeError", 1)
    assert error["message"] == "rank 1: the loss went wrong after epoch 0"
    assert 'File "ddp_tutorial.py"' in error["traceback"] and "in train" in error["traceback"]
    log = (tmp_path / "run" / "logs" / "rank-1.log").read_text()
    assert "RuntimeError: rank 1: the loss went wrong after epoch 0" in log


# what the process really returns decides: Python keeps an exit code's low 8 bits (sys.exit(256) ends with 0)
@pytest.mark.parametrize(
    ("call", "status"),
    [("sys.exit(256)", 0), ("sys.exit(-1)", 255), ("sys.exit(259)", 3), ("sys.exit(2**64)", 255)],
)
def test_an_exit_code_past_255_is_recorded_as_the_status_the_process_really_ends_with(
    tmp_path: Path, call: str, status: int
) -> None:
    result = run_shim(tmp_path, f"import sys\n{call}\n", "script.py")
    assert result.returncode == status
    found = rank_events(tmp_path)
    ended = found[-1]
    if status == 0:
        assert (ended["event"], ended["exit_code"]) == ("finished", 0)
    else:
        assert (ended["event"], ended["exit_code"]) == ("error", status)
    (warning,) = kinds(found, "warning")
    asked = eval(call.removeprefix("sys.exit"))  # noqa: S307 - the test's own literal
    assert warning["message"].startswith(f"script.py called sys.exit({asked}): the process ends with status {status} ")


# os._exit skips every handler: the rank used to say nothing and read as vanished (kill -9?)
@pytest.mark.parametrize(("code", "status"), [(0, 0), (3, 3), (256, 0)])
def test_os_exit_in_the_script_records_how_the_rank_ended(tmp_path: Path, code: int, status: int) -> None:
    script = f"""
        import os
        from runtime import report
        report.step(1, loss=0.5)
        os._exit({code})
    """
    result = run_shim(tmp_path, script, "script.py", NPU_WIZARD_REPORT_S="3600")
    assert result.returncode == status, result.stderr
    found = rank_events(tmp_path)
    assert kinds(found, "step")[-1]["step"] == 1
    ended = found[-1]
    if status == 0:
        assert (ended["event"], ended["exit_code"]) == ("finished", 0)
    else:
        assert (ended["event"], ended["type"], ended["exit_code"]) == ("error", "SystemExit", status)
        assert ended["message"] == f"script.py called os._exit({code})"


def test_a_child_the_script_forks_that_ends_with_os_exit_records_nothing(tmp_path: Path) -> None:
    """A DataLoader worker (a forked child) ends with os._exit: the rank, still running, must not read as ended."""
    script = """
        import os
        child = os.fork()
        if child == 0:
            os._exit(7)
        _, status = os.waitpid(child, 0)
        print("child", os.waitstatus_to_exitcode(status), flush=True)
    """
    result = run_shim(tmp_path, script, "script.py")
    assert (result.returncode, result.stdout.strip()) == (0, "child 7")
    assert [e["event"] for e in rank_events(tmp_path) if e["event"] in ("finished", "error")] == ["finished"]


# the option named in a comment, a docstring, a help text or a message declares nothing: before, any mention did,
# and torch.distributed.launch's --local-rank reached a script that refused it ("unrecognized arguments")
READS_THE_ENVIRONMENT = '''
    """Train. torch.distributed.launch passes --local_rank; this script reads LOCAL_RANK instead."""
    import argparse, os
    # no --local-rank option here: LOCAL_RANK is in the environment
    parser = argparse.ArgumentParser(epilog="older launchers pass --local_rank=N, newer ones --local-rank=N")
    parser.add_argument("--x", action="store_true", help="not --local_rank")
    parser.parse_args()
    print("local rank", os.environ["LOCAL_RANK"])
'''


@pytest.mark.parametrize("where", ["script", "beside"])
def test_torch_launch_local_rank_is_left_out_where_the_code_only_mentions_it(tmp_path: Path, where: str) -> None:
    if where == "beside":
        (tmp_path / "options").mkdir()
        (tmp_path / "options" / "cli.py").write_text('"""Reads --local_rank? No: see LOCAL_RANK."""\n# --local-rank\n')
        (tmp_path / "options" / "broken.py").write_text('parser.add_argument("--local_rank"\n')  # no Python
    result = run_shim(tmp_path, READS_THE_ENVIRONMENT, "--local-rank=1", "script.py", "--x", LOCAL_RANK="1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().splitlines()[-1] == "local rank 1"
    assert "--local-rank=1 is not passed to script.py" in result.stderr


def test_an_os_exit_call_that_raises_leaves_the_rank_recording(tmp_path: Path) -> None:
    """os._exit(2**40) raises OverflowError (no C int) and the script goes on: nothing is recorded as its end."""
    script = """
        import os
        from runtime import report
        try:
            os._exit(2**40)
        except OverflowError:
            print("still here", flush=True)
        report.step(3, loss=1.0)
    """
    result = run_shim(tmp_path, script, "script.py", NPU_WIZARD_REPORT_S="0")
    assert (result.returncode, result.stdout.strip()) == (0, "still here"), result.stderr
    ended = [(e["event"], e["step"]) for e in rank_events(tmp_path) if e["event"] in ("step", "finished", "error")]
    assert ended == [("step", 3), ("finished", 3)]
