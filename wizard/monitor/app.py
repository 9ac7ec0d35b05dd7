"""The live view: every rank's state, the job's throughput and ETA, a loss plot and a rank's log.

A language model's run has a line more under the job's: its tokens/s, MFU and validation loss.

The app only shows and routes: a `JobSource` (a running `Job`, or a
`RunFolder` being watched) does the work. Its `tick` runs on a worker thread,
since stopping a job waits for processes to end; a lock keeps ticks, stops and
redraws from overlapping.
"""

from __future__ import annotations

import asyncio
import io
import signal
import sys
import threading
import time

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Footer, Log, Sparkline, Static
from textual.widgets.data_table import ColumnKey

from wizard.monitor.ask_stacks import StacksNotCollected, ask_stacks
from wizard.monitor.attach import RunFolder
from wizard.monitor.lm_figures import evaluation_words, rate_words
from wizard.monitor.ranks import where
from wizard.monitor.run_files import RunFileError, open_regular
from wizard.monitor.source import JobSource, RunningJob
from wizard.monitor.state import FAILED, FINISHED, HUNG, RUNNING, STALLED, JobState
from wizard.monitor.summary_text import FAILED_OUTCOMES, duration, eta_text, failure_log_lines, format_summary, log_tail
from wizard.monitor.terminal import PrintableOut, printable
from wizard.stopping import stop_signals_raise

COLUMNS = ("rank", "node", "state", "step", "loss", "samples/s", "peak mem", "beat", "restarts")
LOG_LINES = 200
LOG_CHUNK = 1024 * 1024  # bytes of a rank's log read per redraw: a log growing by gigabytes is caught up with
PLOT_POINTS = 120
SLOW = "slow"  # the state cell of a running rank a straggler flag names: "slow +38%"
ALERT_NOTICES = 3  # the newest warnings shown under the job line
LAUNCHER_EXIT_S = 15.0  # how long quitting waits for launchers whose ranks all finished


