"""What the profile windows of a run recorded (npu-wizard run --profile), summed up for the report.

Each rank's chrome trace (profile/rank-<R>/*.pt.trace.json, or torch_npu's
ASCEND_PROFILER_OUTPUT/trace_view.json under profile/ascend/) is read as a
stream (trace_reader.py), at most EVENT_CAP events of it. Of its complete
events ("ph": "X"):

- the time by category is the host's view of the recorded steps: on the
  thread that ran them (the one with the ProfilerStep#N spans), each
  event's self time (its time less its children's) counts for communication
  when it or an event around it is a collective (c10d, gloo, NCCL, HCCL),
  for data wait when it is in the data loader's next batch, else for
  compute; the steps' time that no event covers is communication where a
  collective ran meanwhile on another thread (gloo's, a device's stream:
  the step waited for it), else idle;
- the operators are every event but the step spans, by self time per step,
  on every thread (a device's kernels too).
"""

from __future__ import annotations

import math
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from wizard.run_page.trace_reader import Reading, trace_events

EVENT_CAP = 500_000  # events read of one trace: some seconds of reading, under about 100 MB of memory
TOP = 10
NAME_LIMIT = 200  # characters of an operator's name kept: a crafted trace's long names cost memory and time
OPERATOR_CAP = 1_000  # distinct operator names counted apart; the rest add up under OTHER_OPERATORS
OTHER_OPERATORS = "(other operators)"
CATEGORIES = ("compute", "communication", "data wait", "idle")
STEP_SPAN = re.compile(r"^ProfilerStep#\d+$")
COMMUNICATION = re.compile(
    r"c10d::|nccl|gloo|hccl|hcom|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|broadcast|barrier|"
    r"record_param_comms",
    re.IGNORECASE,
)
DATA_WAIT = re.compile(r"DataLoader|data wait", re.IGNORECASE)
LEFT_OUT_CATEGORIES = {"python_function", "Trace", "overhead"}
GPU_STEP_CATEGORY = "gpu_user_annotation"
# torch_npu's trace_view.json writes ts and dur as strings ("1700000000123.456"), on every release
DECIMAL = re.compile(r"-?[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?")
# rank-<R>.<stamp>.pt.trace.json (torch); rank-<R>_<pid>_<stamp>_ascend_pt (torch_npu from the 7.0.0 branches,
# whose pid sorts by name before the stamp), rank-<R>_<stamp>_ascend_pt (6.0.0)
TRACE_STAMP = re.compile(r"rank-\d+(?:\.(?P<ns>\d+)\.pt\.trace\.json|(?:_\d+)?_(?P<stamp>\d+)_ascend_pt)")
THREAD_ID = (str, int, float, type(None))  # what a pid or tid may be (a chrome trace writes numbers or names)


@dataclass
class RankProfile:
    """One rank's recorded window, summed up."""

    rank: int
    trace: Path
    steps: int = 0
    step_us: float = 0.0  # the recorded steps' wall time, on the thread that ran them
    categories: dict[str, float] = field(default_factory=dict)  # microseconds
    operators: dict[str, list[float]] = field(default_factory=dict)  # name: [self microseconds, calls]
    reading: Reading = field(default_factory=Reading)
    odd_threads: int = 0  # events left out: their pid or tid is no number or string
    odd_times: int = 0  # events left out: their ts or dur is no finite number (as a number or a string)
    folded: int = 0  # events whose operator came past OPERATOR_CAP distinct names: counted as OTHER_OPERATORS

    def per_step_ms(self, microseconds: float) -> float:
        """`microseconds` over the window, in milliseconds per recorded step."""
        return microseconds / 1000 / max(1, self.steps)

    def top(self, count: int = TOP) -> list[tuple[str, float, int]]:
        """The `count` operators of most self time: (name, ms per step, calls)."""
        ranked = sorted(self.operators.items(), key=lambda item: -item[1][0])[:count]
        return [(name, self.per_step_ms(us), int(calls)) for name, (us, calls) in ranked]


