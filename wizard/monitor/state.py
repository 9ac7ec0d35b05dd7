"""What every rank of a job is doing, folded from its events: the monitor's model.

Events come from the ranks' files on this node and from the status stream
(every node's ranks); both go through `JobState.ingest`, which drops
duplicates. States, hangs, throughput, ETA and the root cause of a failure are
computed here, with no UI and no processes, so tests feed events directly.

Two clocks. A live state (the runner's, a monitor's: `ticker` given, time.monotonic) judges every duration,
a rank's silence, the time since its last step, the start-up deadline, on that ticker, from when each event
was heard here: the ranks' stamps and this host's wall clock may step (NTP) by any amount, and an event's
`time` is the rank's own clock. A state replaying files after the fact (no ticker) has only the stamps, and
measures on them. Wall times (`clock`, the events' `time`) are kept only for what people read: when a rank
started, failed or stepped first, the order of failures.
A repeat is known by its process and number (`pid`, `seq`: runtime/events.py); an event of an older runtime
without them by its time, as then: no newer than the newest of its kind is a repeat.
Memory is bounded: each rank keeps its current state, running sums and a short
history (the loss plot's points), never its events, so thousands of ranks can
be watched for days.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

from runtime.events import clip
from runtime.status import LOST
from wizard.monitor.hints import explain
from wizard.monitor.lm_figures import LanguageModelFigures
from wizard.monitor.memory_peaks import MemoryPeaks
from wizard.monitor.notices import Notices
from wizard.monitor.ranks import Failure, RankView
from wizard.monitor.status_server import RECEIVED
from wizard.monitor.stragglers import StragglerDetector
from wizard.monitor.values import is_step, is_time, number

STARTING, RUNNING, STALLED, HUNG, FINISHED, FAILED = "starting", "running", "stalled", "hung", "finished", "failed"
PREEMPTED = "preempted"  # saved a checkpoint on a stop signal and exited (runtime/preemption.py)
DEFAULT_HANG_AFTER = 30.0
RATE_WINDOW = 5  # step events used for the step rate behind the ETA
MESSAGE_SHOWN = 2000  # characters of a rank's error message kept for the report (its log has the rest)
START_MARGIN_S = 60.0  # a rank may take HCCL_CONNECT_TIMEOUT plus this to report that it started


class JobState:
    """Every rank's view, updated by `ingest`, read by the plain and live views."""

    def __init__(
        self,
        world_size: int,
        *,
        hang_after: float = DEFAULT_HANG_AFTER,
        clock: Callable[[], float] = time.time,
        ticker: Callable[[], float] | None = None,
        nodes: int | None = None,
        start_deadline: float | None = None,
    ) -> None:
        self.world_size = world_size
        self.nodes = _count(nodes, None) or None  # run.json's node_count: as anyone wrote it
        self.hang_after = hang_after
        self.start_deadline = start_deadline  # seconds from now for every rank to report `started`
        self.expected: set[int] | None = None  # the ranks that report here (None: all); the deadline counts these
        # what became of each node's launch script this runner started itself (see late_report)
        self.launchers: dict[int, str] = {}
        self.clock = clock  # wall time, for stamps people read
        self.ticker = ticker  # durations, from when each event was heard; None: on the events' own stamps
        self.opened_at = self.now()
        self.ranks: dict[int, RankView] = {rank: RankView(rank) for rank in range(world_size)}
        self.stopping_since: float | None = None  # wall time: ranks lost after it were stopped
        self.stopping_heard: float | None = None  # the same moment on the state's own clock (now())
        self.notices = Notices()
        self.stragglers = StragglerDetector(self.node_of)  # fed the step events' data_s and forward_s
        self.lm_figures = LanguageModelFigures()  # a language model's tokens/s, MFU and validation losses
        self.memory = MemoryPeaks()  # each rank's peak memory per logged window (runtime/memory.py)
        self.profiles: list[dict] = []  # the profile windows the ranks recorded (runtime/profile_window.py)
        self.profile_asks: list[dict] = []  # the straggler windows the runner asked for: straggler, median, steps

    def view(self, rank: int) -> RankView:
        """The view of `rank`, made on first sight (a rank beyond the world size too)."""
        return self.ranks.setdefault(rank, RankView(rank))

    def now(self) -> float:
        """Now on the clock this state measures durations on: the ticker, else (replaying files) the wall clock."""
        return self.ticker() if self.ticker is not None else self.clock()

    def ingest_all(
        self, events: Mapping[int, Iterable[dict]] | Iterable[dict], heard: Callable[[dict], float] | None = None
    ) -> None:
        """Fold many events in: a {rank: events} mapping or a flat sequence; `heard` as for `ingest`, per event."""
        flat = (e for rank_events in events.values() for e in rank_events) if isinstance(events, Mapping) else events
        for event in flat:
            self.ingest(event, None if heard is None else heard(event))

    def ingest(self, event: dict, heard: float | None = None) -> None:
        """Fold one event in; a duplicate (seen in the file and on the stream) is ignored.

        `heard`: when it reached this state, on its ticker; by default now (its stamp, without a ticker).
        """
        rank, kind, at = event.get("rank"), event.get("event"), event.get("time")
        if not is_step(rank) or not isinstance(kind, str) or not is_time(at):  # NaN, 1e300, 400 digits: no time
            return
        view = self.view(rank)
        if view.repeats(kind, event):
            return
        said = event.get(RECEIVED, at)  # wall time: when node 0's stream took it, else the rank's own stamp
        if self.ticker is None:
            heard = said
        elif heard is None:
            heard = self.ticker()
        if kind != LOST:
            view.last_seen = max(view.last_seen or heard, heard)
            view.last_said = max(view.last_said or said, said)
        handler = getattr(self, f"_on_{kind}", None)
        if handler is not None:
            handler(view, event, heard)

    def backdated(self, event: dict) -> float:
        """When an event already written before this state opened would have been heard: its age, by its stamp.

        For the events a monitor finds on opening a run folder: a rank silent for an hour is silent for an hour
        at once, not only one deadline after the monitor opened. Never later than now (a stamp ahead of this
        host's clock, a clock stepped back since, is taken as heard now).
        """
        said = event.get(RECEIVED, event.get("time"))
        now = self.now()
        if self.ticker is None or not is_time(said):
            return now
        return now - max(0.0, self.clock() - float(said))  # type: ignore[arg-type]

    def _on_hello(self, view: RankView, event: dict, at: float) -> None:
        view.pid = event.get("pid", view.pid)
        view.host = event.get("host", view.host)

    def _on_started(self, view: RankView, event: dict, at: float) -> None:
        view.starts += 1
        view.node = _count(event.get("node"), view.node)
        view.host = event.get("host", view.host)
        view.device = event.get("device", view.device)
        view.pid = event.get("pid", view.pid)
        view.world_size = _count(event.get("world_size"), view.world_size) or None
        view.total_steps = _count(event.get("total_steps"), view.total_steps)
        view.resumed_step = _count(event.get("resumed_step"), 0)
        view.step = view.resumed_step
        view.started_at = view.started_at or event["time"]
        view.progress_at = view.started_heard = at
        view.outcome, view.ended_at, view.ended_heard, view.error = None, None, None, None
        self.stragglers.rank_started(view.rank, view.step)

    def _on_step(self, view: RankView, event: dict, at: float) -> None:
        self._progress(view, event, at)
        if view.first_step_at is None:
            view.first_step_at, view.first_step = event["time"], view.step
        # a user's script says its total with its steps (runtime/report.py)
        view.total_steps = _count(event.get("total_steps"), view.total_steps)
        loss, samples_per_s = event.get("loss"), number(event.get("samples_per_s"))
        if type(loss) is float or number(loss) is not None:  # a loss gone NaN is news, shown as it came
            view.loss = float(loss)
            view.losses.append(view.loss)
        if samples_per_s is not None:
            view.samples_per_s = samples_per_s / (view.world_size or self.world_size or 1)
            if view.samples_per_s > 0:
                view.rate_count += 1
                view.inverse_rate_sum += 1 / view.samples_per_s
        view.step_times = [*view.step_times[-RATE_WINDOW:], (event["time"], view.step)]
        times = [number(event.get(phase)) for phase in ("data_s", "forward_s")]
        if any(time is not None for time in times):
            view.compute_s = sum(time or 0.0 for time in times)
        self.stragglers.add(view.rank, event)
        self.lm_figures.step_done(event)
        self.memory.step_done(event)

    def _on_eval(self, view: RankView, event: dict, at: float) -> None:
        self.lm_figures.evaluated(event)

    def _on_profile(self, view: RankView, event: dict, at: float) -> None:
        fields = {key: event.get(key) for key in ("first", "last", "path", "reason", "outcome")}
        self.profiles.append({"rank": view.rank, **fields})

    def _on_heartbeat(self, view: RankView, event: dict, at: float) -> None:
        self._progress(view, event, at)
        silent = event.get("silent_s")
        if is_time(silent) and silent >= 0:
            # measured on the rank's host and applied to the arrival time here: no clock skew between hosts
            view.printed_at = max(view.printed_at or 0.0, at - silent)
            if not view.steps_reported and view.progress_at is not None:
                # a rank that sends no steps makes progress when it prints
                view.progress_at = max(view.progress_at, view.printed_at)

    def _progress(self, view: RankView, event: dict, at: float) -> None:
        step = _count(event.get("step"), view.step)
        if step != view.step or view.progress_at is None:
            view.progress_at = at
        view.step = step
        view.epoch = _count(event.get("epoch"), view.epoch)

    def _on_finished(self, view: RankView, event: dict, at: float) -> None:
        view.outcome, view.ended_at = FINISHED, event["time"]
        view.step = _count(event.get("step"), view.step)
        view.exit_code = event.get("exit_code", view.exit_code)
        self.stragglers.rank_ended(view.rank)

    def _on_preempted(self, view: RankView, event: dict, at: float) -> None:
        view.outcome, view.ended_at = PREEMPTED, event["time"]
        view.step = _count(event.get("step"), view.step)
        view.stop_signal = str(event.get("signal") or "") or None
        self.stragglers.rank_ended(view.rank)

    def _on_stop_asked(self, view: RankView, event: dict, at: float) -> None:
        view.asks_stop = True

    def _on_error(self, view: RankView, event: dict, at: float) -> None:
        # kept bounded: an event file may hold a message of any size
        error = {key: event.get(key) for key in ("type", "message", "traceback")}
        error["type"] = clip(str(error["type"]), "start", 200)
        error["message"] = clip(str(error["message"] or ""), "start", MESSAGE_SHOWN)
        error["traceback"] = clip(str(error["traceback"] or ""), "end")
        view.outcome, view.ended_at, view.error = FAILED, event["time"], error
        view.exit_code = event.get("exit_code", view.exit_code)
        self.stragglers.rank_ended(view.rank)

    def _on_checkpoint(self, view: RankView, event: dict, at: float) -> None:
        if isinstance(event.get("step"), int):
            view.checkpoint = (event["step"], str(event.get("path") or ""), event["time"])

    def _on_warning(self, view: RankView, event: dict, at: float) -> None:
        said = event.get(RECEIVED, event["time"])  # wall time: a notice says when
        self.notices.add(view.rank, str(event.get("kind") or "warning"), str(event.get("message") or ""), said)

    def _on_lost(self, view: RankView, event: dict, at: float) -> None:
        pid = event.get("pid")
        if pid is not None and view.pid is not None and pid != view.pid:
            return  # an earlier process of the rank (the launcher restarted it): the new one is watched
        self.vanished(view.rank, event.get(RECEIVED, event["time"]))  # wall time: failures are ordered by it

    def vanished(self, rank: int, at: float) -> None:
        """The rank's process is gone without a finished or error event."""
        view = self.view(rank)
        if view.outcome is None and (self.stopping_since is None or at < self.stopping_since):
            view.outcome, view.ended_at = LOST, at
            view.ended_heard = self.now() if self.ticker is not None else at
        self.stragglers.rank_ended(rank)

    def launcher_succeeded(self, node: int) -> None:
        """`node`'s launch script exited 0: each of its ranks ended with 0, so none of them vanished.

        A script that ends with os._exit(0) (or a C library's exit) says nothing on its way out;
        its launcher saw how it ended, and is believed.
        """
        for rank, view in self.ranks.items():
            if view.outcome == LOST and self.node_of(rank) == node:
                view.outcome, view.exit_code = FINISHED, 0

    def judged_at(self, ended_at: float) -> float:
        """The moment a job ended at `ended_at` (wall time) is judged at, on this state's clock (now()).

        When the monitor began stopping it (ranks it stopped were fine until then), else its end.
        """
        if self.ticker is None:
            return self.stopping_since or ended_at
        return self.stopping_heard or self.now()

    def stopping(self) -> None:
        """The monitor is stopping the job: ranks vanishing from now on were stopped, not failed."""
        self.stopping_since = self.stopping_since or self.clock()
        self.stopping_heard = self.stopping_heard or self.now()

    # ---- reading ---------------------------------------------------------------

    def state(self, rank: int, now: float | None = None) -> str:
        """starting, running, stalled, hung, finished or failed."""
        view = self.view(rank)
        if view.outcome in (FINISHED, PREEMPTED):
            return view.outcome
        if view.outcome in (FAILED, LOST):
            return FAILED
        if not view.starts:
            return STARTING
        now = self.now() if now is None else now
        if view.last_seen is not None and now - view.last_seen > self.hang_after:
            return HUNG
        if view.progress_at is not None and now - view.progress_at > self.hang_after:
            return STALLED
        return RUNNING

    def hung(self, now: float | None = None) -> list[int]:
        """Ranks silent (no heartbeat, no step) for longer than hang_after."""
        return [rank for rank in self.ranks if self.state(rank, now) == HUNG]

    def stalled(self, now: float | None = None) -> bool:
        """True when no running rank made a step for hang_after: the whole job waits.

        Not while a rank is still starting: the others wait for it in their first collective,
        and the start-up deadline (late) names it if it never comes.
        """
        states = {rank: self.state(rank, now) for rank in self.ranks}
        if any(
            state == STARTING and (self.expected is None or rank in self.expected) for rank, state in states.items()
        ):
            return False
        live = [s for s in states.values() if s in (RUNNING, STALLED, HUNG)]
        return bool(live) and all(s == STALLED for s in live)

    def hang_report(self, now: float | None = None) -> str:
        """Which ranks are hung, and which wait, in words."""
        now = self.now() if now is None else now
        lines = []
        for rank in self.hung(now):
            view = self.ranks[rank]
            silent = now - (view.last_seen or now)
            lines.append(
                f"rank {rank}{_on_node(view)} is hung: no heartbeat or step for {silent:.0f}s "
                f"(at step {view.step}; process {view.pid} stopped, frozen or unreachable?)"
            )
        waiting = [rank for rank in self.ranks if self.state(rank, now) == STALLED]
        stepping = [rank for rank in waiting if self.ranks[rank].steps_reported or self.ranks[rank].printed_at is None]
        quiet = [rank for rank in waiting if rank not in stepping]
        if stepping:
            lines.append(f"ranks {_ranges(stepping)} are alive but made no step for {self.hang_after:.0f}s")
        if quiet:
            lines.append(f"ranks {_ranges(quiet)} are alive but printed nothing for {self.hang_after:.0f}s")
        return "\n".join(lines)

    def quietest(self, now: float | None = None) -> tuple[int, float] | None:
        """(rank, seconds) of the running rank that printed longest ago, among ranks that send no steps."""
        now = self.now() if now is None else now
        quiet = [
            (now - view.printed_at, rank)
            for rank, view in self.ranks.items()
            if view.printed_at is not None and not view.steps_reported and view.outcome is None
        ]
        if not quiet:
            return None
        seconds, rank = max(quiet)
        return rank, max(0.0, seconds)

    def late(self, now: float | None = None) -> list[int]:
        """Ranks that did not report `started` within the start-up deadline."""
        now = self.now() if now is None else now
        if self.start_deadline is None or now - self.opened_at <= self.start_deadline:
            return []
        return [
            rank
            for rank, view in sorted(self.ranks.items())
            if not view.starts and view.outcome is None and (self.expected is None or rank in self.expected)
        ]

    def late_report(self, now: float | None = None) -> str:
        """The nodes that never joined and the ranks still starting after the deadline, in words.

        A node in `launchers` had its launch script started by this runner: it did not fail to
        join, its ranks did not report; what became of its launcher is said instead.
        """
        late = self.late(now)
        launchers = self.launchers
        deadline = f"{self.start_deadline or 0:.0f}s"
        lines = []
        silent: dict[int | None, list[int]] = {}
        for rank in (rank for rank in late if self.ranks[rank].last_seen is None):
            silent.setdefault(self.node_of(rank), []).append(rank)
        for node, ranks in silent.items():
            if node is not None and node in launchers:
                lines.append(
                    f"node {node}: no status from its ranks {_ranges(ranks)} within {deadline}; {launchers[node]}"
                )
            elif node is not None and ranks == list(self.ranks_of_node(node)):
                lines.append(f"node {node} never joined: no status from its ranks {_ranges(ranks)} within {deadline}")
            else:
                on_node = "" if node is None else f" (node {node})"
                lines.append(f"rank{'s' * (len(ranks) > 1)} {_ranges(ranks)}{on_node}: no status within {deadline}")
        for rank in (rank for rank in late if self.ranks[rank].last_seen is not None):
            node = self.node_of(rank)
            lines.append(
                f"rank {rank}{'' if node is None else f' (node {node})'} is still starting after {deadline} "
                f"(process {self.ranks[rank].pid}: waiting for the other ranks at init?)"
            )
        return "\n".join(lines)

    def node_of(self, rank: int) -> int | None:
        """The node a rank runs on: as it said, else from the layout (ranks fill nodes in order)."""
        view = self.ranks.get(rank)
        if view is not None and view.node is not None:
            return view.node
        if not self.nodes or self.world_size % self.nodes:
            return None
        return rank // (self.world_size // self.nodes)

    def ranks_of_node(self, node: int) -> range:
        """The ranks the layout puts on `node`."""
        per_node = self.world_size // (self.nodes or 1)
        return range(node * per_node, (node + 1) * per_node)

    def finished(self) -> bool:
        """True when every rank finished."""
        return all(view.outcome == FINISHED for view in self.ranks.values())

    def preempted(self) -> tuple[int, str | None] | None:
        """(step, signal) where every rank saved at that step on a stop signal and exited; else None."""
        views = list(self.ranks.values())
        if len(views) < self.world_size or not all(view.outcome == PREEMPTED for view in views):
            return None
        steps = {view.step for view in views}
        return (steps.pop(), views[0].stop_signal) if len(steps) == 1 else None

    def throughput(self) -> float:
        """Samples per second of the ranks still training, summed."""
        return sum(v.samples_per_s or 0.0 for v in self.ranks.values() if v.starts and v.outcome is None)

    def newest_step(self) -> int:
        """The furthest step any rank reached."""
        return max((view.step for view in self.ranks.values()), default=0)

    def total_steps(self) -> int | None:
        """Steps of the whole run, when the ranks said."""
        return next((view.total_steps for view in self.ranks.values() if view.total_steps), None)

    def last_checkpoint(self) -> tuple[int, int, str] | None:
        """(rank, step, path) of the newest checkpoint any rank wrote, or None."""
        written = [(view.checkpoint, rank) for rank, view in self.ranks.items() if view.checkpoint is not None]
        if not written:
            return None
        (step, path, _), rank = max(written, key=lambda found: (found[0][0], found[0][2]))
        return rank, step, path

    def eta(self) -> float | None:
        """Seconds to the last step at the recent step rate, or None when unknown."""
        total = self.total_steps()
        times = max((view.step_times for view in self.ranks.values()), key=len, default=[])
        if total is None or len(times) < 2:
            return None
        (t0, s0), (t1, s1) = times[0], times[-1]
        if t1 <= t0 or s1 <= s0:
            return None
        return max(0.0, (total - self.newest_step()) * (t1 - t0) / (s1 - s0))

    def failures(self) -> list[Failure]:
        """Every rank that failed or vanished, earliest first."""
        found = []
        for view in self.ranks.values():
            if view.outcome == FAILED and view.error is not None:
                summary = f"{view.error.get('type')}: {view.error.get('message')}"
                text = f"{summary}\n{view.error.get('traceback', '')}"
                found.append(
                    Failure(
                        view.rank,
                        view.node,
                        view.ended_at or 0.0,
                        "error",
                        summary,
                        view.error.get("traceback", ""),
                        explain(text),
                        view.device,
                        view.pid,
                        self.memory.last_peak(view.rank),
                    )
                )
            elif view.outcome == LOST:
                # a script that reports no steps is at no step npu-wizard knows of
                where = f"at step {view.step} " if view.steps_reported else ""
                summary = (
                    f"its process{f' {view.pid}' if view.pid else ''} vanished without an error "
                    f"{where}(killed: kill -9, the OOM killer, or a crash in native code?)"
                )
                lost = Failure(view.rank, view.node, view.ended_at or 0.0, "vanished", summary)
                found.append(
                    replace(lost, device=view.device, pid=view.pid, memory_peak=self.memory.last_peak(view.rank))
                )
        return sorted(found, key=lambda failure: failure.time)

    def root_cause(self) -> Failure | None:
        """The first failure by time that was not caused by another rank's; else the first."""
        failures = self.failures()
        primary = [failure for failure in failures if not failure.secondary]
        return (primary or failures or [None])[0]


def _count(value: object, otherwise: int | None) -> int | None:
    """`value` where it is a whole number of zero or more, else `otherwise`: an events file may say anything."""
    return value if is_step(value) and value >= 0 else otherwise


def _on_node(view: RankView) -> str:
    return f" (node {view.node})" if view.node is not None else ""


def _ranges(ranks: list[int]) -> str:
    return ", ".join(map(str, sorted(ranks)))
