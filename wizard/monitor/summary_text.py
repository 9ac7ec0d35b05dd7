"""Words for a job: the progress line, the failure report and the end-of-run summary."""

from __future__ import annotations

import math
import re
import signal
from pathlib import Path
from typing import Any

from wizard.monitor.attempt_text import attempt_lines, restart_words
from wizard.monitor.hosts_text import host_lines
from wizard.monitor.lm_figures import evaluation_words, rate_words, summary_lines
from wizard.monitor.memory_peaks import summary_lines as memory_lines
from wizard.monitor.memory_text import oom_lines
from wizard.monitor.ranks import Failure, where
from wizard.monitor.run_files import RunFileError, log_lines, read_tail
from wizard.monitor.state import FINISHED, HUNG, RUNNING, STALLED, JobState
from wizard.monitor.stragglers import LEARN_WINDOWS, Straggler, describe

SUMMARY_FILE = "summary.json"
LOG_TAIL_LINES = 10
LOG_SCANNED_LINES = 100_000  # lines of a node's log end (its last 64 KiB) searched for the preflight's failures
# In place of the ETA where a script sends its steps without total_steps, which the ETA needs.
ETA_NEEDS_TOTAL = "ETA: pass total_steps= to report.step"
# the outcomes `npu-wizard run` exits with RunFailed for, whose message names the root cause
FAILED_OUTCOMES = ("failed", "hung")


def duration(seconds: float | None) -> str:
    """`1h02m03s`, `2m03s` or `4.5s`; `?` when unknown."""
    if seconds is None or math.isnan(seconds):
        return "?"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def eta_text(state: JobState) -> str:
    """`ETA 2m03s` (`ETA ?` until the step rate is known); for steps sent without their total, how to get one."""
    if state.total_steps() is None and any(view.steps_reported for view in state.ranks.values()):
        return ETA_NEEDS_TOTAL
    return f"ETA {duration(state.eta())}"


def progress_line(state: JobState, elapsed: float, now: float | None = None) -> str:
    """One line: ranks by state, newest step and loss, throughput, ETA, hung ranks (`now`: on state.now()'s clock)."""
    states = [state.state(rank, now) for rank in sorted(state.ranks)]
    counts = ", ".join(f"{name} {states.count(name)}" for name in dict.fromkeys(states))
    line = f"[{elapsed:7.1f}s] {len(states)} ranks: {counts}"
    losses = [view for view in state.ranks.values() if view.loss is not None]
    if any(view.steps_reported for view in state.ranks.values()):  # a loss comes with a step
        total = state.total_steps()
        line += f" | step {state.newest_step()}{f'/{total}' if total else ''}"
        if losses:
            line += f" loss {max(losses, key=lambda view: view.step).loss:.4f}"
        evaluated = evaluation_words(state.lm_figures)
        if evaluated:
            line += f", {evaluated}"
        stepped = [view.progress_at for view in state.ranks.values() if view.outcome is None and view.progress_at]
        if any(name in (STALLED, HUNG) for name in states) and stepped:
            # a stall: the throughput and the ETA of before it would only repeat, frozen
            line += f" | last step {max(0.0, (state.now() if now is None else now) - max(stepped)):.0f}s ago"
        else:
            rates = ", ".join([f"{state.throughput():,.0f} samples/s", *rate_words(state.lm_figures)])
            line += f" | {rates} | {eta_text(state)}"
    elif (quietest := state.quietest(now)) is not None:
        # ranks of a script that reports no steps: how long the quietest has printed nothing
        line += f" | no steps reported; quietest: rank {quietest[0]}, printed {quietest[1]:.0f}s ago"
    hung = state.hung(now)
    if hung:
        line += f" | HUNG: rank {', '.join(map(str, hung))}"
    return line


def log_tail(run_dir: Path, rank: int, lines: int = LOG_TAIL_LINES) -> list[str]:
    """The last lines of a rank's log in this run folder (none when it is on another node)."""
    return log_lines(run_dir / "logs" / f"rank-{rank}.log", lines)


def node_log_reason(run_dir: Path, node: int, lines: int = LOG_TAIL_LINES) -> list[str]:
    """Why a node's script stopped, from its log here (launcher_log): the preflight's failure lines, else the last."""
    log = launcher_log(run_dir, node)
    if log is None:
        return []
    text = log_lines(log, LOG_SCANNED_LINES)
    preflight = [line for line in text if "preflight FAIL:" in line]
    return preflight or [line for line in text if line.strip()][-lines:]


# how a launcher reports a worker's end in its node's log: torchrun (exit code, or minus the signal) and
# launch/run-node.sh's shell loop (128 + the signal)
TORCHRUN_EXIT = (
    re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: \d+ \(pid: (\d+)\)"),
    re.compile(r"exitcode\s*: (-?\d+) \(pid: (\d+)\)"),
)
SHELL_EXIT = re.compile(r"\brank (\d+) \(local rank \d+[^)]*\) failed with exit code (\d+)")