def find_traces(run_dir: Path) -> dict[int, Path]:
    """Each profiled rank's newest chrome trace in profile/, by the stamp in its name, then its time."""
    return {rank: paths[-1] for rank, paths in find_all_traces(run_dir).items()}


def find_all_traces(run_dir: Path) -> dict[int, list[Path]]:
    """Every chrome trace of each profiled rank in profile/, oldest first (by the stamp in its name, then its time)."""
    found: dict[int, list[tuple[tuple[int, int], Path]]] = {}
    folder = run_dir / "profile"
    candidates = [*folder.glob("rank-*/rank-*.pt.trace.json"), *folder.glob("ascend/rank-*_ascend_pt")]
    for path in candidates:
        match = re.match(r"rank-(\d+)", path.name)
        if match is None:
            continue
        stamp = TRACE_STAMP.fullmatch(path.name)
        if path.is_dir():  # torch_npu: the parsed chrome trace inside its folder
            path = path / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
            if not path.is_file():
                continue
        key = (int(stamp.group("ns") or stamp.group("stamp")) if stamp else -1, _modified(path))
        found.setdefault(int(match.group(1)), []).append((key, path))
    return {rank: [path for _, path in sorted(traces)] for rank, traces in sorted(found.items())}


def traces_of_asks(asked: list[dict], traces: dict[int, list[Path]]) -> list[dict[int, Path]]:
    """For each straggler ask (in the order asked), the trace each of its two ranks recorded for it.

    A rank records one window per ask it is in, in order: its n-th trace answers the n-th ask that named it.
    A rank with fewer traces than asks (an ask it missed, a window not parsed yet) has none for the later ones.
    """
    taken: dict[int, int] = {}
    paired = []
    for ask in asked:
        mine: dict[int, Path] = {}
        for rank in (ask.get("straggler"), ask.get("median")):
            if not isinstance(rank, int) or rank in mine:
                continue
            index = taken.get(rank, 0)
            taken[rank] = index + 1
            if index < len(traces.get(rank, [])):
                mine[rank] = traces[rank][index]
        paired.append(mine)
    return paired


