"""`run --restarts N`: which failures start the whole job again, and what each attempt cost.

After a failure a restart can fix (a rank's error after the job's first step,
a rank that vanished, a node's launcher that died, a hang), the runner
(wizard.run.job) stops every node as it does at any failure, waits until the
failed node is free of the old processes (`node_health`: none of the job's
processes left, npu-smi listing none of its pids, the master port free; a
device still busy fails the next start with EJ0001), at most HEALTH_DEADLINE_S,
and starts the whole job again; the generated train.py resumes from the newest
checkpoint every rank can load. Each attempt is a section of the same run
folder: the events files go on (a rank's `started` event opens its new
attempt), each attempt's logs are kept under logs/attempt-N/, and
summary.json lists the attempts with their cause, the step each failed at,
the step the next resumed from and the time from the failure to its first step.

A failure a restart cannot fix ends the job at once, said once (`refusal`).
`Attempts.next_nodes` is where the nodes (and, later, the hosts) of the next
attempt are decided: today the same ones.
"""

from __future__ import annotations

import re
import shutil
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from wizard.answers.model import Answers
from wizard.monitor import procs
from wizard.monitor.ranks import Failure
from wizard.monitor.safe_folder import Folder, NotAFolder
from wizard.monitor.state import START_MARGIN_S, JobState
from wizard.run.engines.common import run_command
from wizard.run.hang_stacks import ASK_FILE, HANG_DIR

HEALTH_DEADLINE_S = 60.0  # for the failed node to be free of the old processes: a safety net, not a wait
CHECKPOINT_WORDS = ("does not fit this model", "CheckpointReadError", "ForeignCheckpointError")
# the code itself crashed: it would again. Not SIGABRT: torch's watchdog aborts a rank whose collective timed
# out after a peer died, which a restart fixes
CRASH_SIGNALS = ("SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE")
SIGNAL_WORDS = re.compile(r"\bsignal (\d+) \((SIG[A-Z]+)")  # as summary_text.exit_words says a signal


@dataclass
class Attempt:
    """One start of the whole job, and how it ended when it failed."""

    number: int  # 1 for the first start
    started_at: float
    cause: str | None = None  # the failure's headline
    kind: str | None = None  # error, vanished, launcher, hung, ...
    node: int | None = None  # the node of the rank (or launcher) that failed, when one did
    failed_at: float | None = None
    failed_at_step: int | None = None  # the newest step any rank had reached
    resumed_from_step: int | None = None  # of the attempt after this one
    recovered_at: float | None = None  # the next attempt's first step
    outcome: str | None = None  # failed, hung, finished, interrupted (None while it runs)
    refused: str | None = None  # why the job was not started again after it
    first_step_at: float | None = None  # its ranks' first logged step
    rank_restarts: int = 0  # its ranks' own restarts (a launcher's), the most of any rank

    def record(self) -> dict:
        """This attempt as summary.json lists it."""
        lost = None
        if self.failed_at_step is not None and self.resumed_from_step is not None:
            lost = max(0, self.failed_at_step - self.resumed_from_step)
        recovery = None
        if self.failed_at is not None and self.recovered_at is not None:
            recovery = round(max(0.0, self.recovered_at - self.failed_at), 3)
        return {
            "attempt": self.number,
            "outcome": self.outcome,
            "cause": self.cause,
            "kind": self.kind,
            "failed_at_step": self.failed_at_step,
            "resumed_from_step": self.resumed_from_step,
            "steps_lost": lost,
            "failure_to_first_step_s": recovery,
            "refused": self.refused,
        }


