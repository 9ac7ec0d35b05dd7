"""The root cause a failing job is judged by, when the last look came just before a rank was killed.

A rank killed with SIGKILL says nothing; its peer's next collective fails with
"connection reset by peer", an error that names no cause of its own. On a
loaded host the peer's launcher can exit before the runner looks for gone
processes again: the runner must still name the killed rank, not its peer.
Real processes: the killed rank is a child of this test that has ended.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from wizard.monitor.state import JobState
from wizard.run.intake import Intake

RESET = (
    "[gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:10165: Connection reset by peer. "
    "This is typically caused by a remote worker hanging or bugs in the application."
)


def write_event(run_dir: Path, rank: int, **event: object) -> None:
    """Append one event to rank `rank`'s events file, as the runtime writes it."""
    events = run_dir / "events"
    events.mkdir(exist_ok=True)
    with (events / f"rank-{rank}.jsonl").open("a") as handle:
        handle.write(json.dumps({"schema": 1, "rank": rank, "time": time.time(), **event}) + "\n")


def ended_process() -> int:
    """The pid of a process of this host that has ended (and was reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=60)
    return child.pid


def test_a_rank_gone_since_the_last_look_is_the_root_cause_not_its_peers_reset(tmp_path: Path) -> None:
    killed = ended_process()
    write_event(tmp_path, 0, event="started", pid=os.getpid(), node=0, local_rank=0, world_size=2)
    write_event(tmp_path, 1, event="started", pid=killed, node=1, local_rank=0, world_size=2)
    intake = Intake(JobState(2), tmp_path)
    intake.local_ranks = {0, 1}
    intake.ingest()  # the last look: both started, neither failed
    write_event(tmp_path, 0, event="error", pid=os.getpid(), type="RuntimeError", message=RESET, traceback="")

    cause = intake.settled_root_cause(time.time())

    assert cause is not None
    assert (cause.rank, cause.kind) == (1, "vanished"), cause
    assert cause.summary.startswith(f"its process {killed} vanished without an error")
    peer = [failure for failure in intake.state.failures() if failure.rank == 0]
    assert peer and peer[0].secondary, "the peer's reset is still reported, as caused by another rank"


def test_a_rank_that_said_it_finished_and_ended_is_no_failure(tmp_path: Path) -> None:
    done = ended_process()
    write_event(tmp_path, 0, event="started", pid=os.getpid(), node=0, local_rank=0, world_size=2)
    write_event(tmp_path, 1, event="started", pid=done, node=1, local_rank=0, world_size=2)
    intake = Intake(JobState(2), tmp_path)
    intake.local_ranks = {0, 1}
    intake.ingest()
    write_event(tmp_path, 1, event="finished", pid=done, step=8, exit_code=0)
    write_event(tmp_path, 0, event="error", pid=os.getpid(), type="ValueError", message="bad batch", traceback="")

    cause = intake.settled_root_cause(time.time())

    assert cause is not None and (cause.rank, cause.kind) == (0, "error"), cause
    assert [failure.rank for failure in intake.state.failures()] == [0]