def launcher_log(run_dir: Path, node: int) -> Path | None:
    """Node's launch script log on this host: its own, or the ssh engine's copy of a remote node's output."""
    for name in (f"node-{node}.log", f"ssh-node-{node}.log"):
        if (log := run_dir / "logs" / name).is_file() and not log.is_symlink():
            return log
    return None


def launcher_exit(run_dir: Path, failure: Failure) -> str | None:
    """How the node's launcher saw the failed rank's process end, from its log: `exit code 3`, `signal 9 (SIGKILL)`."""
    if failure.rank is None or failure.node is None:
        return None
    log = launcher_log(run_dir, failure.node)
    if log is None:
        return None
    try:
        text = (read_tail(log) or b"").decode(errors="replace")
    except RunFileError:  # swapped for a FIFO or a link since it was found: not read
        return None
    for pattern in TORCHRUN_EXIT:
        for found in pattern.finditer(text):
            if failure.pid is not None and int(found.group(2)) == failure.pid:
                code = int(found.group(1))
                return exit_words(-code) if code < 0 else f"exit code {code}"
    for found in SHELL_EXIT.finditer(text):
        if int(found.group(1)) == failure.rank:
            code = int(found.group(2))
            return exit_words(code - 128) if code > 128 else f"exit code {code}"
    return None


def exit_words(signum: int) -> str:
    """A signal as the failure report names it: `signal 9 (SIGKILL: kill -9 or the OOM killer ...)`."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
    why = {"SIGKILL": "kill -9 or the OOM killer (dmesg says which)", "SIGSEGV": "a crash in native code"}
    return f"signal {signum} ({name}{f': {why[name]}' if name in why else ''})"


def failure_report(failure: Failure, run_dir: Path) -> str:
    """The root cause: which rank, what happened, its last log lines and a hint."""
    lines = [f"root cause: {failure.headline()}"]
    ended = launcher_exit(run_dir, failure) if failure.kind == "vanished" else None
    if ended and failure.node is not None and (log := launcher_log(run_dir, failure.node)) is not None:
        lines.append(f"its launcher saw it end with {ended} (logs/{log.name})")
    if failure.traceback:
        lines += ["traceback (last lines):"] + [f"  {line}" for line in failure.traceback.rstrip().splitlines()[-6:]]
    tail = log_tail(run_dir, failure.rank) if failure.rank is not None else []
    if tail:
        lines += [f"last lines of {run_dir / 'logs' / f'rank-{failure.rank}.log'}:"] + [f"  | {t}" for t in tail]
    elif failure.rank is not None:
        lines.append(f"(rank {failure.rank}'s log is on node {failure.node if failure.node is not None else '?'})")
    if failure.hint is not None:
        lines.append(f"hint: {failure.hint}")
    lines += oom_lines(failure, run_dir)
    lines += cann_log_lines(failure)
    return "\n".join(lines)


def cann_log_lines(failure: Failure) -> list[str]:
    """Where CANN wrote the failing NPU rank's own logs (plog), and how to get more of them."""
    if failure.rank is None or not (failure.device or "").startswith("npu"):
        return []
    node = f"node {failure.node}" if failure.node is not None else "its node"
    files = f"plog-{failure.pid}_*.log" if failure.pid else "the plog-<pid>_*.log of its process"
    return [
        f"CANN logs of rank {failure.rank}: on {node}, {files} in the CANN log folder ($ASCEND_PROCESS_LOG_PATH "
        "if set, else ~/ascend/log) under debug/plog/ (plog/ on older CANN); device logs in device-<id>/ beside it",
        "more detail: run again with ASCEND_GLOBAL_LOG_LEVEL=1 ASCEND_GLOBAL_EVENT_ENABLE=1 set on every node "
        "(info-level and event logs in the same folders)",
    ]


def stragglers_not_judged(state: JobState) -> str | None:
    """Why the straggler detector compared no window of the job; None once it compared one.

    A run in which nothing was compared has no verdict: it is never said to have had no straggler.
    """
    if state.stragglers.judged:
        return None
    if len(state.ranks) < 2:
        return "the job has one rank: there is no other rank to compare it with"
    if not any(view.steps_reported for view in state.ranks.values()):
        return "no rank reported a step (the script reports none, or the run ended before its first)"
    if not state.stragglers.timed:
        return (
            "no step event carries forward_s and data_s, which are compared "
            "(a script of your own passes them to report.step)"
        )
    return (
        "the run ended before the ranks had logged enough steps to compare: each rank's first step event "
        f"holds its start-up, and the next {LEARN_WINDOWS} teach the detector the job's jitter"
    )


