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

import json
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from wizard.errors import TargetError
from wizard.monitor import procs
from wizard.monitor.attach import RunFolder
from wizard.monitor.hang_verdict import hang_summary
from wizard.monitor.run_files import JSON_LIMIT, RunFileError
from wizard.monitor.safe_folder import Folder, NotAFolder
from wizard.monitor.terminal import PrintableOut

HANG_DIR, ASK_FILE, COLLECTED = "hang", "ask", "collected.json"  # as wizard/run/hang_stacks.py names them
ASK_WAIT_S = 60.0  # the runner waits 10 s for the ranks' answers, then probes those that did not answer
PROGRESS_S = 5.0
ASK_TRIES = 100  # an ask in place with no id to wait for, unread this often: the runner is not taking it
ASK_LIMIT = 4096  # as the runner reads RUN/hang/ask (wizard/run/hang_stacks.py)


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
    # opened once, never through a link: the ask and the answers are read and written relative to it, so a
    # link put in its place after any check is never followed
    try:
        folder_of_hang = Folder.open(hang, make=True)
    except NotAFolder:
        raise StacksNotCollected(f"{hang} is no folder: move it away, then ask again") from None
    except OSError as error:
        raise StacksNotCollected(f"cannot make {hang}: {error.strerror or error}") from None
    with folder_of_hang:
        return _ask_and_wait(folder_of_hang, pid, out, wait_s, clock)


def _ask_and_wait(hang: Folder, pid: int, out: TextIO, wait_s: float, clock: Callable[[], float]) -> Path:
    """Leave the ask in the opened hang/ folder, wait for its collection, print the verdict; the folder's path."""
    run_dir = hang.path.parent
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
                f"(is it paused? its ask is still in {hang.path / ASK_FILE})"
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
    print(f"stacks and collectives of every rank in {hang.path}", file=out)
    return hang.path


def _leave_ask(hang: Folder) -> tuple[str, bool]:
    """Put a new ask in hang/ask unless one waits there; (the id to wait for, whether the ask is ours)."""
    for _ in range(ASK_TRIES):
        ask_id = secrets.token_hex(8)
        mine = f".{ASK_FILE}.{ask_id}"
        hang.write(mine, json.dumps({"id": ask_id, "time": time.time()}).encode())
        try:
            # never replaces: an ask in place stays, whole
            os.link(mine, ASK_FILE, src_dir_fd=hang.fd, dst_dir_fd=hang.fd, follow_symlinks=False)
            return ask_id, True
        except FileExistsError:
            pending = _pending_id(hang)
            if pending is not None:
                return pending, False
            if hang.mode(ASK_FILE) is not None and not hang.is_file(ASK_FILE):
                raise StacksNotCollected(
                    f"{hang.path / ASK_FILE} is no regular file: move it away, then ask again"
                ) from None
        finally:
            hang.remove(mine)
        # the runner took the other ask between the link and the read: ask again
        time.sleep(0.05)
    raise StacksNotCollected(
        f"{hang.path / ASK_FILE} holds an ask with no id the runner has not taken: move it away, then ask again"
    )


def _read_object(hang: Folder, name: str, limit: int) -> dict:
    """The JSON object in hang/NAME; {} where there is none, it is no JSON object, or no regular file."""
    try:
        data = hang.read(name, limit)
        found = json.loads(data) if data is not None else {}
    except (RunFileError, ValueError, RecursionError):
        return {}
    return found if isinstance(found, dict) else {}


def _pending_id(hang: Folder) -> str | None:
    """The id of the ask waiting in hang/ask; None when the runner took it meanwhile (or it has none)."""
    ask_id = _read_object(hang, ASK_FILE, ASK_LIMIT).get("id")
    return ask_id if isinstance(ask_id, str) and ask_id.isalnum() else None


def _collected(hang: Folder, ask_id: str) -> bool:
    return _read_object(hang, COLLECTED, JSON_LIMIT).get("asked_id") == ask_id
