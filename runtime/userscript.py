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

import faulthandler
import os
import runpy
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime import events, report

USAGE = "usage: python -m runtime.userscript SCRIPT [ARGS...]"
# torch.distributed.launch puts this before the module's own arguments: it belongs to the script
LOCAL_RANK_FLAGS = ("--local-rank=", "--local_rank=")
INTERRUPTED = 128 + signal.SIGINT


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

    A leading --local-rank=N (torch.distributed.launch) goes to the script only
    where the script declares that option: a script that reads LOCAL_RANK from
    the environment (the launcher sets it too) would refuse an argument it does
    not know.
    """
    leading = [arg for arg in argv[:1] if arg.startswith(LOCAL_RANK_FLAGS)]
    rest = list(argv[len(leading) :])
    if not rest:
        raise SystemExit(f"runtime.userscript: no script given\n{USAGE}")
    if leading and not declares_local_rank(rest[0]):
        leading = []
    return rest[0], [*leading, *rest[1:]]


def declares_local_rank(script: str) -> bool:
    """Whether the script's text names the --local-rank (or --local_rank) option; True where it cannot be read."""
    try:
        text = Path(script).read_bytes()
    except OSError:
        return True  # run_script names the script that cannot be opened
    return b"--local-rank" in text or b"--local_rank" in text


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
    """The status `sys.exit(code)` ends the process with: 0 for None, 1 for a message."""
    if stop.code is None:
        return 0
    return stop.code if isinstance(stop.code, int) else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Record the rank, run the script, record how it ended; return the exit status."""
    script, args = split_arguments(sys.argv[1:] if argv is None else argv)
    who = rank_from_env()
    run_dir = events.resolve_run_dir(None, Path.cwd())
    log = events.tee_output(run_dir, who.rank)
    faulthandler.enable(
        all_threads=True
    )  # a native crash leaves its Python stack in the log
    recorder = events.EventWriter(run_dir, who.rank)
    recorder.started(
        local_rank=who.local_rank,
        node=who.node,
        device=device_label(who.local_rank),
        world_size=who.world_size,
        script=script,
    )
    recorder.start_heartbeat(events.heartbeat_interval(), output_silence(log))
    try:
        run_script(script, args)
    except SystemExit as stop:
        report.flush()
        code = exit_code(stop)
        if code == 0:
            recorder.finished(exit_code=0)
        else:
            recorder.error(script_frames(stop, script), exit_code=code)
        recorder.close()
        raise
    except KeyboardInterrupt as interrupt:
        report.flush()
        recorder.error(script_frames(interrupt, script), exit_code=INTERRUPTED)
        recorder.close()
        raise
    except BaseException as error:  # noqa: BLE001 - recorded, shown as Python would, and exits 1
        report.flush()
        error = script_frames(error, script)
        recorder.error(error, exit_code=1)
        recorder.close()
        sys.excepthook(type(error), error, error.__traceback__)
        return 1
    report.flush()
    recorder.finished(exit_code=0)
    recorder.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
