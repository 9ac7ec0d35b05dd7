"""Run a training script that knows nothing of npu-wizard as one rank of the job.

    python -m runtime.userscript SCRIPT [ARGS...]

The launch scripts start this, from the project folder, where they would start
the generated train.py. It records the rank as train.py does: a `started` event
(pid, node, host), heartbeats that also say how long ago the rank last printed,
and its output copied into <run dir>/logs/rank-<R>.log. Then it runs SCRIPT
unchanged, as `python SCRIPT ARGS...` would: as __main__, with
sys.argv = [SCRIPT, *ARGS] and SCRIPT's folder first on sys.path. An exception
becomes an `error` event and the exit it would have caused anyway; a normal end
(or sys.exit(0)) a `finished` event. The script may call runtime.report for its
steps, loss and checkpoints. Nothing here imports torch: the script does.
"""

from __future__ import annotations

import ast
import faulthandler
import os
import runpy
import shlex
import signal
import stat
import sys
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from . import events, preemption, profile_window, report, stacks

USAGE = "usage: python -m runtime.userscript SCRIPT [ARGS...]"
# torch.distributed.launch puts this before the module's own arguments: it belongs to the script
LOCAL_RANK_FLAGS = ("--local-rank=", "--local_rank=")
# Where the script does not declare that option itself, this much of the code beside it is read for it
SCAN_FILES = 500
SCAN_BYTES = 1 << 20
INTERRUPTED = 128 + signal.SIGINT
# sys.exit() passes a C long to exit(): a code beyond one ends the process with 255
LONG_END = 1 << 63
C_INT = 1 << 31


@dataclass(frozen=True)
class ScriptRank:
    """Who this process is, as the launcher's environment says."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node: int


def rank_from_env(env: Mapping[str, str] = os.environ) -> ScriptRank:
    """RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE and the node (NODE_RANK or GROUP_RANK)."""
    rank = _int(env, "RANK", 0)
    local_rank = _int(env, "LOCAL_RANK", 0)
    world_size = _int(env, "WORLD_SIZE", 1)
    local_world_size = _int(env, "LOCAL_WORLD_SIZE", 0) or _int(
        env, "NPROC_PER_NODE", 1
    )
    node = _int(env, "NODE_RANK", -1)
    if node < 0:
        node = _int(env, "GROUP_RANK", rank // max(1, local_world_size))
    return ScriptRank(rank, local_rank, world_size, local_world_size, node)


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name, "").strip()
    return int(value) if value.isdigit() and value.isascii() else default


def device_label(local_rank: int, env: Mapping[str, str] = os.environ) -> str:
    """The rank's device as far as the environment tells, without importing torch."""
    requested = env.get("NPU_WIZARD_DEVICE", "")
    if requested == "cpu":
        return "cpu"
    if requested == "npu" or env.get("ASCEND_RT_VISIBLE_DEVICES"):
        return f"npu:{local_rank}"
    return "unknown"


def split_arguments(argv: Sequence[str]) -> tuple[str, list[str]]:
    """SCRIPT and its arguments.

    torch.distributed.launch puts --local-rank=N first. It goes to the script
    in the spelling the script's code declares (--local-rank, or the older
    --local_rank that argparse would otherwise refuse), and not at all where
    no such option is declared: a script that reads LOCAL_RANK from the
    environment (the launcher sets it too) would refuse an argument it does not
    know. Dropping it is said on stderr, in the rank's log.
    """
    leading = [arg for arg in argv[:1] if arg.startswith(LOCAL_RANK_FLAGS)]
    rest = list(argv[len(leading) :])
    if not rest:
        raise SystemExit(f"runtime.userscript: no script given\n{USAGE}")
    script = rest[0]
    if leading:
        value = leading[0].split("=", 1)[1]
        option = local_rank_option(script)
        if option is None:
            print(
                f"runtime.userscript: torch.distributed.launch's --local-rank={value} is not passed to {script}: "
                f"no --local-rank or --local_rank option in it or in the code beside it "
                f"(LOCAL_RANK={value} is in its environment)",
                file=sys.stderr,
                flush=True,
            )
            leading = []
        else:
            leading = [f"{option}={value}"]
    return script, [*leading, *rest[1:]]


