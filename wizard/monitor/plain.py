"""The plain view of `npu-wizard run`: the job's line and a line per rank each interval, then the summary.

For logs, pipes and terminals without the live view (`--plain`); it drives the
same job (a `RunningJob`, wizard.monitor.source) as the live view (wizard.monitor.app).
"""

from __future__ import annotations

import signal
import sys
import time
from typing import TextIO

from wizard.monitor.plain_lines import progress_block, restart_lines
from wizard.monitor.source import RunningJob
from wizard.monitor.state import JobState
from wizard.monitor.summary_text import FAILED_OUTCOMES, format_summary, progress_line, straggler_line
from wizard.monitor.terminal import PrintableOut
from wizard.stopping import stop_signals_raise


def run_plain(job: RunningJob, *, out: TextIO | None = None, poll: float = 0.2) -> RunningJob:
    """Start the job, print its line and each rank's per interval, then the summary; return the ended job."""
    # looked up now (a test may have swapped it since import); what the ranks said is shown escaped
    out = PrintableOut(out or sys.stdout)
    job.say = lambda line: print(line, file=out, flush=True)
    print(f"run folder: {job.run_dir}", file=out)
    print(
        f"starting node{'s' if len(job.nodes) > 1 else ''} {', '.join(map(str, job.nodes))} of {job.answers['nodes']}",
        file=out,
    )
    for note in job.notes:
        print(note, file=out)
    # lines are due on the state's clock (the runner's ticker): a wall clock stepped (NTP) neither spams nor silences
    next_line = job.state.now() + job.interval
    reported_hangs: set[int] = set()
    reported_late = False
    reported_verdict: object | None = None
    restarts_said: dict[int, int] = {}
    try:
        with stop_signals_raise():
            job.start()
            while True:
                outcome = job.tick()
                now, heard_now = job.clock(), job.state.now()  # wall time for what is shown; durations on the state's
                for rank in job.state.hung(heard_now):
                    if rank not in reported_hangs:
                        print(f"HUNG: {_hang_line(job.state, rank, heard_now)}", file=out, flush=True)
                        reported_hangs.add(rank)
                verdict = getattr(job, "hang_verdict", None)  # the runner judged the ranks' stacks (hang/)
                if verdict is not None and verdict is not reported_verdict:
                    print(f"WHERE EACH RANK IS: {verdict.text}", file=out, flush=True)
                    reported_verdict = verdict
                late = "" if reported_late else job.state.late_report(heard_now)
                if late:
                    print(f"START-UP DEADLINE: {late}", file=out, flush=True)
                    reported_late = True
                for line in job.engine_lines:
                    print(line, file=out, flush=True)
                job.engine_lines.clear()
                for notice in job.state.notices.fresh():
                    print(f"WARNING from {notice.line()}", file=out, flush=True)
                for kind, finding in job.state.stragglers.fresh():
                    print(straggler_line(kind, finding, now - job.started_at), file=out, flush=True)
                for line in restart_lines(job.state, restarts_said):
                    print(line, file=out, flush=True)
                if outcome is not None:
                    break
                if heard_now >= next_line:
                    print(progress_block(job.state, now - job.started_at, heard_now), file=out, flush=True)
                    next_line += job.interval
                    if next_line <= heard_now:  # behind (the runner was held up): no burst of lines to catch up
                        next_line = heard_now + job.interval
                time.sleep(poll)
    except KeyboardInterrupt as stop:  # Ctrl-C, or StopSignal for TERM and HUP
        job.stop("interrupted", getattr(stop, "signum", signal.SIGINT))
    for line in job.engine_lines:  # what the engine said while stopping the job
        print(line, file=out)
    job.engine_lines.clear()
    print(progress_line(job.state, (job.ended_at or job.clock()) - job.started_at), file=out)
    if job.summary is not None:
        # a failed run's error names the root cause next: the summary does not say it first
        print(format_summary(job.summary, root_cause_follows=job.outcome in FAILED_OUTCOMES), file=out)
    note = job.finished_note()
    if note:
        print(note, file=out)
    job.print_smoke_report(out)
    print(f"events, logs and summary in {job.run_dir}", file=out, flush=True)
    return job


def _hang_line(state: JobState, rank: int, now: float) -> str:
    return next((line for line in state.hang_report(now).splitlines() if line.startswith(f"rank {rank} ")), "")