class MonitorApp(App[str | None]):
    """The live view of one job; returns the job's outcome (None when left while it runs)."""

    CSS_PATH = "monitor.tcss"
    TITLE = "npu-wizard"
    BINDINGS = [
        Binding("s", "stop_job", "Stop job"),
        Binding("n", "next_rank", "Next rank"),
        Binding("p", "previous_rank", "Prev rank"),
        Binding("w", "where_ranks", "Where is each rank"),
        Binding("q", "quit_view", "Quit"),
        Binding("ctrl+c", "interrupt", "Stop and quit", show=False, priority=True),
    ]

    def __init__(
        self, source: JobSource, *, title: str, owns_job: bool, tick_s: float = 0.5, catch_sigint: bool = False
    ) -> None:
        super().__init__()
        self.catch_sigint = catch_sigint
        self.source = source
        self.job_title = title
        self.owns_job = owns_job  # `run` stops the job on quit; `monitor` only detaches
        self.tick_s = tick_s
        self.selected = 0
        self._lock = threading.Lock()
        self._log_rank: int | None = None
        self._log_offset = 0
        self._asked_verdict = ""  # `monitor`: the verdict of the stacks the runner collected when asked

    def compose(self) -> ComposeResult:
        """The job line, a language model's line, the alert line, the rank table, the loss plot and the log pane."""
        yield Static(id="job")
        yield Static(id="lm")
        yield Static(id="alert")
        yield DataTable(id="ranks", cursor_type="row", zebra_stripes=True)
        with Horizontal(id="lower"):
            with Vertical(id="plot"):
                yield Static(id="loss-label")
                yield Sparkline([], id="loss")
            yield Log(id="log", max_lines=2000)
        yield Footer()

    def on_mount(self) -> None:
        """Fill the table, draw once, then tick on a timer."""
        table = self.query_one(DataTable)
        for column in COLUMNS:
            table.add_column(column, key=column)
        for rank in sorted(self.source.state.ranks):
            table.add_row(*[""] * len(COLUMNS), key=str(rank))
        self.redraw()
        if self.tick_s > 0:
            self.set_interval(self.tick_s, self._schedule_tick)
        if self.catch_sigint:
            # SIGINT from outside (kill -INT) must stop the job as Ctrl-C does, not kill the view;
            # so must TERM and HUP (kill, timeout, systemd, a dropped ssh session)
            loop = asyncio.get_running_loop()
            loop.add_signal_handler(signal.SIGINT, self.action_interrupt)
            for sig in (signal.SIGTERM, signal.SIGHUP):
                loop.add_signal_handler(sig, self._stop_signal, sig)

    # ---- ticking -------------------------------------------------------------------

    def _schedule_tick(self) -> None:
        self.run_worker(self._tick, thread=True, group="tick", exclusive=False, exit_on_error=False)

    def _tick(self) -> None:
        if not self._lock.acquire(blocking=False):
            return
        try:
            self.source.tick()
            self.call_from_thread(self.redraw)
        finally:
            self._lock.release()

    def _stop_signal(self, signum: int) -> None:
        """TERM or HUP: stop the job at once and leave, whatever state it is in."""
        if self.source.outcome is None:
            self._stop_in_worker("interrupted", then_exit=True, signum=signum)
        else:
            self.exit(self.source.outcome)

    def _stop_in_worker(self, outcome: str, then_exit: bool, signum: int = signal.SIGINT) -> None:
        def stop() -> None:
            with self._lock:
                self.source.stop(outcome, signum)
                self.source.tick()
            self.call_from_thread(self.redraw)
            if then_exit:
                self.call_from_thread(self.exit, self.source.outcome)

        self.query_one("#alert", Static).update("stopping the job: TERM, then KILL after the grace period ...")
        self.run_worker(stop, thread=True, group="stop", exclusive=True)

    # ---- drawing -------------------------------------------------------------------

    def redraw(self) -> None:
        """Show the source's current state."""
        state, now, heard_now = self.source.state, self.source.clock(), self.source.state.now()
        end = now if self.source.outcome is None else (self._ended_at() or now)
        self.query_one("#job", Static).update(self._job_line(state, end))
        lm_line, lm_static = self._lm_line(state), self.query_one("#lm", Static)
        lm_static.update(lm_line)
        lm_static.display = bool(lm_line)  # no line for an image model or a user's script
        self.query_one("#alert", Static).update(self._alert(state, heard_now))
        table = self.query_one(DataTable)
        slow = _slow_ranks(state)
        widths = {column: table.columns[ColumnKey(column)] for column in COLUMNS}
        for rank, view in sorted(state.ranks.items()):
            if str(rank) not in table.rows:
                continue
            rank_state = state.state(rank, heard_now)
            if rank_state == RUNNING and rank in slow:
                rank_state = f"{SLOW} +{slow[rank]:.0f}%"
            beat = f"{heard_now - view.last_seen:.0f}s" if view.last_seen and view.outcome is None else "-"
            shown_step = str(view.step)
            if not view.steps_reported and view.printed_at is not None and view.outcome is None:
                # a script that reports no steps
                shown_step = f"printed {max(0.0, heard_now - view.printed_at):.0f}s ago"
            cells = (
                str(rank),
                "?" if view.node is None else str(view.node),
                rank_state,
                shown_step,
                "-" if view.loss is None else f"{view.loss:.4f}",
                "-" if view.samples_per_s is None or view.outcome else f"{view.samples_per_s:,.0f}",
                state.memory.cell(rank),  # the newest window's peak (runtime/memory.py)
                beat,
                str(view.restarts),
            )
            for column, value in zip(COLUMNS, cells, strict=True):
                # a column widens for what comes later ("printed 3s ago" where "0" was first drawn); only
                # then, for a narrower value would have the table measure the whole column again
                wider = column == "state" or len(value) > widths[column].content_width
                table.update_cell(str(rank), column, _styled(column, value), update_width=wider)
        self._draw_plot(state)
        self._follow_log()

    def _ended_at(self) -> float | None:
        return (self.source.summary or {}).get("ended_at")

    def _job_line(self, state: JobState, now: float) -> str:
        total = state.total_steps()
        step = f"step {state.newest_step()}{f'/{total}' if total else ''}"
        quietest = state.quietest()  # a duration: on the state's own clock, not `now` (wall time, for the header)
        if quietest is not None and not any(view.steps_reported for view in state.ranks.values()):
            step = f"no steps reported; quietest: rank {quietest[0]}, printed {quietest[1]:.0f}s ago"
        head = f"{_shown(self.job_title)}  |  {duration(now - self.source.started_at)}  |  {step}"
        saved = state.last_checkpoint()
        if saved is not None:
            head += f"  |  checkpoint at step {saved[1]}"
        attempt = getattr(self.source, "attempt_words", "")  # a job run with --restarts (wizard/run/attempts.py)
        if attempt:
            head += f"  |  {_shown(attempt)}"
        if self.source.outcome is not None:
            return f"{head}  |  {_shown(self.source.outcome.upper())} (q to quit)"
        return f"{head}  |  {state.throughput():,.0f} samples/s  |  {eta_text(state)}"

    def _lm_line(self, state: JobState) -> str:
        """`language model  |  25,600 tokens/s  |  MFU 42.0%  |  val loss 2.3456 at step 400`, or "" for other runs.

        The rates are the newest window's, shown while the job runs; the validation loss stays after it ended.
        """
        rates = rate_words(state.lm_figures) if self.source.outcome is None else []
        said = [*rates, *filter(None, [evaluation_words(state.lm_figures)])]
        return "  |  ".join(["language model", *said]) if said else ""

    def _alert(self, state: JobState, now: float) -> str:
        summary = self.source.summary or {}
        failure = summary.get("failure")
        hang = (summary.get("hang") or {}).get("text")
        colour = "b" if (summary.get("hang") or {}).get("reason") == "asked" else "b red"  # asked for: no hang
        hang = f"\n[{colour}]{_shown(hang)}[/]" if hang else ""
        if failure:
            hint = f"\nhint: {_shown(failure['hint'])}" if failure.get("hint") else ""
            return (
                f"[b red]root cause: {where(failure['rank'], failure['node'])}: {_shown(failure['summary'])}[/]"
                f"{hint}{hang}"
            )
        if hang:
            return hang.lstrip("\n")
        unjudged = summary.get("stragglers_not_judged")
        unjudged = f"stragglers not judged: {_shown(unjudged)}" if unjudged else ""
        if self.source.outcome == "finished":
            return "\n".join(filter(None, ("[b green]the job finished: press q for the summary[/]", unjudged)))
        verdict = _verdict_text(self.source) or self._asked_verdict
        report = "\n".join(filter(None, (state.late_report(now), state.hang_report(now), verdict)))
        report = report if self.source.outcome is None else ""
        notices = state.notices.all()[-ALERT_NOTICES:]
        said = "\n".join(f"warning from {_shown(notice.line())}" for notice in notices)
        slow = "\n".join(
            [
                f"straggler: {finding.who()} is {finding.gap_pct:.0f}% slower in {finding.phase} than the other ranks"
                for finding in state.stragglers.active()
            ]
            + [f"memory outlier: {outlier.words()}" for outlier in state.memory.outliers()]
        )
        return "\n".join(
            filter(
                None,
                (
                    f"[b yellow]{_shown(report)}[/]" if report else "",
                    f"[b magenta]{_shown(slow)}[/]" if slow and self.source.outcome is None else "",
                    f"[yellow]{said}[/]" if said else "",
                    unjudged,
                ),
            )
        )

    def _draw_plot(self, state: JobState) -> None:
        view = state.ranks.get(self.selected)
        losses = view.losses.newest(PLOT_POINTS) if view else []
        self.query_one(Sparkline).data = losses
        if losses:
            label = f"loss, rank {self.selected}: {losses[0]:.4f} -> {losses[-1]:.4f} (min {min(losses):.4f})"
        else:
            label = f"loss, rank {self.selected}: no step logged yet"
        self.query_one("#loss-label", Static).update(label)

    def _follow_log(self) -> None:
        log = self.query_one(Log)
        path = self.source.run_dir / "logs" / f"rank-{self.selected}.log"
        if self._log_rank != self.selected or (self._log_offset < 0 and path.is_file()):
            log.clear()
            self._log_rank = self.selected
            self._log_offset = 0
            if not path.is_file():
                view = self.source.state.ranks.get(self.selected)
                where = f"node {view.node} ({view.host})" if view and view.node is not None else "its node"
                log.write_line(f"waiting for rank {self.selected}'s log (on {where})")
                self._log_offset = -1  # placeholder shown: replace it once the log appears
                return
            log.write_lines([printable(line) for line in log_tail(self.source.run_dir, self.selected, LOG_LINES)])
            self._log_offset = path.stat().st_size
            return
        if path.is_file() and path.stat().st_size > self._log_offset:
            try:
                handle = open_regular(path)
            except RunFileError:  # swapped for a FIFO or a link since it was shown: read no more of it
                return
            with handle or io.BytesIO() as handle:  # none: gone since it was shown
                handle.seek(self._log_offset)
                chunk = handle.read(LOG_CHUNK)
            complete = chunk[: chunk.rfind(b"\n") + 1]
            if not complete and len(chunk) == LOG_CHUNK:  # a line longer than a chunk: shown in pieces
                complete = chunk
            self._log_offset += len(complete)
            log.write_lines([printable(line) for line in complete.decode(errors="replace").splitlines()])

    # ---- keys ----------------------------------------------------------------------

    def on_data_table_row_highlighted(self, message: DataTable.RowHighlighted) -> None:
        """Follow the highlighted rank in the plot and the log pane."""
        if message.row_key.value is not None:
            self.selected = int(message.row_key.value)
            self._draw_plot(self.source.state)
            self._follow_log()

    def action_next_rank(self) -> None:
        """Select the next rank."""
        table = self.query_one(DataTable)
        table.move_cursor(row=(table.cursor_row + 1) % max(1, table.row_count))

    def action_previous_rank(self) -> None:
        """Select the previous rank."""
        table = self.query_one(DataTable)
        table.move_cursor(row=(table.cursor_row - 1) % max(1, table.row_count))

    def action_where_ranks(self) -> None:
        """Collect every rank's stack and collectives now (RUN/hang/) and show the verdict."""
        if self.source.outcome is not None:
            return
        self.query_one("#alert", Static).update("asking every rank where it is (at most 10 s for the answers) ...")
        self.run_worker(self._where_ranks, thread=True, group="stacks", exclusive=True, exit_on_error=False)

    def _where_ranks(self) -> None:
        collect = getattr(self.source, "collect_stacks", None)
        if collect is not None:  # `run`: this process is the runner and asks on the status stream
            with self._lock:
                collect("asked")
        elif isinstance(self.source, RunFolder):  # `monitor`: the runner is asked through the run folder
            said = io.StringIO()
            try:
                ask_stacks(self.source, said)
            except StacksNotCollected as error:
                self._asked_verdict = str(error)
            else:
                verdicts = [line for line in said.getvalue().splitlines() if line.startswith("WHERE EACH RANK IS")]
                self._asked_verdict = verdicts[-1] if verdicts else ""
        self.call_from_thread(self.redraw)

    def action_stop_job(self) -> None:
        """Stop every process of the job; the view stays to show the end."""
        if self.source.outcome is None:
            self._stop_in_worker("interrupted", then_exit=False)

    def action_quit_view(self) -> None:
        """Leave the view; in `run`, a job still running is stopped first."""
        if self.owns_job and self.source.outcome is None and self.source.state.ranks and self.source.state.finished():
            # every rank is done and only the launchers are exiting: let them, it is no interrupt
            self.query_one("#alert", Static).update("every rank finished; waiting for the launchers to exit ...")
            self.run_worker(self._finish_then_exit, thread=True, group="stop", exclusive=True)
        elif self.owns_job and self.source.outcome is None:
            self._stop_in_worker("interrupted", then_exit=True)
        else:
            self.exit(self.source.outcome)

    def _finish_then_exit(self) -> None:
        deadline = time.monotonic() + LAUNCHER_EXIT_S
        while self.source.outcome is None and time.monotonic() < deadline:
            with self._lock:
                self.source.tick()
            time.sleep(0.1)
        if self.source.outcome is None:
            with self._lock:
                self.source.stop("interrupted")
        self.call_from_thread(self.exit, self.source.outcome)

    def action_interrupt(self) -> None:
        """Ctrl-C: as quit."""
        self.action_quit_view()