def local_rank_option(script: str) -> str | None:
    """--local-rank or --local_rank, as the script (else the code in its folder, two levels down) declares it.

    Declared: a string in the code that is the option itself, as argparse's
    add_argument("--local_rank") has it; the option named in a comment or
    inside a longer string (help text, a message) is no declaration. None
    where nothing declares it; --local-rank where the script cannot be read
    or parsed (run_script says why).
    """
    path = Path(script)
    try:
        found = _declared_spellings(path.read_bytes())
    except OSError:
        found = None
    if found is None:
        return LOCAL_RANK_FLAGS[0][:-1]
    if not found:
        for module in _code_beside(path.resolve().parent):
            code = _read_module(module)
            if code is None:
                continue
            # a bigger file is data or generated code, not the script's options
            if len(code) <= SCAN_BYTES:
                found |= _declared_spellings(code) or set()
    # "--local-rank" sorts first: what the launcher says
    return min(found) if found else None


def _read_module(module: Path) -> bytes | None:
    """The first SCAN_BYTES + 1 bytes of the regular file `module`; None for anything else (a FIFO named
    x.py is never waited on) or where it cannot be read."""
    try:
        fd = os.open(module, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(os.dup(fd), "rb") as handle:
            return handle.read(SCAN_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)


def _declared_spellings(code: bytes) -> set[str] | None:
    """The spellings of the option that `code` holds as strings of their own; None where it is no Python."""
    options = {flag[:-1] for flag in LOCAL_RANK_FLAGS}
    if b"--local" not in code:  # most files: no parse needed
        return set()
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value in options
    }


def _code_beside(folder: Path) -> list[Path]:
    """Up to SCAN_FILES .py files in `folder` and two levels below.

    Hidden folders, links and npu-wizard's own runtime/ (which names the option itself) are left out.
    """
    ours = Path(__file__).resolve().parent
    found: list[Path] = []
    for top, folders, files in os.walk(folder):
        depth = len(Path(top).relative_to(folder).parts)
        kept = [
            name
            for name in folders
            if not name.startswith(".") and name != "__pycache__"
        ]
        folders[:] = (
            []
            if depth >= 2
            else sorted(name for name in kept if (Path(top) / name).resolve() != ours)
        )
        for name in sorted(files):
            module = Path(top) / name
            if name.endswith(".py") and not module.is_symlink():
                found.append(module)
                if len(found) >= SCAN_FILES:
                    return found
    return found


def output_silence(log: Path | None) -> Callable[[], dict[str, Any]]:
    """Heartbeat fields: `silent_s`, seconds since the rank's log last grew (nothing without a log)."""

    def fields() -> dict[str, Any]:
        if log is None:
            return {}
        try:
            modified = log.stat().st_mtime
        except OSError:
            return {}
        return {"silent_s": round(max(0.0, time.time() - modified), 3)}

    return fields


def run_script(script: str, args: Sequence[str]) -> None:
    """Run `script` as __main__ with sys.argv and sys.path as `python script args` sets them."""
    path = Path(script)
    if not path.is_file():
        raise FileNotFoundError(
            f"runtime.userscript: cannot open {script!r} (from {Path.cwd()}): no such file"
        )
    folder = str(path.resolve().parent)
    # `python -m` put the working folder first; `python SCRIPT` puts SCRIPT's folder there
    if sys.path and sys.path[0] in ("", os.getcwd()):
        sys.path[0] = folder
    else:
        sys.path.insert(0, folder)
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")


def script_frames(error: BaseException, script: str) -> BaseException:
    """`error` with the frames above the script's own (this module, runpy) left out."""
    names = {script, str(Path(script).resolve())}
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename not in names:
        tb = tb.tb_next
    return error.with_traceback(tb) if tb is not None else error


def exit_code(stop: SystemExit) -> int:
    """The status `sys.exit(code)` ends the process with: 0 for None, 1 for a message.

    As the process really ends: Python hands the code to C's exit(), which
    keeps its low 8 bits (sys.exit(256) ends with 0, sys.exit(-1) with 255),
    and a code beyond a C long ends with 255.
    """
    if stop.code is None:
        return 0
    return process_status(stop.code) if isinstance(stop.code, int) else 1


def process_status(code: int) -> int:
    """The exit status a process asking for `code` (sys.exit, os._exit) ends with, as its parent sees it."""
    return code & 0xFF if -LONG_END <= code < LONG_END else 0xFF