def summarize(
    state: JobState,
    *,
    started_at: float,
    ended_at: float,
    outcome: str,
    failure: Failure | None = None,
    run_dir: Path | None = None,
) -> dict[str, Any]:
    """The run's figures as a JSON-ready dict (written to summary.json).

    With `run_dir`, the failure keeps the last lines of the failing rank's log (when it is on this node).
    """
    first_steps = [v.first_step_at for v in state.ranks.values() if v.first_step_at is not None]
    per_rank = {}
    as_of = state.judged_at(ended_at)  # on the state's clock: ranks the monitor stopped were fine until then
    for rank, view in sorted(state.ranks.items()):
        rank_state = state.state(rank, as_of)
        # a rank that ended: as its last word said (on the state's clock, when it was heard)
        ended = view.ended_at if state.ticker is None else view.last_seen if view.outcome else None
        per_rank[str(rank)] = {
            "node": view.node,
            "state": "stopped" if rank_state in (RUNNING, STALLED) and outcome != FINISHED else rank_state,
            "step": view.step,
            "loss": view.loss,
            "samples_per_s": view.overall_rate,
            "restarts": view.restarts,
            "exit_code": view.exit_code,
            "steps_reported": view.steps_reported,
            # a rank of a script that reports no steps: how long before the end it last printed
            "printed_s_before_end": None
            if view.printed_at is None or view.steps_reported
            else max(0.0, (ended or as_of) - view.printed_at),
        }
    rates = [r["samples_per_s"] for r in per_rank.values() if r["samples_per_s"] is not None]
    final = state.ranks.get(0)
    saved = state.last_checkpoint()
    preempted = state.preempted()
    return {
        "outcome": outcome,
        "preempted": None if preempted is None else {"step": preempted[0], "signal": preempted[1]},
        "world_size": state.world_size,
        "started_at": started_at,
        "ended_at": ended_at,
        "wall_s": ended_at - started_at,
        "time_to_first_step_s": (min(first_steps) - started_at) if first_steps else None,
        "samples_per_s": sum(rates) if rates else None,
        "final_loss": final.loss if final is not None else None,
        "steps": state.newest_step(),
        "restarts": max((view.restarts for view in state.ranks.values()), default=0),
        "checkpoint": None if saved is None else {"rank": saved[0], "step": saved[1], "path": saved[2]},
        "ranks": per_rank,
        "failure": None if failure is None else _failure_dict(failure, run_dir),
        "warnings": state.notices.as_dicts(),
        "stragglers": state.stragglers.as_dicts(ended_at - started_at),
        "stragglers_not_judged": stragglers_not_judged(state),
        "profile": {"windows": state.profiles, "asked": state.profile_asks}
        if state.profiles or state.profile_asks
        else None,
        "language_model": state.lm_figures.summary(),
        "memory": state.memory.summary(),
    }


def _failure_dict(failure: Failure, run_dir: Path | None) -> dict[str, Any]:
    tail = log_tail(run_dir, failure.rank) if run_dir is not None and failure.rank is not None else []
    return {
        "rank": failure.rank,
        "node": failure.node,
        "kind": failure.kind,
        "summary": failure.summary,
        "time": failure.time,
        "hint": str(failure.hint) if failure.hint else None,
        "log_tail": tail,
    }


def preempted_line(preempted: dict[str, Any]) -> str:
    """The one line for a job whose ranks all saved on a stop signal and exited."""
    signal_name = f" ({preempted['signal']})" if preempted.get("signal") else ""
    return (
        f"preempted at step {preempted.get('step')}{signal_name}, checkpoint saved: "
        "npu-wizard run again resumes from it"
    )