def _shown(text: object) -> str:
    """A text of the run in markup: its control characters escaped, each square bracket no markup.

    Every `[` is escaped, not only those rich's escape() takes for a tag (lowercase): Textual reads `[B]`
    as one too. A backslash at the end would escape the closing tag that follows: a space keeps it apart.
    """
    shown = printable(str(text)).replace("[", "\\[")
    return f"{shown} " if shown.endswith("\\") else shown


def _verdict_text(source: object) -> str:
    """Where each rank is, as judged when the runner last collected the ranks' stacks (Job.hang_verdict)."""
    return str(getattr(getattr(source, "hang_verdict", None), "text", "") or "")


def _slow_ranks(state: JobState) -> dict[int, float]:
    """Each rank a straggler flag names, directly or through its node, with the flag's gap (%)."""
    slow: dict[int, float] = {}
    for finding in state.stragglers.active():
        if finding.rank is not None:
            slow[finding.rank] = finding.gap_pct
        else:
            slow.update({rank: finding.gap_pct for rank in state.ranks if state.node_of(rank) == finding.node})
    return slow


def _styled(column: str, value: str) -> Text:
    colour = {FAILED: "bold red", HUNG: "bold red", STALLED: "bold yellow", FINISHED: "green"}.get(value)
    if column == "state" and value.startswith(SLOW):
        colour = "bold magenta"
    return Text(value, style=colour or "") if column == "state" else Text(value)