def record_os_exit(recorder: events.EventWriter, script: str) -> None:
    """Make os._exit(N) in the script record how the rank ended before the process goes.

    os._exit skips every handler, so a rank ending that way said nothing and
    read as vanished (kill -9?) though its launcher saw it exit 0. Only this
    process records: a child it forked (a DataLoader worker) ends as before.
    """
    real_exit = os._exit
    rank_pid = os.getpid()

    def exit_now(status: int) -> NoReturn:
        # os._exit takes a C int: anything else raises there, and the rank goes on
        if (
            os.getpid() == rank_pid
            and isinstance(status, int)
            and -C_INT <= status < C_INT
        ):
            try:
                _end_reports()
                code = process_status(status)
                if code == 0:
                    recorder.finished(exit_code=0)
                else:
                    ended = SystemExit(f"{script} called os._exit({status})")
                    recorder.error(ended, exit_code=code)
                recorder.close()
            finally:
                real_exit(status)
        real_exit(status)

    os._exit = exit_now


def _end_reports() -> None:
    """Write the step event not written yet, and the trace of a profile window still recording."""
    report.flush()
    profile_window.close()


def launcher_restart_args(environ: MutableMapping[str, str]) -> list[str]:
    """training.resume_args where torchrun or torch_npu_run restarted this rank itself (--max-restarts).

    A launcher's restart runs the same command line again: launch/run-node.sh added the resume
    arguments only where the whole start resumes, and leaves them in NPU_WIZARD_RESUME_ARGS
    otherwise. TORCHELASTIC_RESTART_COUNT, set by the launcher, counts its restarts; from the
    first on, this rank resumes: it gets the arguments and NPU_WIZARD_RESUMING=1.
    """
    restarts = environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    restarted = restarts.isdigit() and int(restarts) > 0
    if not restarted or environ.get("NPU_WIZARD_RESUMING") == "1":
        return []  # a first start, or one launch/run-node.sh gave the arguments already
    environ["NPU_WIZARD_RESUMING"] = "1"
    # run-node.sh quotes them: a value that does not split was not written by it
    words = environ.get("NPU_WIZARD_RESUME_ARGS", "")
    try:
        return shlex.split(words)
    except ValueError as error:
        print(
            f"npu-wizard: NPU_WIZARD_RESUME_ARGS={words!r} does not split into arguments ({error}), so this restart "
            "runs without training.resume_args; launch/run-node.sh writes them quoted: render the project again",
            file=sys.stderr,
            flush=True,
        )
        return []


def main(argv: Sequence[str] | None = None) -> int:
    """Record the rank, run the script, record how it ended; return the exit status."""
    script, args = split_arguments(sys.argv[1:] if argv is None else argv)
    args += launcher_restart_args(os.environ)
    who = rank_from_env()
    run_dir = events.resolve_run_dir(None, Path.cwd())
    log = events.tee_output(run_dir, who.rank)
    faulthandler.enable(
        all_threads=True
    )  # a native crash leaves its Python stack in the log
    recorder = events.EventWriter(run_dir, who.rank)
    # before the script makes its process group: the recorder is sized then or never
    stacks.install(run_dir, who.rank)
    recorder.started(
        local_rank=who.local_rank,
        node=who.node,
        device=device_label(who.local_rank),
        world_size=who.world_size,
        script=script,
    )
    recorder.start_heartbeat(events.heartbeat_interval(), output_silence(log))
    record_os_exit(recorder, script)
    # SIGUSR1/SIGTERM still end the script unless it asks report.should_stop()
    preemption.install(only_when_watched=True)
    try:
        run_script(script, args)
    except SystemExit as stop:
        _end_reports()
        code = exit_code(stop)
        if isinstance(stop.code, int) and code != stop.code:
            recorder.warning(
                f"{script} called sys.exit({stop.code}): the process ends with status {code} "
                "(an exit status keeps the code's low 8 bits; use 1-255 for a failure)",
                "exit",
            )
        if code == 0:
            recorder.finished(exit_code=0)
        elif code == preemption.PREEMPTED_EXIT and preemption.requested():
            recorder.preempted(
                step=recorder.step, signal=preemption.requested(), exit_code=code
            )
        else:
            recorder.error(script_frames(stop, script), exit_code=code)
        recorder.close()
        raise
    except KeyboardInterrupt as interrupt:
        _end_reports()
        recorder.error(script_frames(interrupt, script), exit_code=INTERRUPTED)
        recorder.close()
        raise
    except BaseException as error:  # noqa: BLE001 - recorded, shown as Python would, and exits 1
        _end_reports()
        error = script_frames(error, script)
        recorder.error(error, exit_code=1)
        recorder.close()
        sys.excepthook(type(error), error, error.__traceback__)
        return 1
    _end_reports()
    recorder.finished(exit_code=0)
    recorder.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