def _modified(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return -1


def read_profile(rank: int, trace: Path, cap: int = EVENT_CAP) -> RankProfile:
    """Sum up one rank's trace, reading at most `cap` events of it."""
    profile = RankProfile(rank, trace)
    spans: dict[tuple[object, object], list[tuple[float, float, str]]] = defaultdict(list)
    step_threads: set[tuple[object, object]] = set()
    names: set[str] = set()
    for event in trace_events(trace, cap, profile.reading):
        if event.get("ph") != "X" or event.get("cat") in LEFT_OUT_CATEGORIES:
            continue
        name = event.get("name")
        if not isinstance(name, str):
            continue
        start, length = _time(event.get("ts")), _time(event.get("dur"))
        if start is None or length is None:
            profile.odd_times += 1
            continue
        thread = (event.get("pid"), event.get("tid"))
        if not all(isinstance(part, THREAD_ID) for part in thread):  # a list would be no key of `spans`
            profile.odd_threads += 1
            continue
        if STEP_SPAN.match(name) and event.get("cat") == GPU_STEP_CATEGORY:
            continue  # a CUDA trace marks each step again on the device's stream: the host's mark counts
        if STEP_SPAN.match(name):
            step_threads.add(thread)
            profile.steps += 1
            profile.step_us += length
        else:
            name = _bounded_name(profile, name, names)
        spans[thread].append((start, length, sys.intern(name)))  # a name is one string, however often
    gaps: list[tuple[float, float]] = []
    for thread, events in spans.items():
        gaps += _add_thread(profile, events, on_step_thread=thread in step_threads)
    elsewhere = [
        (start, start + length)
        for thread, events in spans.items()
        if thread not in step_threads
        for start, length, name in events
        if COMMUNICATION.search(name)
    ]
    waited = _overlap(gaps, _merged(elsewhere))
    if waited:  # the step thread waited while a collective ran on another thread (gloo's, a device's stream)
        categories = profile.categories
        categories["idle"] = categories.get("idle", 0.0) - waited
        categories["communication"] = categories.get("communication", 0.0) + waited
    return profile


def _bounded_name(profile: RankProfile, name: str, names: set[str]) -> str:
    """`name` cut to NAME_LIMIT characters; OTHER_OPERATORS once OPERATOR_CAP distinct names were seen."""
    if len(name) > NAME_LIMIT:
        name = name[: NAME_LIMIT - 1] + "…"
    if name in names:
        return name
    if len(names) >= OPERATOR_CAP:
        profile.folded += 1
        return OTHER_OPERATORS
    names.add(name)
    return name


def _merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _overlap(gaps: list[tuple[float, float]], busy: list[tuple[float, float]]) -> float:
    """Microseconds of `gaps` (disjoint) covered by `busy` (merged, sorted)."""
    total, index = 0.0, 0
    for start, end in sorted(gaps):
        while index < len(busy) and busy[index][1] <= start:
            index += 1
        probe = index
        while probe < len(busy) and busy[probe][0] < end:
            total += min(end, busy[probe][1]) - max(start, busy[probe][0])
            probe += 1
    return total


def _time(value: object) -> float | None:
    """A ts or dur in microseconds: a JSON number, or a decimal string as torch_npu writes them; None if neither."""
    if isinstance(value, str) and DECIMAL.fullmatch(value):
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and abs(value) < 1e18 else None


def _add_thread(
    profile: RankProfile, events: list[tuple[float, float, str]], *, on_step_thread: bool
) -> list[tuple[float, float]]:
    """Self times of one thread's events (nested by their times), into the operators and categories.

    Returns the gaps of the steps on the step thread: the times no operator of the step covers.
    """
    events.sort(key=lambda item: (item[0], -item[1]))
    stack: list[list] = []  # [end, name, self microseconds, category, start, the step's children]
    categories = profile.categories
    gaps: list[tuple[float, float]] = []

    def close(entry: list) -> None:
        end, name, own, category, start, children = entry
        if STEP_SPAN.match(name):
            if on_step_thread:
                categories["idle"] = categories.get("idle", 0.0) + own
                for child_start, child_end in [*children, (end, end)]:
                    if child_start > start:
                        gaps.append((start, child_start))
                    start = max(start, child_end)
            return
        counted = profile.operators.setdefault(name, [0.0, 0])
        counted[0] += own
        counted[1] += 1
        if on_step_thread and category is not None:
            categories[category] = categories.get(category, 0.0) + own

    for start, length, name in events:
        while stack and stack[-1][0] <= start:
            close(stack.pop())
        outer = stack[-1] if stack else None
        if outer is not None:
            outer[2] -= min(length, outer[0] - start)
            if outer[5] is not None:
                outer[5].append((start, min(start + length, outer[0])))
        category = None
        if outer is not None and outer[3] is not None:
            category = outer[3] if outer[3] != "compute" else _category(name)
        elif outer is not None:  # directly in a step span: a top-level operator of the step
            category = _category(name)
        children = [] if STEP_SPAN.match(name) else None
        stack.append([start + length, name, length, category, start, children])
    while stack:
        close(stack.pop())
    return gaps


def _category(name: str) -> str:
    if COMMUNICATION.search(name):
        return "communication"
    if DATA_WAIT.search(name):
        return "data wait"
    return "compute"


def differences(slow: RankProfile, median: RankProfile, count: int = TOP) -> list[tuple[str, float, float]]:
    """The operators whose time per step differs most between two ranks: (name, slow ms, median ms).

    Ranked by the size of the difference, either way: the median rank's wait in a collective for the straggler
    counts as much as the straggler's own excess (the sign of slow ms - median ms tells which).
    """
    names = set(slow.operators) | set(median.operators)
    rows = [
        (
            name,
            slow.per_step_ms(slow.operators.get(name, [0.0, 0])[0]),
            median.per_step_ms(median.operators.get(name, [0.0, 0])[0]),
        )
        for name in names
    ]
    rows.sort(key=lambda row: (-abs(row[1] - row[2]), row[0]))
    return rows[:count]
