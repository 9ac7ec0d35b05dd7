"""Reporting a run's end: the failure that names the root cause, and the error the command exits with."""

from __future__ import annotations

import re
import signal
from pathlib import Path

from runtime.preemption import PREEMPTED_EXIT
from wizard.errors import WizardError
from wizard.monitor.hang_verdict import HangVerdict
from wizard.monitor.ranks import Failure
from wizard.monitor.state import JobState
from wizard.monitor.summary_text import (
    FAILED_OUTCOMES,
    SHELL_EXIT,
    exit_words,
    failure_report,
    launcher_log,
    node_log_reason,
)
from wizard.monitor.terminal import printable


class RunFailed(WizardError):
    """The training job failed; the message names the root cause."""

    exit_code = 3


class RunPreempted(WizardError):
    """Every rank saved a checkpoint on a stop signal and exited; `npu-wizard run` again resumes from it.

    The exit code: 128 + the signal where the runner itself was stopped (as an
    interruption), else runtime.preemption's PREEMPTED_EXIT (75).
    """

    exit_code = PREEMPTED_EXIT

    def __init__(self, message: str, signum: int | None = None) -> None:
        super().__init__(message)
        self.exit_code = PREEMPTED_EXIT if signum is None else 128 + signum


class RunInterrupted(WizardError):
    """The user stopped the job (Ctrl-C, the stop key, SIGTERM or SIGHUP); every process is gone."""

    exit_code = 130

    def __init__(self, message: str, signum: int = signal.SIGINT) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum


# torchrun's summary names the first rank that failed, then its exit code (minus the signal)
TORCHRUN_ROOT_CAUSE = re.compile(
    r"Root Cause \(first observed failure\):.*?\brank\s*: (\d+) \(local_rank: \d+\)\s*exitcode\s*: (-?\d+)", re.S
)


def rank_end(local_log: Path) -> str | None:
    """How the launcher saw the first of its ranks end, from its log: `rank 3 end with signal 9 (SIGKILL...)`."""
    with local_log.open("rb") as handle:
        handle.seek(max(0, local_log.stat().st_size - 64 * 1024))
        text = handle.read().decode(errors="replace")
    if found := TORCHRUN_ROOT_CAUSE.search(text):
        rank, code = int(found.group(1)), int(found.group(2))
        return f"rank {rank} end with " + (exit_words(-code) if code < 0 else f"exit code {code}")
    if found := SHELL_EXIT.search(text):
        rank, code = int(found.group(1)), int(found.group(2))
        return f"rank {rank} end with " + (exit_words(code - 128) if code > 128 else f"exit code {code}")
    return None


def launcher_failure(run_dir: Path, log: str, node: int, code: int | None, now: float) -> Failure:
    """A node's launch script exited non-zero before any rank reported an error; `log`: where its log is.

    Its words come from the log this host has of it: its own, or (ssh) its output as the session brought it.
    """
    said = node_log_reason(run_dir, node)
    local = launcher_log(run_dir, node)
    stopped = "stopped in its preflight" if any("preflight FAIL:" in line for line in said) else "exited"
    summary = f"its launch script {stopped} (exit code {code}) before any rank reported an error"
    ended = rank_end(local) if local is not None else None
    if ended:
        summary += f"; its launcher saw {ended}"
    if said and local is not None and str(local) != log and not log.endswith(str(local)):
        summary += f"; its log is {log}; from logs/{local.name} here:\n" + "\n".join(f"  | {line}" for line in said)
    elif said:
        summary += f"; from {log}:\n" + "\n".join(f"  | {line}" for line in said)
    else:
        summary += f"; see {log}"
    return Failure(None, node, now, "launcher", summary)


def engine_failure(engine: str, reason: str | None, now: float) -> Failure:
    """The engine's job ended early without a rank's error."""
    return Failure(None, None, now, "engine", f"the {engine} job ended early: {reason or 'no reason given'}")