class Attempts:
    """The job's attempts so far and how many restarts are left; decides whether a failure restarts the job."""

    def __init__(
        self, allowed: int, *, clock: Callable[[], float] = time.time, ticker: Callable[[], float] = time.monotonic
    ) -> None:
        """`clock`: wall time, for the attempts' records; `ticker`: the wait between two attempts and its deadline."""
        self.allowed = allowed
        self.clock = clock
        self.ticker = ticker
        self.attempts = [Attempt(1, clock())]
        # while waiting between two attempts, on the ticker: since when the node is checked, and until when
        self.restart_at: float | None = None
        self.deadline: float | None = None
        self.unhealthy_said = False

    @property
    def current(self) -> Attempt:
        """The attempt running now (or the one that just failed, while waiting)."""
        return self.attempts[-1]

    @property
    def restarts(self) -> int:
        """How many times the whole job was started again."""
        return len(self.attempts) - 1

    @property
    def waiting(self) -> bool:
        """True between a failed attempt and the start of the next."""
        return self.restart_at is not None

    def refusal(self, outcome: str, failure: Failure | None, state: JobState, ended: str | None = None) -> str | None:
        """Why this failure does not start the job again; None when it does.

        `ended`: how the failed rank's launcher saw its process end (`signal 11 (SIGSEGV: ...)`), where known.
        """
        if self.allowed == 0:
            return ""  # no restarts asked: nothing to say
        why = _cannot_fix(outcome, failure, state, ended)
        if why is not None:
            return f"not restarted: {why}"
        if self.restarts >= self.allowed:
            return f"not restarted: the {self.allowed} restart(s) of --restarts {self.allowed} are used up"
        return None

    def ended(self, outcome: str, failure: Failure | None, state: JobState, now: float) -> None:
        """Record how the current attempt ended."""
        attempt = self.current
        attempt.outcome = outcome
        if outcome == "finished":
            return
        attempt.cause = failure.headline() if failure is not None else attempt.cause
        attempt.kind = failure.kind if failure is not None else attempt.kind
        attempt.node = failure.node if failure is not None else attempt.node
        attempt.failed_at = failure.time if failure is not None and failure.time else now
        attempt.failed_at_step = state.newest_step()

    def failed(self, failure: Failure | None, state: JobState, now: float) -> float:
        """Record how the current attempt failed; return the most seconds to wait for the failed node to be free
        (the next attempt starts as soon as it is)."""
        self.ended("hung" if failure is not None and failure.kind == "hung" else "failed", failure, state, now)
        attempt = self.current
        attempt.cause = attempt.cause or "the job failed"
        self.restart_at = self.ticker()
        self.deadline = self.restart_at + HEALTH_DEADLINE_S
        self.unhealthy_said = False
        return HEALTH_DEADLINE_S

    def started_again(self, now: float) -> Attempt:
        """The next attempt starts now."""
        self.restart_at = self.deadline = None
        self.attempts.append(Attempt(len(self.attempts) + 1, now))
        return self.current

    def next_nodes(self, nodes: Sequence[int], failure: Failure | None) -> list[int]:
        """The nodes the next attempt starts: the same ones (a spare host taking a failed node's place goes here)."""
        return list(nodes)

    def note_progress(self, state: JobState) -> None:
        """Note the attempt's first step and its ranks' restarts; once a restarted job steps, where it resumed."""
        current = self.current
        current.rank_restarts = max([current.rank_restarts, *(view.restarts for view in state.ranks.values())])
        if current.first_step_at is None:
            current.first_step_at = min(
                (view.first_step_at for view in state.ranks.values() if view.first_step_at is not None), default=None
            )
        if len(self.attempts) < 2:
            return
        before = self.attempts[-2]
        if before.recovered_at is not None:
            return
        stepped = [view for view in state.ranks.values() if view.first_step_at is not None]
        if not stepped:
            return
        before.recovered_at = min(view.first_step_at for view in stepped if view.first_step_at is not None)
        said = [view.resumed_step for view in state.ranks.values() if view.starts and view.resumed_step]
        # a user's own script does not say where it resumed: its first reported step after the restart tells,
        # not the newest (several steps may have come in since the last tick)
        firsts = [view.first_step for view in stepped if view.first_step is not None]
        before.resumed_from_step = max(said) if said else max(0, min(firsts, default=1) - 1)

    def cover_summary(self, summary: dict, state: JobState, *, started_at: float) -> None:
        """Make the summary's headline figures the whole job's: `summarize` saw the last attempt's state alone.

        The first logged step is the first attempt's that logged one; restarts counts the job's restarts and
        every attempt's rank restarts.
        """
        self.note_progress(state)
        firsts = [attempt.first_step_at for attempt in self.attempts if attempt.first_step_at is not None]
        summary["time_to_first_step_s"] = (min(firsts) - started_at) if firsts else None
        summary["restarts"] = self.restarts + sum(attempt.rank_restarts for attempt in self.attempts)

    def words(self, now: float) -> str:
        """For the live view: the restart under way, or which attempt runs; empty for a job started once."""
        if self.restart_at is not None:
            return (
                f"attempt {self.current.number} failed: restarting once the failed node is free of the job's "
                f"processes ({self.restarts}/{self.allowed} used)"
            )
        if not self.restarts:
            return ""
        return f"attempt {self.current.number} ({self.restarts}/{self.allowed} restart(s) used)"

    def records(self) -> list[dict]:
        """Every attempt, as summary.json lists them."""
        return [attempt.record() for attempt in self.attempts]


