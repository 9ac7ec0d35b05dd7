"""Name the straggler: the rank, or the whole node, whose own work is slower than everyone else's.

Every rank of a DDP job waits for the slowest in the gradient all_reduce, so
their steps take equally long and their samples/s say nothing. What differs is
the work no other rank takes part in: waiting for data and the forward pass,
which each `step` event reports as `data_s` and `forward_s` (runtime/timing.py),
the mean seconds per step of that logging window. Their sum is the rank's
compute time.

A window is one step number, judged with the ranks that logged it (ranks
logging at different strides share only some); each rank's first window
after it (re)started is left out (it holds the start-up: the first shuffle,
allocations). Once every reporting rank has reached a window,
each rank's compute time is compared with the median of the other ranks',
and each node's (with two ranks or more) with the median of the ranks on the
other nodes, taking its least slow rank: a node is slow only when all of its
ranks are. One above the threshold for WINDOWS (3) windows, and slow for
FLAG_S (15) seconds at least, is flagged, from the first of its slow windows
(and of the windows just before that were slow by themselves); a rank on a
flagged node is named through its node. Once above the threshold, a subject
stays slow on a lower bar (the threshold below with half the jitter's part);
one window below that ends a streak not yet flagged, and WINDOWS windows in a
row end a flag, at the end of its last window that was slow by itself. A
window that lacks a subject (its rank, or all but one rank of its node) neither
continues nor ends its streak.

What is compared is robust to the host. Windows of a few hundred
milliseconds (a small model logging every 40 steps) are at the mercy of the
scheduler: a rank put off its core for a few milliseconds in a window whose
forward passes add up to 16 ms reads as 30% slower. So:

- each rank's compute time is the middle (median) of its windows that ended
  in the last SPAN_S (5) seconds, the newest always included: one odd
  window moves it not, a rank that stays slower does; a window longer than
  the span is compared alone;
- the threshold is THRESHOLD (15%), or NOISE_K (3) times the job's own
  jitter where that is more. A rank's jitter is how far its windows stray
  from their own middle (the median deviation, relative) over the last
  NOISE_S (30) seconds; the job's is the lower third over its ranks (NOISE_RANKS
  of them at most, evenly spread), so that the ranks a slowdown unsettles do
  not raise the bar against themselves. Until LEARN_WINDOWS (5) windows are
  known nothing is judged. On a quiet accelerator the jitter is a few percent
  and the threshold 15%; four CPU ranks on a loaded two-core machine jitter
  by 10-25%;
- a flag waits for FLAG_S: such a machine also slows one rank by 40-90% for
  ten seconds at a time, while a straggler that matters lasts minutes.

Replayed on 20 uniform 2 x 2 CPU runs of a minute at loads of 3 to 13
(benchmarks/straggler_uniform_runs.py --keep), the windows as they are raised
5-7 flags a run; the middle and the jitter left 3 flags in 2 of the 20 runs,
the 15 s none; a rank cut to 10% of a core for 30 s at a load of 10 is flagged from
1 s after the cut for 33 s.

The share of the job a straggler cost ("lost") is, per slow window, the
larger of its excess waiting for data and in forward times the window's
steps, and the part of the window a forward that much slower stands for if
the rest of its step is slower by as much (a node 38% slower costs 0.38 /
1.38 = 27% of the window), summed over its windows and divided by the job's
wall time. Each window counts with its own times, not the middle. It assumes
the excess is not hidden behind other work, so it says "about".

Pure: no processes, no clock; JobState feeds it step events. The numbers it compares window by window
(the middle, the jitter, the medians, what a window cost) are wizard/monitor/straggler_windows.py.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from wizard.monitor.straggler_windows import (
    PHASES,
    Sample,
    Subject,
    judged_subjects,
    lost_seconds,
    relative_jitter,
    sliding_middle,
    slow_subjects,
)
from wizard.monitor.values import is_step, is_time

THRESHOLD = 0.15  # compute time this far above the median is slow
WINDOWS = 3  # slow windows in a row that raise a flag, and normal ones that end it
FLAG_S = 15.0  # and the seconds they must last: a host puts a rank off its cores for seconds, not minutes
SPAN_S = 5.0  # the sliding middle's span: a rank's windows that ended this long before its newest
NOISE_S = 30.0  # the windows a rank's jitter is measured over: those of the last 30 s, and at least NOISE_WINDOWS
NOISE_WINDOWS = 10
NOISE_K = 3.0  # a subject is slow only this many times the job's jitter above the others (and THRESHOLD)
NOISE_RANKS = 64  # the ranks, evenly spread, whose jitter is measured
LEARN_WINDOWS = 5  # the judged windows the job's jitter is learnt from before any is judged
PENDING_LIMIT = 64  # windows kept waiting for a lagging rank before they are judged without it


@dataclass
class Straggler:
    """A rank (or a whole node, `rank` None) that was slower than the others, from `start` to `end`."""

    rank: int | None
    node: int | None
    phase: str  # "data" or "forward": where most of its excess went
    start: float
    end: float | None = None  # None: still slow
    gap_pct: float = 0.0  # its compute time above the median, in percent, averaged over its slow windows
    lost_s: float = 0.0  # seconds every rank waited for it
    windows: int = 0  # its slow windows

    def who(self) -> str:
        """`node 1` or `rank 3 (node 1)`."""
        if self.rank is None:
            return f"node {self.node}"
        return f"rank {self.rank}" + (f" (node {self.node})" if self.node is not None else "")

    def lost_pct(self, wall_s: float) -> float:
        """The share of a job of `wall_s` seconds this straggler cost, in percent."""
        return 100 * self.lost_s / wall_s if wall_s > 0 else 0.0

    def as_dict(self, wall_s: float) -> dict[str, object]:
        """The summary.json entry."""
        return {
            "rank": self.rank,
            "node": self.node,
            "phase": self.phase,
            "start": self.start,
            "end": self.end,
            "gap_pct": round(self.gap_pct, 1),
            "lost_pct": round(self.lost_pct(wall_s), 1),
        }


def describe(entry: dict, until: float | None = None) -> str:
    """`node 1 was 38% slower in forward for 4m00s: the job lost about 27%` from a summary entry."""
    rank, node = entry.get("rank"), entry.get("node")
    who = f"node {node}" if rank is None else f"rank {rank}" + (f" (node {node})" if node is not None else "")
    end = entry.get("end") if entry.get("end") is not None else until
    span = f" for {_span(end - entry['start'])}" if end is not None else ""
    still = " (still slow at the end)" if entry.get("end") is None else ""
    return (
        f"{who} was {entry['gap_pct']:.0f}% slower in {entry['phase']}{span}{still}: "
        f"the job lost about {entry['lost_pct']:.0f}%"
    )


def _span(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"


_Key = tuple[int, int]  # a window: (era, step)


@dataclass
class _Streak:
    """One subject's run of slow windows, before and while it is flagged."""

    start: float
    slow: int = 0
    strong: int = 0  # of them, those above the full threshold (the others were above the lower bar only)
    normal: int = 0  # normal windows in a row since the last slow one, while flagged
    gap_sum: float = 0.0
    lost_s: float = 0.0
    excess: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    last_slow_end: float = 0.0
    finding: Straggler | None = None