def format_summary(summary: dict[str, Any], *, root_cause_follows: bool = False) -> str:
    """The summary as the lines printed at the end of a run.

    `root_cause_follows`: the failure is left out, for `npu-wizard run`'s error names it right after.
    """
    loss = summary.get("final_loss")
    rate = summary.get("samples_per_s")
    lines = [
        f"outcome: {summary['outcome']}",
        f"wall time {duration(summary.get('wall_s'))}, first logged step after "
        f"{duration(summary.get('time_to_first_step_s'))}, {summary.get('steps', 0)} steps, "
        f"{restart_words(summary)}",
        f"throughput {rate:,.0f} samples/s overall" if rate else "throughput: no step logged",
        f"final loss {loss:.4f}" if isinstance(loss, (int, float)) else "final loss: none logged",
        *summary_lines(summary.get("language_model")),
        *memory_lines(summary.get("memory")),
    ]
    preempted = summary.get("preempted")
    if preempted:
        lines.append(preempted_line(preempted))
    saved = summary.get("checkpoint")
    if saved:
        lines.append(f"last checkpoint: step {saved['step']}, {saved['path']} (rank {saved['rank']})")
    lines.append("per rank:")
    for rank, info in summary.get("ranks", {}).items():
        code = info.get("exit_code")
        node = "" if info.get("node") is None else f" (node {info['node']})"
        head = f"  rank {rank}{node}: {info.get('state')}"
        head += "" if code is None else f" (exit {code})"
        printed = info.get("printed_s_before_end")
        again = info.get("restarts") or 0
        # the launcher's restarts of this rank in the last attempt: a restart of the whole job is said above
        again = f", started again {again}x by its launcher" if isinstance(again, int) and again > 0 else ""
        if info.get("steps_reported") is False and printed is not None:
            said = f"last printed {duration(printed)} before the end"
            lines.append(f"{head}, no step reported, {said}{again}")
            continue
        rank_rate = info.get("samples_per_s")
        shown_rate = f"{rank_rate:,.0f} samples/s" if rank_rate else "- samples/s"
        shown_loss = f"loss {info['loss']:.4f}" if isinstance(info.get("loss"), (int, float)) else "loss -"
        lines.append(f"{head}, step {info.get('step')}, {shown_loss}, {shown_rate}{again}")
    warnings = summary.get("warnings") or []
    if warnings:
        lines.append("warnings:")
        for warning in warnings:
            ranks = warning.get("ranks") or []
            who = f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: " if ranks else ""
            lines.append(f"  {who}{warning.get('message')}")
    stragglers = summary.get("stragglers") or []
    if summary.get("stragglers_not_judged"):
        lines.append(f"stragglers: not judged: {summary['stragglers_not_judged']}")
    elif stragglers:
        lines.append("stragglers (compute time: waiting for data + forward, against the other ranks' median):")
        lines += [f"  {describe(entry, until=summary.get('ended_at'))}" for entry in stragglers]
    lines += profile_lines(summary)
    lines += attempt_lines(summary)
    lines += host_lines(summary)
    silent = summary.get("never_reported")
    if silent:
        lines.append(f"no status ever arrived from rank{'s' if len(silent) > 1 else ''} {', '.join(map(str, silent))}")
    hang = summary.get("hang")
    if hang and hang.get("text"):
        lines.append(f"{hang['text']}\n  (every rank's stack and collectives: {hang.get('folder') or 'hang/'})")
    failure = summary.get("failure")
    if failure and not root_cause_follows:
        lines.append(f"failure: {where(failure['rank'], failure['node'])}: {failure['summary']}")
        if failure.get("hint"):
            lines.append(f"hint: {failure['hint']}")
    return "\n".join(lines)


def profile_lines(summary: dict[str, Any]) -> list[str]:
    """Which ranks recorded a profile window, and where the traces are."""
    profile = summary.get("profile") or {}
    lines = [
        f"profile: rank {ask['straggler']} (straggler) and rank {ask['median']} (median) were asked to record "
        f"{ask['steps']} steps"
        for ask in profile.get("asked") or []
    ]
    if profile.get("no_straggler"):
        lines.append("profile: --profile-ranks straggler: no straggler was flagged, so no rank recorded a window")
    windows = profile.get("windows") or []
    if windows:
        ranks = ", ".join(str(rank) for rank in sorted({window["rank"] for window in windows}))
        folder = Path(str(windows[0].get("path") or "profile/rank")).parent  # RUN/profile/rank-N, RUN/profile/ascend
        spans = sorted({f"{w['first'] + 1}-{w['last']}" for w in windows if w["last"] > w["first"]})
        recorded = f"recorded steps {', '.join(spans)}" if spans else "recorded no step (the training ended first)"
        lines.append(
            f"profile: rank {ranks} {recorded}; traces in {folder} "
            "(Perfetto, chrome://tracing, tensorboard --logdir; npu-wizard report RUN sums them up)"
        )
    return lines


def failure_log_lines(summary: dict[str, Any]) -> list[str]:
    """The last lines of the failing rank's log a summary keeps, as printed under it."""
    failure = summary.get("failure") or {}
    tail = failure.get("log_tail") or []
    if not tail:
        return []
    return [f"last lines of rank {failure.get('rank')}'s log:", *(f"  | {line}" for line in tail)]


def straggler_line(kind: str, finding: Straggler, wall_s: float) -> str:
    """The plain view's line when a straggler is flagged (`kind` start) or recovers (end)."""
    if kind == "start":
        return (
            f"STRAGGLER: {finding.who()} is {finding.gap_pct:.0f}% slower in {finding.phase} than the other "
            f"ranks (waiting for data + forward, {finding.windows} windows in a row)"
        )
    span = duration((finding.end or finding.start) - finding.start)
    return (
        f"STRAGGLER ENDED: {finding.who()} is back within reach of the others after {span} "
        f"({finding.gap_pct:.0f}% slower in {finding.phase}; the job lost about {finding.lost_pct(wall_s):.0f}%)"
    )