def _cannot_fix(outcome: str, failure: Failure | None, state: JobState, ended: str | None = None) -> str | None:
    """Why a restart cannot fix this failure (None when it may)."""
    if failure is None:
        return None
    if failure.kind == "runner":
        return "npu-wizard run itself failed"
    stepped = any(view.steps_reported for view in state.ranks.values())
    crash = _crash_signal(f"{ended or ''} {failure.summary}") if failure.kind in ("vanished", "launcher") else None
    if crash is not None and not stepped and _died_starting(failure, state):
        return (
            f"the script crashed ({crash}) before the job's first step (at import, setting up or in its first "
            "step): a restart would crash the same way; fix the script or the native library it loads and run again"
        )
    if failure.kind == "error":
        if any(words in failure.summary for words in CHECKPOINT_WORDS):
            return "the checkpoint does not fit the model (or cannot be read): a restart would load it again"
        if not stepped:
            return (
                "the script failed before the job's first step (at import, setting up or in its first step): "
                "a restart would fail the same way; fix the script and run again"
            )
    if failure.kind in ("launcher", "engine") and not any(view.starts for view in state.ranks.values()):
        return "the launch failed before any rank started (the launch script, a preflight check, the launcher)"
    if outcome == "hung" and not stepped and not any(view.starts for view in state.ranks.values()):
        return "no rank started by the start-up deadline: check the addresses and ports (npu-wizard doctor)"
    return None


def _died_starting(failure: Failure, state: JobState) -> bool:
    """Whether the failed rank died within START_MARGIN_S of its start (or before it started).

    A script that reports no steps is at no step npu-wizard knows of however long it ran: how long it lived
    tells a crash while starting from one after hours. Measured on the state's clock (the runner's ticker,
    from when each event was heard), else on the events' own stamps. A launcher's failure names no rank: its
    node's newest start counts.
    """
    if failure.rank in state.ranks:
        views = [state.ranks[failure.rank]]
    else:
        views = [view for view in state.ranks.values() if failure.node is None or view.node == failure.node]
    starts = [view for view in views if view.starts and view.started_heard is not None]
    if not starts:
        return True
    view = max(starts, key=lambda view: view.started_heard or 0.0)
    if view.ended_heard is not None:
        died = view.ended_heard
    else:
        died = state.now() if state.ticker is not None else (view.ended_at or failure.time)
    return died - (view.started_heard or 0.0) <= START_MARGIN_S


def _crash_signal(text: str) -> str | None:
    """`signal 11, SIGSEGV` where `text` says a process ended on a signal of a crash in its own code; else None."""
    for found in SIGNAL_WORDS.finditer(text):
        if found.group(2) in CRASH_SIGNALS:
            return f"signal {found.group(1)}, {found.group(2)}"
    return None


def node_health(run_dir: Path, answers: Answers, pids: Iterable[int], *, master_here: bool) -> list[str]:
    """What still keeps this host's nodes from starting again: the job's processes, the master port, NPU devices."""
    problems = []
    left = procs.job_processes(run_dir)
    if left:
        problems.append(f"{len(left)} process(es) of the job still alive ({', '.join(map(str, left[:8]))})")
    if master_here:
        port = answers["network.master_port"]
        if not _bindable(answers["network.master_addr"], port):
            problems.append(f"the master port {port} is still taken")
    holders = npu_holders(set(pids))
    if holders:
        problems.append(f"npu-smi shows process(es) {', '.join(map(str, holders))} of this job on its devices")
    return problems


def npu_holders(pids: set[int]) -> list[int]:
    """The pids among `pids` that `npu-smi info` lists on a device (none where there is no npu-smi)."""
    if not pids or shutil.which("npu-smi") is None:
        return []
    shown = run_command(["npu-smi", "info"], timeout=20.0)
    found = set()
    for line in shown.stdout.splitlines():
        for word in line.replace("|", " ").split():
            if word.isdigit() and int(word) in pids:
                found.add(int(word))
    return sorted(found)


def _bindable(host: str, port: int) -> bool:
    """True when a listener could bind `host`:`port` now (as the restarted launcher's will)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return True  # not an address of this host: nothing here to check
    family, kind, proto, _name, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as error:
            return error.errno not in (98,)  # EADDRINUSE; another error (not ours to bind) is no sign of us
    return True


def keep_logs(run_dir: Path, number: int) -> Path | None:
    """Move the failed attempt's logs into logs/attempt-N/, its hang stacks into hang/attempt-N/."""
    # a pending `monitor --stacks` ask stays for the next attempt to answer
    _move_files(run_dir / HANG_DIR, f"attempt-{number}", keep=ASK_FILE)
    return _move_files(run_dir / "logs", f"attempt-{number}")


def _move_files(path: Path, into: str, keep: str = "") -> Path | None:
    """Move the regular files of the folder `path` (all but `keep`) into its subfolder `into`; that subfolder.

    None where there is no such folder, or a link or a file is in the place of either: nothing is moved through one.
    """
    try:
        with Folder.open(path) as folder, folder.folder(into, make=True) as kept:
            for name in folder.names():
                if name != keep and folder.is_file(name):
                    folder.move(name, kept)
    except (FileNotFoundError, NotAFolder):
        return None
    return path / into
