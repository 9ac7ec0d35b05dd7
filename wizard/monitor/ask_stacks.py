"""`npu-wizard monitor RUN --stacks`: ask the running `npu-wizard run` where every rank is, and say it.

The monitor is not the status server: only the runner can ask the ranks. So
the monitor leaves an ask in the run folder (RUN/hang/ask, written to a new
file and moved into place), the runner takes it on its next tick, collects
every rank's stack and collectives into RUN/hang/ (wizard/run/hang_stacks.py)
and writes hang/collected.json with the ask's id; the monitor waits for that,
at most ASK_WAIT_S with a line of progress, and prints the verdict. An ask
never replaces one the runner has not taken yet: a second monitor waits for
that one's collection instead.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from wizard.atomic_files import write_json
from wizard.errors import TargetError
from wizard.monitor import procs
from wizard.monitor.attach import RunFolder
from wizard.monitor.hang_verdict import hang_summary
from wizard.monitor.run_files import RunFileError, read_json_object
from wizard.monitor.terminal import PrintableOut

HANG_DIR, ASK_FILE, COLLECTED = "hang", "ask", "collected.json"  # as wizard/run/hang_stacks.py names them
ASK_WAIT_S = 60.0  # the runner waits 10 s for the ranks' answers, then probes those that did not answer
PROGRESS_S = 5.0
ASK_TRIES = 100  # an ask in place with no id to wait for, unread this often: the runner is not taking it


class StacksNotCollected(TargetError):
    """The runner of the run is gone, or did not collect the stacks in time."""


def ask_stacks(
    folder: RunFolder,
    out: TextIO,
    *,
    wait_s: float = ASK_WAIT_S,
    clock: Callable[[], float] = time.monotonic,
) -> Path:
    """Have the run's runner collect every rank's stack; print the verdict; return the hang/ folder."""
    out = PrintableOut(out)  # the verdict quotes the ranks' stacks: anyone's text, shown escaped
    run_dir = folder.run_dir
    pid = folder.runner_pid
    if pid is None or not procs.is_alive(pid) or not procs.is_runner(pid):
        raise StacksNotCollected(
            f"{run_dir}: no `npu-wizard run` of this run is running on this host, and only it can ask the ranks "
            "(a finished run's stacks, if a hang collected them, are in its hang/ folder)"
        )
    hang = run_dir / HANG_DIR
    if hang.is_symlink() or (hang.exists() and not hang.is_dir()):
        raise StacksNotCollected(f"{hang} is no folder: move it away, then ask again")
    hang.mkdir(exist_ok=True)
    ask_id, ours = _leave_ask(hang)
    if ours:
        said = f"asked the runner (pid {pid}) for every rank's stack"
    else:
        said = f"another ask for the stacks is in progress: waiting for its answer from the runner (pid {pid})"
    print(f"{said}; waiting at most {wait_s:.0f}s", file=out, flush=True)
    started = clock()
    said = started
    while not _collected(hang, ask_id):
        now = clock()
        if now - started > wait_s:
            raise StacksNotCollected(
                f"{run_dir}: the runner did not collect the ranks' stacks within {wait_s:.0f}s "
                f"(is it paused? its ask is still in {hang / ASK_FILE})"
            )
        if not procs.is_alive(pid):
            raise StacksNotCollected(f"{run_dir}: the runner (pid {pid}) ended before it collected the stacks")
        if now - said >= PROGRESS_S:
            print(f"  waiting for the ranks' answers ({now - started:.0f}s)", file=out, flush=True)
            said = now
        time.sleep(0.2)
    summary = hang_summary(run_dir)
    if summary is not None:
        print(f"WHERE EACH RANK IS: {summary['text']}", file=out)
        for problem in summary["problems"]:
            print(f"  {problem}", file=out)
    print(f"stacks and collectives of every rank in {hang}", file=out)
    return hang


def _leave_ask(hang: Path) -> tuple[str, bool]:
    """Put a new ask in hang/ask unless one waits there; (the id to wait for, whether the ask is ours)."""
    ask = hang / ASK_FILE
    for _ in range(ASK_TRIES):
        ask_id = secrets.token_hex(8)
        mine = hang / f".{ASK_FILE}.{ask_id}"
        write_json(mine, {"id": ask_id, "time": time.time()})
        try:
            os.link(mine, ask)  # never replaces: an ask in place stays, whole
            return ask_id, True
        except FileExistsError:
            pending = _pending_id(hang)
            if pending is not None:
                return pending, False
            if ask.is_symlink() or (ask.exists() and not ask.is_file()):
                raise StacksNotCollected(f"{ask} is no regular file: move it away, then ask again") from None
        finally:
            mine.unlink()
        # the runner took the other ask between the link and the read: ask again
        time.sleep(0.05)
    raise StacksNotCollected(f"{ask} holds an ask with no id the runner has not taken: move it away, then ask again")


def _pending_id(hang: Path) -> str | None:
    """The id of the ask waiting in hang/ask; None when the runner took it meanwhile (or it has none)."""
    try:
        ask = read_json_object(hang / ASK_FILE)
    except RunFileError:
        return None
    ask_id = (ask or {}).get("id")
    return ask_id if isinstance(ask_id, str) and ask_id.isalnum() else None


def _collected(hang: Path, ask_id: str) -> bool:
    try:
        collected = read_json_object(hang / COLLECTED) or {}
    except RunFileError:
        return False
    return collected.get("asked_id") == ask_id