def run_live(job: RunningJob) -> None:
    """Start the job and show it live until the user quits; the summary is printed after."""
    with stop_signals_raise():  # TERM or HUP while the engine starts (a hung host check) stops it at once
        job.start()
    title = f"{job.answers['project_name']}  |  {job.answers['launcher']}  |  nodes {job.nodes}"
    MonitorApp(job, title=title, owns_job=True, catch_sigint=True).run()
    if job.outcome is None:
        job.stop("interrupted")
    out = PrintableOut(sys.stdout)  # what the ranks said, shown escaped
    for note in job.notes:
        print(note, file=out)
    if job.summary is not None:
        # a failed run's error names the root cause next: the summary does not say it first
        print(format_summary(job.summary, root_cause_follows=job.outcome in FAILED_OUTCOMES), file=out)
    note = job.finished_note()
    if note:
        print(note, file=out)
    job.print_smoke_report(out)  # type: ignore[arg-type]  # a TextIO to what it prints
    print(f"events, logs and summary in {job.run_dir}", file=out, flush=True)


def monitor_live(folder: object) -> None:
    """Watch a run folder live until the user quits; print its summary if it ended."""
    from wizard.monitor.attach import RunFolder

    assert isinstance(folder, RunFolder)
    folder.tick()
    MonitorApp(folder, title=f"{folder.run_dir}", owns_job=False).run()
    out = PrintableOut(sys.stdout)  # what the ranks said, shown escaped
    for note in folder.notes:
        print(note, file=out)
    if folder.summary is not None:
        print(format_summary(folder.summary), file=out)
        for line in failure_log_lines(folder.summary):
            print(line, file=out, flush=True)
