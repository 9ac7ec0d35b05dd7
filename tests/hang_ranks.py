"""Real gloo ranks that put themselves where a hang leaves them, and the records they answer with.

`hang_records` starts tests/user_scripts/hang_train.py (copied as train.py) as one process per rank, each in
the role it is given (see that script), waits until every rank has written its record (runtime.stacks
snapshot, taken by a thread of the rank once its main thread is where its role puts it), SIGSTOPs the ranks
named in `stop` and writes for each the record a runner writes for a rank that did not answer (its state as
/proc says); for a `gil` rank, which cannot answer, that record holds the stack its faulthandler dumps on
SIGUSR2. Then it kills the job. What is left is a hang/ folder as the runner leaves it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.runs import free_port, wait_for
from wizard.monitor.hang_records import HangFolder, read_hang_folder

SCRIPT = Path(__file__).parent / "user_scripts" / "hang_train.py"
REPO = Path(__file__).parents[1]
# the jobs the verdict tests judge (tests/conftest.py): each one's roles, and what else hang_records is told
HANG_JOBS: dict[str, tuple[list[str], dict[str, Any]]] = {
    "late_and_stopped": (["reduce", "reduce", "late", "reduce"], {"stop": frozenset({3})}),
    "mismatched": (["reduce", "reduce", "barrier", "reduce_big"], {"after": (0, 1, 2)}),
    "loading": (["load", "load", "reduce", "reduce", "gil"], {"no_recorder": frozenset({2, 3})}),
}


def run_hang_jobs(base: Path) -> dict[str, HangFolder]:
    """Every job of HANG_JOBS at once (most of their time is waiting), each in base/NAME; their folders read back."""

    def run(name: str) -> HangFolder:
        roles, options = HANG_JOBS[name]
        hang_records(base / name, roles, **options)
        found = read_hang_folder(base / name)
        assert found is not None and found.problems == [], name
        return found

    with ThreadPoolExecutor(len(HANG_JOBS)) as pool:
        return dict(zip(HANG_JOBS, pool.map(run, HANG_JOBS), strict=True))


def line_of(marker: str) -> int:
    """The line of train.py that holds `marker` (a comment of hang_train.py)."""
    lines = SCRIPT.read_text().splitlines()
    return next(number for number, text in enumerate(lines, 1) if marker in text)


def process_state(pid: int) -> str:
    """The process state as /proc/PID/status says it: `T (stopped)`."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("State:"):
            return line.split(":", 1)[1].strip()
    return "?"


def hang_records(
    folder: Path,
    roles: list[str],
    *,
    no_recorder: frozenset[int] = frozenset(),
    after: tuple[int, ...] = (),
    stop: frozenset[int] = frozenset(),
    timeout: float = 180,
) -> Path:
    """Run one rank per role until each answered; return `folder`/hang with their records and collected.json."""
    hang = folder / "hang"
    hang.mkdir(parents=True)
    shutil.copy(SCRIPT, folder / "train.py")
    port = free_port()
    ranks = []
    for rank, role in enumerate(roles):
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "TORCH_FR_BUFFER_SIZE": "0" if rank in no_recorder else "2000",
            "AFTER": ",".join(map(str, after)) if role == "reduce_big" else "",
        }
        command = [sys.executable, "train.py", str(rank), str(len(roles)), role, str(hang)]
        ranks.append(
            subprocess.Popen(
                command, cwd=folder, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
        )
    try:

        def answered() -> bool:
            for rank, process in enumerate(ranks):
                if process.poll() is not None and not (hang / f"rank-{rank}.json").exists():
                    output = process.communicate()[0].decode(errors="replace")
                    raise AssertionError(f"rank {rank} ended ({process.returncode}) before it answered:\n{output}")
            return all((hang / f"rank-{rank}.json").exists() for rank in answering)

        answering = [rank for rank, role in enumerate(roles) if role != "gil"]
        wait_for(answered, timeout, "every rank's record")
        for rank in (rank for rank, role in enumerate(roles) if role == "gil"):
            dump = wait_for(
                lambda rank=rank: _fault_dump(ranks[rank].pid, hang / f"rank-{rank}.faulthandler"), 60, "a dump"
            )
            record = {
                "rank": rank,
                "answered": False,
                "host": socket.gethostname(),
                "pid": ranks[rank].pid,
                "state": process_state(ranks[rank].pid),
                "why": "no answer within 5s",
                "faulthandler": dump,
            }
            (hang / f"rank-{rank}.json").write_text(json.dumps(record))
        for rank in stop:
            os.kill(ranks[rank].pid, signal.SIGSTOP)
            wait_for(lambda rank=rank: process_state(ranks[rank].pid).startswith("T"), 30, f"rank {rank} to stop")
            record = {
                "rank": rank,
                "answered": False,
                "host": socket.gethostname(),
                "pid": ranks[rank].pid,
                "state": process_state(ranks[rank].pid),
                "why": "no answer within 5s",
                "faulthandler": None,
            }
            (hang / f"rank-{rank}.json").write_text(json.dumps(record))
            (hang / f"rank-{rank}.txt").unlink()
        collected = {"time": time.time(), "reason": "hang", "ranks": list(range(len(roles)))}
        (hang / "collected.json").write_text(json.dumps(collected))
    finally:
        for process in ranks:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.communicate()
    return hang


def _fault_dump(pid: int, path: Path) -> str | None:
    """faulthandler's dump of a rank stuck in load_batch, once complete; else SIGUSR2 asks for one (again)."""
    text = path.read_text() if path.exists() else ""
    newest = text.rpartition("Current thread")[2]
    if "in load_batch" in newest and "in <module>" in newest:
        return text
    os.kill(pid, signal.SIGUSR2)
    return None
