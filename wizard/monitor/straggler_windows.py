"""What the straggler detector compares: a rank's window, the middle of its recent windows, its jitter, medians
that leave ranks out, the slow subjects of one window, and the seconds a slow window cost the job.

Pure functions of the numbers; wizard/monitor/stragglers.py keeps the state across windows.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

PHASES = ("data", "forward")
Subject = tuple[str, int | None]  # ("rank", rank) or ("node", node)


@dataclass
class Sample:
    """One rank's logging window: when it ended, since when, its steps and their mean seconds per step."""

    time: float
    since: float  # when the rank's previous window ended
    steps: int  # steps since its previous window
    data_s: float
    forward_s: float

    @property
    def compute_s(self) -> float:
        """Its compute time: waiting for data and forward."""
        return self.data_s + self.forward_s


def sliding_middle(recent: deque[Sample]) -> Sample:
    """The middle of `recent` (the newest last) by compute time, as one window of all their steps."""
    newest = recent[-1]
    if len(recent) == 1:
        return newest
    ordered = sorted(recent, key=lambda sample: sample.compute_s)
    middle = ordered[(len(ordered) - 1) // 2 : len(ordered) // 2 + 1]
    data = sum(sample.data_s for sample in middle) / len(middle)
    forward = sum(sample.forward_s for sample in middle) / len(middle)
    return Sample(newest.time, recent[0].since, sum(sample.steps for sample in recent), data, forward)


def relative_jitter(history: deque[float], learn: int) -> float | None:
    """How far a rank's compute time strays from its own middle, window to window: the median deviation, relative."""
    if len(history) < learn:
        return None
    middle = middle_of(list(history))
    if middle <= 0:
        return None
    return middle_of([abs(value - middle) for value in history]) / middle


class Column:
    """One window's values across ranks, sorted once, for medians that leave some ranks out."""

    def __init__(self, values: list[float]) -> None:
        self.values = values
        self._order = sorted(range(len(values)), key=values.__getitem__)
        self._position = {index: position for position, index in enumerate(self._order)}

    def median_without(self, left_out: Iterable[int]) -> float:
        """The median of the values whose index is not in `left_out` (0.0 when none is left)."""
        removed = sorted(self._position[index] for index in left_out)
        count = len(self.values) - len(removed)
        if count <= 0:
            return 0.0
        middle = [self._kth_kept(k, removed) for k in {(count - 1) // 2, count // 2}]
        return sum(middle) / len(middle)

    def _kth_kept(self, k: int, removed: list[int]) -> float:
        position = k
        for gone in removed:  # each removed position at or before ours shifts it one further
            if gone <= position:
                position += 1
            else:
                break
        return self.values[self._order[position]]


def lost_seconds(excess_s: float, forward_gap: float, window_s: float) -> float:
    """The seconds a window of `window_s` lost to a straggler: what its excess cost, the larger of two readings.

    Its excess waiting for data and in forward (`excess_s`) is time every rank
    waited, as is the share of the rest of its step that a forward `forward_gap`
    slower suggests: a slower device or host runs the backward pass slower by as
    much (a node 38% slower costs the job 0.38 / 1.38, 27% of its time).
    """
    slower = max(forward_gap, 0.0)
    return max(0.0, min(window_s, max(excess_s, window_s * slower / (1 + slower))))


def middle_of(values: list[float]) -> float:
    """The median."""
    ordered = sorted(values)
    half = len(ordered) // 2
    return ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2


def slow_subjects(
    samples: dict[int, Sample],
    node_of: Callable[[int], int | None],
    threshold: float,
    only: Collection[Subject] | None = None,
) -> dict[Subject, tuple]:
    """Each slow node and rank of one window: (gap, excess seconds per step, excess per phase, forward gap).

    Ranks are compared with the median of the others, a node (two ranks or more) by its least slow rank with the
    median of the other nodes' ranks; the ranks of a slow node are not judged by themselves.

    With `only`, each of those subjects instead, slow or not: how far it was above in `samples`.
    """
    ranks = sorted(samples)
    column = {
        "compute": Column([samples[r].compute_s for r in ranks]),
        "data": Column([samples[r].data_s for r in ranks]),
        "forward": Column([samples[r].forward_s for r in ranks]),
    }
    nodes: dict[int | None, list[int]] = {}
    for index, rank in enumerate(ranks):
        nodes.setdefault(node_of(rank), []).append(index)
    slow: dict[Subject, tuple] = {}
    on_slow_node: set[int] = set()
    if len(nodes) > 1:
        for node, members in nodes.items():
            if node is None or len(members) < 2 or (only is not None and ("node", node) not in only):
                continue
            baseline = column["compute"].median_without(members)
            values = [column["compute"].values[i] for i in members]
            gap = min(values) / baseline - 1 if baseline > 0 else 0.0
            if gap >= threshold or only is not None:
                on_slow_node.update(members)
                middle = {phase: middle_of([column[phase].values[i] for i in members]) for phase in PHASES}
                others = {phase: column[phase].median_without(members) for phase in PHASES}
                excess = {phase: middle[phase] - others[phase] for phase in PHASES}
                forward_gap = middle["forward"] / others["forward"] - 1 if others["forward"] > 0 else 0.0
                slow[("node", node)] = (gap, max(values) - baseline, excess, forward_gap)
    for index, rank in enumerate(ranks):
        if index in on_slow_node or (only is not None and ("rank", rank) not in only):
            continue
        baseline = column["compute"].median_without([index])
        value = column["compute"].values[index]
        gap = value / baseline - 1 if baseline > 0 else 0.0
        if gap >= threshold or only is not None:
            others = {phase: column[phase].median_without([index]) for phase in PHASES}
            excess = {phase: column[phase].values[index] - others[phase] for phase in PHASES}
            forward = column["forward"].values[index]
            forward_gap = forward / others["forward"] - 1 if others["forward"] > 0 else 0.0
            slow[("rank", rank)] = (gap, value - baseline, excess, forward_gap)
    return slow


def judged_subjects(ranks: Iterable[int], node_of: Callable[[int], int | None]) -> set[Subject]:
    """The subjects a window of `ranks` judges: each rank, and each node with two of them or more (of several)."""
    ranks = list(ranks)
    nodes = Counter(node_of(rank) for rank in ranks)
    judged: set[Subject] = {("rank", rank) for rank in ranks}
    if len(nodes) > 1:
        judged.update(("node", node) for node, count in nodes.items() if node is not None and count >= 2)
    return judged
