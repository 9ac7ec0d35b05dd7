"""`npu-wizard monitor RUN`: follow a run folder another process is running, or read a finished one."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from runtime.events import EventFollower
from wizard.errors import TargetError
from wizard.monitor import procs
from wizard.monitor.plain_lines import progress_block, restart_lines
from wizard.monitor.run_files import RegularFollower, events_files, read_head, read_json_object
from wizard.monitor.state import DEFAULT_HANG_AFTER, JobState
from wizard.monitor.summary_file import checked
from wizard.monitor.summary_text import (
    SUMMARY_FILE,
    failure_log_lines,
    format_summary,
    straggler_line,
    summarize,
)
from wizard.monitor.terminal import PrintableOut
from wizard.monitor.values import is_time

RUN_FILE = "run.json"
RUN_STAMP = re.compile(r"(\d{8}-\d{6})(?:-(\d{1,4}))?")  # runs/<stamp> as wizard.run.launch.new_run_dir names them
FIRST_EVENTS_READ = 64  # events files whose first event says when a run folder without run.json started
REMOTE_DIR = "remote"  # <run>/remote/events/rank-R.jsonl: what the stream told node 0 about other nodes


def catch_up(state: JobState, follower: EventFollower, heard: Callable[[dict], float] | None = None) -> None:
    """Fold in every event the follower has not read yet, a bounded chunk at a time (`heard`: as ingest_all's)."""
    while True:
        state.ingest_all(follower.poll(), heard)
        if not follower.behind:
            return


class RunFolder:
    """A run folder as a job source: its events, its runner, its summary once written."""

    def __init__(
        self,
        run_dir: Path,
        *,
        hang_after: float = DEFAULT_HANG_AFTER,
        clock: Callable[[], float] = time.time,
        ticker: Callable[[], float] = time.monotonic,
    ) -> None:
        self.run_dir = run_dir
        self.clock = clock
        self.info = read_json_object(run_dir / RUN_FILE) or {}
        for folder in (run_dir, run_dir / REMOTE_DIR):
            events_files(folder)  # a FIFO or a device among them is refused now, by name
        self._followers = [RegularFollower(run_dir), RegularFollower(run_dir / REMOTE_DIR)]
        world_size = self.info.get("world_size") or _world_size(run_dir)
        if not isinstance(world_size, int) or not 0 < world_size <= MAX_WORLD_SIZE:
            raise TargetError(
                f"{run_dir} says its world size is {str(world_size)[:20]}: npu-wizard runs 1 to {MAX_WORLD_SIZE} "
                "ranks, so this is no run folder of its own"
            )
        self.state = JobState(
            world_size, hang_after=hang_after, clock=clock, ticker=ticker, nodes=self.info.get("node_count")
        )
        # judged by when this monitor heard each event; what was written before it opened, by its age
        for follower in self._followers:
            catch_up(self.state, follower, self.state.backdated)
        said = self.info.get("started_at")  # run.json is anyone's to write into: a value that is no time is none
        self.started_at = (said if is_time(said) else None) or _first_time(self.state) or clock()
        self.summary: dict | None = None
        self.outcome: str | None = None
        self.ended_at: float | None = None
        self.notes: list[str] = []
        self._runner_gone_said = False

    @classmethod
    def open(cls, path: Path, *, hang_after: float = DEFAULT_HANG_AFTER) -> RunFolder:
        """The run folder at `path`, or the newest run of the project at `path`."""
        return cls(run_folder_path(path), hang_after=hang_after)

    @property
    def runner_pid(self) -> int | None:
        """The pid of the `npu-wizard run` that owns this run, if any (run.json is anyone's to write)."""
        pid = self.info.get("runner_pid")
        return pid if type(pid) is int and 1 < pid < 1 << 22 else None

    def tick(self) -> str | None:
        """Read new events; return the outcome once the run has ended."""
        if self.outcome is not None:
            return self.outcome
        for follower in self._followers:
            catch_up(self.state, follower)
        said = read_json_object(self.run_dir / SUMMARY_FILE)
        self.summary = None if said is None else checked(said)  # as anyone wrote it: each value of its kind
        self._note_refused()
        if self.summary is not None:
            outcome, ended_at = self.summary.get("outcome"), self.summary.get("ended_at")
            self.outcome = outcome if isinstance(outcome, str) and outcome else "unknown"
            self.ended_at = ended_at if is_time(ended_at) else _last_time(self.state) or self.clock()
        elif self.runner_pid is not None and not self._runner_alive() and not self._ranks_said_last():
            if self._ranks_going():  # the runner was killed, its job was not: the ranks' own files tell on
                return None
            self.outcome, self.ended_at = "abandoned", _last_time(self.state) or self.clock()
            self.summary = summarize(
                self.state,
                started_at=self.started_at,
                ended_at=self.ended_at,
                outcome=self.outcome,
                run_dir=self.run_dir,
            )
        elif not self._runner_alive() and self._ranks_said_last():
            # launch scripts run by hand, or a runner gone before them: the ranks' own last words say how it ended
            self.outcome = "finished" if self.state.finished() else "preempted" if self.state.preempted() else "failed"
            self.ended_at = _last_time(self.state) or self.clock()
            self.summary = summarize(
                self.state,
                started_at=self.started_at,
                ended_at=self.ended_at,
                outcome=self.outcome,
                failure=self.state.root_cause(),
                run_dir=self.run_dir,
            )
        return self.outcome

    def _runner_alive(self) -> bool:
        """Whether the run's `npu-wizard run` still runs: its pid alive and still a runner (a pid is reused once
        the runner is gone, on a busy host within minutes)."""
        pid = self.runner_pid
        return pid is not None and procs.is_alive(pid) and procs.is_runner(pid)

    def _ranks_said_last(self) -> bool:
        """True once the ranks' own events say the run ended: every rank finished or saved, or one failed."""
        return self.state.finished() or self.state.preempted() is not None or self.state.root_cause() is not None

    def _ranks_going(self) -> bool:
        """With the runner gone: True while processes of the run live on this host or its ranks still write events.

        Said once in the notes: nothing supervises those ranks now (no stop at a failure or a hang).
        """
        alive = procs.job_processes(self.run_dir)
        heard = [view.last_seen for view in self.state.ranks.values() if view.last_seen is not None]
        writing = bool(heard) and self.state.now() - max(heard) <= self.state.hang_after
        if not alive and not writing:
            return False
        said = f"{len(alive)} process(es) of the run alive on this host" if alive else "its ranks still write events"
        note = (
            f"warning: the runner of this run (pid {self.runner_pid}) is gone (killed?), but the ranks still run "
            f"({said}): following their own events; nothing supervises them or stops them at a failure or a hang"
        )
        if not self._runner_gone_said:
            self.notes.append(note)
            self._runner_gone_said = True
        return True

    def _note_refused(self) -> None:
        """Say once of each events file passed over since the folder was opened (swapped for a FIFO, say)."""
        for follower in self._followers:
            for line in follower.refused.values():
                if f"warning: {line}" not in self.notes:
                    self.notes.append(f"warning: {line}")

    def stop(self, outcome: str = "interrupted", signum: int = signal.SIGINT) -> str:
        """Ask the runner to stop the job (as Ctrl-C in its terminal would)."""
        pid = self.runner_pid
        if pid is not None and procs.is_alive(pid) and procs.is_runner(pid):  # never another process of yours
            os.kill(pid, signal.SIGINT)
        return outcome


def run_folder_path(path: Path) -> Path:
    """The run folder at `path`, or the newest run of the project at `path`; TargetError for neither."""
    path = path.resolve()
    if (path / "answers.yaml").is_file():
        runs = sorted(
            (p for p in (path / "runs").glob("*") if (p / RUN_FILE).is_file() or (p / "events").is_dir()),
            key=_run_order,
        )
        if not runs:
            raise TargetError(f"{path} has no runs yet: start one with npu-wizard run {path}")
        path = runs[-1]
    if not (path / "events").is_dir() and not (path / RUN_FILE).is_file():
        raise TargetError(f"{path} is not a run folder (no events/ and no {RUN_FILE}); pass runs/<stamp>")
    return path


def _run_order(run_dir: Path) -> tuple[float, int, str]:
    """Where a run folder stands among the project's runs: by when it started, never by when it was last written.

    A folder's time changes whenever something is written into it (a report drawn of an old run), so the
    start is what the run says of itself: run.json's started_at, else the stamp of its name (`runs/<stamp>`,
    `<stamp>-N` for a second run in the same second), else its ranks' first event (runs/latest of the launch
    scripts run by hand); a folder that says none of these comes first.
    """
    stamp = RUN_STAMP.fullmatch(run_dir.name)
    again = int(stamp.group(2) or 0) if stamp else 0
    try:
        said = (read_json_object(run_dir / RUN_FILE) or {}).get("started_at")
    except TargetError:  # an older run's run.json that is no regular file: the chosen run's own is read later
        said = None
    if is_time(said):
        return float(said), again, run_dir.name
    if stamp:
        try:
            return time.mktime(time.strptime(stamp.group(1), "%Y%m%d-%H%M%S")), again, run_dir.name
        except (ValueError, OverflowError):
            pass
    return _first_event_time(run_dir) or float("-inf"), again, run_dir.name


def _first_event_time(run_dir: Path) -> float | None:
    """The time of the earliest first event of the run folder's events files, or None."""
    times = []
    try:
        for path in events_files(run_dir)[:FIRST_EVENTS_READ]:
            head = read_head(path, 4096) or b""
            try:
                at = json.loads(head.split(b"\n", 1)[0]).get("time")
            except (ValueError, AttributeError, RecursionError):
                continue
            if is_time(at):
                times.append(float(at))
    except TargetError:
        return None
    return min(times, default=None)


def watch_plain(folder: RunFolder, *, interval: float = 2.0, out: TextIO | None = None, poll: float = 0.5) -> None:
    """Print the job's line and each rank's per interval until the run ends, then its summary."""
    # looked up now (a test may have swapped it since import); what the ranks said is shown escaped
    out = PrintableOut(out or sys.stdout)
    print(f"run folder: {folder.run_dir}", file=out, flush=True)
    # lines are due on the state's clock (its ticker): a wall clock stepped (NTP) neither spams nor silences
    next_line, noted = folder.state.now(), 0
    restarts_said: dict[int, int] = {}
    while folder.tick() is None:
        now, heard_now = folder.clock(), folder.state.now()
        for note in folder.notes[noted:]:
            print(note, file=out, flush=True)
        noted = len(folder.notes)
        for kind, finding in folder.state.stragglers.fresh():
            print(straggler_line(kind, finding, now - folder.started_at), file=out, flush=True)
        for line in restart_lines(folder.state, restarts_said):
            print(line, file=out, flush=True)
        if heard_now >= next_line:
            print(progress_block(folder.state, now - folder.started_at, heard_now), file=out, flush=True)
            next_line = heard_now + interval
        time.sleep(poll)
    for note in folder.notes[noted:]:
        print(note, file=out, flush=True)
    if folder.summary is not None:
        print(format_summary(folder.summary), file=out, flush=True)
        for line in failure_log_lines(folder.summary):
            print(line, file=out, flush=True)


MAX_WORLD_SIZE = 4096 * 16  # the most nodes a project has, times the most devices a node has


def _world_size(run_dir: Path) -> int:
    """The world size a run folder without run.json shows: its ranks' files and their first events."""
    files = [*events_files(run_dir), *events_files(run_dir / REMOTE_DIR)]
    ranks = [int(path.stem.split("-", 1)[1]) for path in files]
    sizes = []
    for path in files:
        head = read_head(path) or b""  # the `started` event comes first
        for line in head.split(b"\n")[:-1]:
            try:
                size = json.loads(line).get("world_size")
            except (ValueError, AttributeError, RecursionError):
                continue
            if isinstance(size, int):
                sizes.append(size)
                break
    return max([*sizes, max(ranks, default=-1) + 1, 1])


def _first_time(state: JobState) -> float | None:
    return min((v.started_at for v in state.ranks.values() if v.started_at), default=None)


def _last_time(state: JobState) -> float | None:
    return max((v.last_said for v in state.ranks.values() if v.last_said), default=None)