class StragglerDetector:
    """Compares the ranks' compute time window by window and keeps what it found."""

    def __init__(
        self,
        node_of: Callable[[int], int | None],
        *,
        threshold: float = THRESHOLD,
        windows: int = WINDOWS,
        span_s: float = SPAN_S,
        noise_k: float = NOISE_K,
        learn: int = LEARN_WINDOWS,
    ) -> None:
        self.node_of = node_of
        self.threshold = threshold
        self.windows = windows
        self.span_s = span_s
        self.noise_k = noise_k
        self.learn = max(1, learn)
        self._history: dict[int, deque[float]] = {}  # rank -> compute time of its judged windows of NOISE_S
        self._history_ends: dict[int, deque[float]] = {}
        self.findings: list[Straggler] = []  # every flag, open and ended, in the order raised
        self.judged = 0  # windows compared across ranks: none means nothing was judged, not that no one was slow
        self.timed = False  # whether any step event carried data_s and forward_s, which are compared
        self._fresh: list[tuple[str, Straggler]] = []
        # A window is known by (era, step): a rank's era goes up when it (re)starts and when its step
        # numbers start again (a script counting steps per epoch), as every rank's do at once.
        self._era: dict[int, int] = {}
        self._pending: dict[_Key, dict[int, Sample]] = {}  # window -> rank -> its sample
        self._newest: dict[int, _Key] = {}  # rank -> the newest window it reported
        self._at_step: Counter[_Key] = Counter()  # window -> ranks whose newest it is: few, as ranks keep in step
        self._warm: set[int] = set()  # ranks past their first window since they started
        self._last: dict[int, tuple[int, float]] = {}  # rank -> (step, time) of its previous window
        self._recent: dict[int, deque[Sample]] = {}  # rank -> its judged windows of the last span_s seconds
        self._judged_step: _Key | None = None
        self._streaks: dict[Subject, _Streak] = {}
        # (start, end, {subject: seconds lost}, subjects judged) of the judged windows of the last span_s seconds:
        # the subjects slow in each by itself, and those it had the ranks to judge
        self._alone: deque[tuple[float, float, dict[Subject, float], set[Subject]]] = deque()

    def add(self, rank: int, event: dict) -> None:
        """Take one step event; a window every rank has reached is judged at once."""
        step, at = event.get("step"), event.get("time")
        times = [event.get(f"{phase}_s") for phase in PHASES]
        if not is_step(step):
            return
        previous = self._last.get(rank)
        if previous is not None and step < previous[0]:  # counting again: a new era, whose first window warms up
            self._era[rank] = self._era.get(rank, 0) + 1
            self._warm.discard(rank)
            previous = None
        key = (self._era.get(rank, 0), step)
        self._set_newest(rank, key)  # a window no longer waits for this rank, timed or not
        if not is_time(at):
            return
        self._last[rank] = (step, float(at))
        warming_up = rank not in self._warm  # its first window holds the start: the first shuffle, allocations
        self._warm.add(rank)
        timed = all(is_time(t) for t in times)
        self.timed = self.timed or timed
        late = self._judged_step is not None and key <= self._judged_step
        if timed and not warming_up and not late and previous is not None:
            since, steps = previous[1], step - previous[0]
            sample = Sample(float(at), since, steps, float(times[0]), float(times[1]))
            self._pending.setdefault(key, {})[rank] = sample
        self._judge_ready()

    def rank_started(self, rank: int, step: int = 0) -> None:
        """The rank started (again) at `step`: windows after it, in its new era, wait for its report."""
        self._era[rank] = self._era.get(rank, 0) + 1
        self._set_newest(rank, (self._era[rank], step))
        self._warm.discard(rank)
        self._last.pop(rank, None)
        self._recent.pop(rank, None)  # its windows before the restart say nothing of the new process
        self._history.pop(rank, None)
        self._history_ends.pop(rank, None)

    def rank_ended(self, rank: int) -> None:
        """The rank finished or failed: no window waits for it any more."""
        self._set_newest(rank, None)
        self._judge_ready()

    def _set_newest(self, rank: int, key: _Key | None) -> None:
        old = self._newest.pop(rank, None)
        if old is not None:
            self._at_step[old] -= 1
            if not self._at_step[old]:
                del self._at_step[old]
        if key is not None:
            self._newest[rank] = key
            self._at_step[key] += 1

    def active(self) -> list[Straggler]:
        """The flags still raised."""
        return [finding for finding in self.findings if finding.end is None]

    def fresh(self) -> list[tuple[str, Straggler]]:
        """("start" | "end", flag) for each flag raised or ended since the last call."""
        fresh, self._fresh = self._fresh, []
        return fresh

    def as_dicts(self, wall_s: float) -> list[dict[str, object]]:
        """Every flag, as summary.json lists them."""
        return [finding.as_dict(wall_s) for finding in self.findings]

    # ---- judging -------------------------------------------------------------------

    def _judge_ready(self) -> None:
        while self._pending:
            key = min(self._pending)
            reached = not self._at_step or min(self._at_step) >= key
            if not reached and len(self._pending) <= PENDING_LIMIT:
                return
            self._judge(key, self._pending.pop(key))

    def _judge(self, key: _Key, samples: dict[int, Sample]) -> None:
        end = max(sample.time for sample in samples.values())
        start = min(sample.since for sample in samples.values())
        steps = max(sample.steps for sample in samples.values())
        self._judged_step = key
        for rank, sample in samples.items():
            recent = self._recent.setdefault(rank, deque())
            recent.append(sample)
            while recent[0].time < sample.time - self.span_s:
                recent.popleft()
        if len(samples) < 2:
            return
        noise = self._noise(samples)
        if noise is None:
            return  # the job's first windows: its jitter is not known yet
        self.judged += 1
        threshold = max(self.threshold, self.noise_k * noise)
        hold = max(self.threshold, self.noise_k * noise / 2)  # what keeps a raised flag up
        sliding = {rank: sliding_middle(self._recent[rank]) for rank in samples}
        slow = {
            key: found
            for key, found in slow_subjects(sliding, self.node_of, hold).items()
            if found[0] >= threshold or key in self._streaks
        }
        judged = judged_subjects(samples, self.node_of)
        alone = slow_subjects(samples, self.node_of, threshold)  # slow in this window by itself
        alone.update(slow_subjects(samples, self.node_of, threshold, only={key for key in slow if key not in alone}))
        window_s = end - start
        for key, (gap, _, excess, _) in slow.items():
            if key not in self._streaks:
                self._streaks[key] = self._new_streak(key, start)
            own_gap, own_excess_s, _, own_forward_gap = alone[key]
            lost_s = lost_seconds(own_excess_s * steps, own_forward_gap, window_s)
            self._slow_window(key, end, gap, lost_s, excess, own_gap >= threshold, gap >= threshold)
        for key in [key for key in self._streaks if key in judged and key not in slow]:
            self._normal_window(key)  # a window without the subject (another stride, a lost line) says nothing
        slow_alone = {
            key: lost_seconds(excess_s * steps, forward_gap, window_s)
            for key, (gap, excess_s, _, forward_gap) in alone.items()
            if gap >= threshold
        }
        self._alone.append((start, end, slow_alone, judged))
        while self._alone[0][1] < end - self.span_s:
            self._alone.popleft()

    def _new_streak(self, key: Subject, start: float) -> _Streak:
        """A streak for `key`, from the first of the windows just before that were slow by themselves.

        The sliding mean lags a slowdown of a few tens of percent by up to a
        span: those windows belong to the straggler, and their seconds to what it cost.
        """
        lost_s = 0.0
        for earlier_start, _, slow_alone, judged in reversed(self._alone):
            if key not in judged:
                continue
            if key not in slow_alone:
                break
            start, lost_s = earlier_start, lost_s + slow_alone[key]
        return _Streak(start=start, lost_s=lost_s)

    def _noise(self, samples: dict[int, Sample]) -> float | None:
        """The job's own jitter: the lower third over ranks of each one's jitter (a few slow ranks move it not)."""
        ranks = sorted(samples)
        every = max(1, len(ranks) // NOISE_RANKS)
        jitters = []
        for rank in ranks:
            history = self._history.setdefault(rank, deque())
            ends = self._history_ends.setdefault(rank, deque())
            history.append(samples[rank].compute_s)
            ends.append(samples[rank].time)
            while ends[0] < samples[rank].time - NOISE_S and len(ends) > NOISE_WINDOWS:
                ends.popleft()
                history.popleft()
        for rank in ranks[::every]:
            jitter = relative_jitter(self._history[rank], self.learn)
            if jitter is not None:
                jitters.append(jitter)
        if not jitters:
            return None
        jitters.sort()
        return jitters[(len(jitters) - 1) // 3]

    def _slow_window(
        self,
        key: Subject,
        end: float,
        gap: float,
        lost_s: float,
        excess: dict[str, float],
        slow_alone: bool,
        strong: bool,
    ) -> None:
        """One more window in which `key` was slow: above the full threshold (`strong`) or the lower bar.

        `slow_alone`: this window by itself was above the threshold too.
        """
        streak = self._streaks[key]
        streak.slow += 1
        streak.strong += strong
        streak.normal = 0
        streak.gap_sum += gap
        streak.lost_s += lost_s
        for phase in PHASES:
            streak.excess[phase] += excess[phase]
        if slow_alone or not streak.last_slow_end:  # a mean still high after a recovery does not extend the flag
            streak.last_slow_end = end
        if streak.finding is None and streak.strong >= self.windows and end - streak.start >= FLAG_S:
            kind, who = key
            rank = who if kind == "rank" else None
            node = self.node_of(who) if kind == "rank" and who is not None else who
            streak.finding = Straggler(rank, node, "forward", streak.start)
            self.findings.append(streak.finding)
            self._fresh.append(("start", streak.finding))
        if streak.finding is not None:
            finding = streak.finding
            finding.windows = streak.slow
            finding.gap_pct = 100 * streak.gap_sum / streak.slow
            finding.lost_s = streak.lost_s
            finding.phase = max(PHASES, key=lambda phase: streak.excess[phase])

    def _normal_window(self, key: Subject) -> None:
        streak = self._streaks[key]
        if streak.finding is None:
            del self._streaks[key]  # slow windows must come in a row
            return
        streak.normal += 1
        if streak.normal >= self.windows:
            streak.finding.end = streak.last_slow_end
            self._fresh.append(("end", streak.finding))
            del self._streaks[key]