def hang_failure(state: JobState, now: float, verdict: HangVerdict | None = None) -> Failure:
    """The first hung rank (or the start-up deadline, or the stall) as the failure of an --abort-on-hang run.

    `verdict`: where each rank was at the hang (its stacks); a stall is then laid on the ranks it names as
    the odd ones out, as the verdict printed before it does, not on every rank that made no step. `now` (wall
    time) stamps the failure; the silences are measured on the state's own clock.
    """
    heard_now = state.now()
    hung = state.hung(heard_now)
    if not hung and state.late(heard_now):
        return Failure(None, None, now, "missing", f"start-up deadline passed: {state.late_report(heard_now)}")
    if not hung and verdict is not None and verdict.odd_ones_out:
        odd = verdict.odd_ones_out
        held = "; ".join(group.words for group in verdict.groups if set(group.ranks) & set(odd))
        summary = f"the job stalled (no rank made a step for {state.hang_after:.0f}s): {held}"
        if len(odd) > 1:
            return Failure(None, None, now, "hung", summary)
        view = state.view(odd[0])
        return Failure(view.rank, view.node, now, "hung", summary, device=view.device, pid=view.pid)
    if not hung:
        return Failure(None, None, now, "hung", f"the job stalled: {state.hang_report(heard_now)}")
    view = state.ranks[hung[0]]
    silent = heard_now - (view.last_seen or heard_now)
    others = f"; also hung: ranks {', '.join(map(str, hung[1:]))}" if hung[1:] else ""
    summary = (
        f"hung: no heartbeat or step for {silent:.0f}s at step {view.step} "
        f"(process {view.pid} stopped, frozen or unreachable?){others}"
    )
    return Failure(view.rank, view.node, now, "hung", summary, device=view.device, pid=view.pid)


def failure_words(failure: Failure | None, run_dir: Path, engine: str, engine_reason: str | None) -> str:
    """The failure report, or the hang report, for the end of a failed run."""
    if failure is None:
        return "the job was stopped"
    report = failure_report(failure, run_dir)
    if engine_reason and engine_reason not in report:
        report += f"\n{engine}: {engine_reason}"
    return report


def outcome_error(
    outcome: str | None,
    report: str,
    run_dir: Path,
    stop_signal: int | None,
    submitted: bool,
    *,
    preempted_step: int | None = None,
) -> WizardError | None:
    """RunFailed, RunPreempted or RunInterrupted for a job that did not finish; None where it did.

    `stop_signal`: what stopped the runner (None: nothing did).
    """
    if outcome in FAILED_OUTCOMES:
        # the root cause quotes the rank's message and log: their control characters are shown escaped
        return RunFailed(printable(f"the training run failed; {report}\nevents, logs and summary in {run_dir}"))
    if outcome == "preempted":
        how = "preempted" if stop_signal is None else _stopped_how(stop_signal)
        return RunPreempted(
            f"{how}: every rank saved a checkpoint at step {preempted_step} and exited (preempted at step "
            f"{preempted_step}, checkpoint saved); npu-wizard run again resumes from it; logs in {run_dir}",
            stop_signal,
        )
    if outcome == "interrupted":
        stop_signal = signal.SIGINT if stop_signal is None else stop_signal
        name = signal.Signals(stop_signal).name
        how = "interrupted" if stop_signal == signal.SIGINT else f"stopped by {name}"
        message = f"{how}: every process of the job was stopped; logs in {run_dir}"
        if not submitted:
            message = f"{how} before the job started: nothing of it is running"
        return RunInterrupted(message, stop_signal)
    return None


def _stopped_how(stop_signal: int) -> str:
    """The words for what stopped the runner: interrupted (Ctrl-C), else stopped by SIGTERM and so on."""
    return "interrupted" if stop_signal == signal.SIGINT else f"stopped by {signal.Signals(stop_signal).name}"
