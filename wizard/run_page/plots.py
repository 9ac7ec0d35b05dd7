"""The report's plots, drawn with matplotlib's Agg renderer into PNG bytes (no display, no pyplot state).

Up to `EVERY_RANK` ranks each get a line; beyond that each rank is resampled onto one time grid and the plot
shows the median with the min-max and 25-75% bands, so 4096 ranks cost what 16 do. Restarts, checkpoints and
the failure are marked on every time axis; the stragglers the monitor found are shaded on the compute-time plot.
Each rank's peak memory per logged window (runtime/memory.py) has its own plot, where the steps carry it.
A language model's validation losses (its eval events) are drawn on the loss plot, at the time each was written.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from wizard.monitor.terminal import printable
from wizard.run_page.record import RunRecord

EVERY_RANK = 16  # up to this many ranks (or nodes) one line each; beyond, bands
GRID = 240  # time points of the resampled series
WIDTH_PX, HEIGHT_PX, DPI = 1000, 360, 100
SPREAD_HEIGHT_PX = 520
RESTART, CHECKPOINT, FAILURE, STRAGGLER = "#7b3fbf", "#2a7f62", "#c62828", "#f4a261"
VALIDATION = "#000000"


@dataclass(frozen=True)
class Plot:
    """One plot of the report: its PNG, or why there is none."""

    name: str  # the file stem of its PNG: loss, throughput-ranks, ...
    title: str
    png: bytes | None
    missing: str | None = None  # said instead of the plot
    note: str = ""  # one line under it

    @property
    def size(self) -> tuple[int, int]:
        """Width and height of its PNG in pixels."""
        return (WIDTH_PX, SPREAD_HEIGHT_PX if self.name == "compute-spread" else HEIGHT_PX)


class Series:
    """Every rank's sampled values on one time axis (seconds since the run started)."""

    def __init__(self, record: RunRecord, summary: dict[str, Any] | None = None) -> None:
        self.record = record
        self.summary = (record.summary or {}) if summary is None else summary  # stragglers, failure: as the page says
        self.t0 = record.started_at
        ranks = [r for r in sorted(record.ranks) if len(record.ranks[r].times)]
        self.ranks = ranks
        self._row = {rank: row for row, rank in enumerate(ranks)}
        self._matrices: dict[str, np.ndarray] = {}  # per value: every rank on the grid, made once
        firsts = [record.ranks[r].times[0] - self.t0 for r in ranks]
        ends = [record.ranks[r].times[-1] - self.t0 for r in ranks]
        # the span the ranks logged steps in: a run that took minutes to start trained in seconds
        self.grid = np.linspace(min(firsts, default=0.0), max(ends, default=1.0), GRID)

    def raw(self, rank: int, name: str) -> tuple[np.ndarray, np.ndarray]:
        """One rank's sampled points of `name` (loss, rate, forward_s, data_s)."""
        ranked = self.record.ranks[rank]
        return np.frombuffer(ranked.times, dtype=np.float64) - self.t0, np.frombuffer(getattr(ranked, name), np.float32)

    def matrix(self, name: str, ranks: list[int] | None = None) -> np.ndarray:
        """Ranks x grid: each rank's values interpolated onto the grid, NaN outside the span it logged."""
        if name not in self._matrices:
            out = np.full((len(self.ranks), GRID), np.nan, dtype=np.float32)
            slack = self.grid[1] - self.grid[0]  # a grid step: ranks a moment apart still overlap at the ends
            for row, rank in enumerate(self.ranks):
                times, values = self.raw(rank, name)
                keep = ~np.isnan(values)
                if keep.any():
                    times, values = times[keep], values[keep]
                    inside = (self.grid >= times[0] - slack) & (self.grid <= times[-1] + slack)
                    out[row, inside] = np.interp(self.grid[inside], times, values)
            self._matrices[name] = out
        if ranks is None:
            return self._matrices[name]
        return self._matrices[name][[self._row[rank] for rank in ranks]]

    def has(self, name: str) -> bool:
        """Whether any rank logged `name`."""
        return any(np.isfinite(self.raw(rank, name)[1]).any() for rank in self.ranks)

    def nodes(self) -> dict[int, list[int]]:
        """The ranks that logged steps, by node (node -1: unknown)."""
        found: dict[int, list[int]] = {}
        for rank in self.ranks:
            node = self.record.node_of(rank)
            found.setdefault(-1 if node is None else node, []).append(rank)
        return dict(sorted(found.items()))


def draw_all(record: RunRecord, summary: dict[str, Any] | None = None) -> list[Plot]:
    """Every plot of the report, in the order the page shows them (`summary`: the run's effective summary)."""
    series = Series(record, summary)
    if not series.ranks:
        said = "no step events were recorded: the ranks logged no training step"
        if record.ranks:
            said += " (a script without the report hook, or a run that ended before its first logged step)"
        return [
            Plot("loss", "Loss per rank", None, said),
            Plot("throughput-ranks", "Throughput per rank", None, said),
            Plot("throughput-nodes", "Throughput per node", None, said),
            Plot("compute-spread", "Compute-time spread", None, said),
            Plot("memory", "Peak memory per rank", None, said),
        ]
    return [
        _loss(series),
        _per_rank(series, "rate", "Throughput per rank", "samples/s", "each rank's own samples per second"),
        _per_node(series),
        _spread(series),
        _memory(series),
    ]


def _figure(height_px: int = HEIGHT_PX) -> Figure:
    # fixed margins, the legend in the right one: a layout engine would cost seconds on a loaded machine
    figure = Figure(figsize=(WIDTH_PX / DPI, height_px / DPI), dpi=DPI)
    figure.subplots_adjust(left=0.09, right=0.78, top=1 - 36 / height_px, bottom=48 / height_px, hspace=0.45)
    return figure


def png_bytes(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


def _lines_or_bands(axes: Axes, series: Series, name: str, ranks: list[int], label: Callable[[int], str]) -> None:
    """One line per rank up to EVERY_RANK of them, else the median and the bands."""
    if len(ranks) <= EVERY_RANK:
        for rank in ranks:
            times, values = series.raw(rank, name)
            axes.plot(times, values, linewidth=1.2, marker=".", markersize=4, label=label(rank))  # one point shows
        return
    _bands(axes, series.grid, series.matrix(name, ranks), f"{len(ranks)} ranks")


def _bands(axes: Axes, grid: np.ndarray, matrix: np.ndarray, who: str) -> None:
    with warnings.catch_warnings():  # a grid point no rank logged is NaN, and says so
        warnings.simplefilter("ignore", RuntimeWarning)
        low, lower, median, upper, high = np.nanquantile(matrix, [0, 0.25, 0.5, 0.75, 1], axis=0)
    axes.fill_between(grid, low, high, color="#9ecae1", alpha=0.5, label=f"{who}: min-max")
    axes.fill_between(grid, lower, upper, color="#4292c6", alpha=0.5, label=f"{who}: 25-75%")
    axes.plot(grid, median, color="#08306b", linewidth=1.5, label=f"{who}: median")


def _loss(series: Series) -> Plot:
    """Every rank's training loss and, for a language model, the validation loss of its eval events."""
    evaluations = series.record.state.lm_figures.evaluations()
    note = "the loss each rank logged at its logging steps"
    if not evaluations:
        return _per_rank(series, "loss", "Loss per rank", "loss", note)

    def validation(axes: Axes) -> None:
        times = [evaluation.time - series.t0 for evaluation in evaluations]
        values = [evaluation.val_loss for evaluation in evaluations]
        axes.plot(times, values, color=VALIDATION, linestyle="--", marker="o", markersize=5, label="validation loss")

    note += "; black: the validation loss at each evaluation, averaged over every rank"
    return _per_rank(series, "loss", "Loss per rank", "loss", note, also=validation)


def _per_rank(
    series: Series, name: str, title: str, unit: str, note: str, also: Callable[[Axes], None] | None = None
) -> Plot:
    """One line per rank (or the bands) of `name`; `also` draws more on the same axes."""
    if not series.has(name):
        return Plot(_file_name(name), title, None, f"not recorded: no step event carries `{_event_field(name)}`")
    figure = _figure()
    axes = figure.add_subplot()
    _lines_or_bands(axes, series, name, series.ranks, lambda rank: f"rank {rank}")
    if also is not None:
        also(axes)
    _finish(axes, series, title, unit)
    return Plot(_file_name(name), title, png_bytes(figure), note=note)


def _per_node(series: Series) -> Plot:
    title = "Throughput per node"
    if not series.has("rate"):
        return Plot("throughput-nodes", title, None, "not recorded: no step event carries `samples_per_s`")
    figure = _figure()
    axes = figure.add_subplot()
    nodes = series.nodes()
    sums = {}
    for node, ranks in nodes.items():
        matrix = series.matrix("rate", ranks)
        logged = np.isfinite(matrix).any(axis=0)
        sums[node] = np.where(logged, np.nansum(matrix, axis=0), np.nan)
    if len(nodes) <= EVERY_RANK:
        for node, values in sums.items():
            axes.plot(series.grid, values, linewidth=1.4, label="node ?" if node < 0 else f"node {node}")
    else:
        _bands(axes, series.grid, np.array(list(sums.values())), f"{len(nodes)} nodes")
    _finish(axes, series, title, "samples/s")
    return Plot(
        "throughput-nodes", title, png_bytes(figure), note="the samples per second of each node's ranks, summed"
    )


def _spread(series: Series) -> Plot:
    title = "Compute-time spread"
    stragglers = series.summary.get("stragglers") or []
    phases = [(name, label) for name, label in (("forward_s", "forward"), ("data_s", "data wait")) if series.has(name)]
    if not phases:
        said = (
            "not recorded: no step event carries `forward_s` or `data_s` "
            "(mean seconds per step in the forward pass and waiting for data)"
        )
        if stragglers:
            said += f"; the monitor named {len(stragglers)} straggler(s), listed below"
        return Plot("compute-spread", title, None, said)
    figure = _figure(SPREAD_HEIGHT_PX)
    panels = figure.subplots(len(phases), 1, sharex=True, squeeze=False)[:, 0]
    for axes, (name, label) in zip(panels, phases, strict=True):
        _lines_or_bands(axes, series, name, series.ranks, lambda rank: f"rank {rank}")
        phase = "forward" if name == "forward_s" else "data"
        for straggler in (s for s in stragglers if s.get("phase") == phase):
            _shade_straggler(axes, series, straggler, name)
        _finish(axes, series, f"{label}: seconds per step", "s per step", legend=axes is panels[0])
        if axes is not panels[-1]:
            axes.set_xlabel("")
    note = "each rank's mean seconds per step in the forward pass and waiting for data; shaded: stragglers"
    return Plot("compute-spread", title, png_bytes(figure), note=note)


def _memory(series: Series) -> Plot:
    """Each rank's peak memory per logged window, named as the ranks named it; outliers said under it."""
    memory = series.summary.get("memory") or {}
    of = printable(str(memory.get("of") or "peak memory"))
    note = f"each rank's peak per logged window ({of})"
    outliers = [entry.get("rank") for entry in memory.get("outliers") or [] if isinstance(entry, dict)]
    if outliers:
        note += f"; far above the others: rank {', '.join(map(str, outliers))}"
    return _per_rank(series, "memory", "Peak memory per rank", "GiB", note)


def plot_text(text: str) -> str:
    """`text` from a run folder as matplotlib should draw it: control bytes escaped, `$` no mathtext."""
    return printable(text).replace("\n", " ").replace("\t", " ").replace("$", r"\$")


def _shade_straggler(axes: Axes, series: Series, straggler: dict, name: str) -> None:
    start = _seconds(straggler.get("start"), series)
    end = _seconds(straggler.get("end"), series)
    if start is None:
        return
    end = series.grid[-1] if end is None else end
    rank, node = straggler.get("rank"), straggler.get("node")
    who = plot_text(f"rank {rank}" if rank is not None else f"node {node}")
    axes.axvspan(start, end, color=STRAGGLER, alpha=0.35, label=f"straggler: {who} +{straggler.get('gap_pct', 0):.0f}%")
    ranks = [r for r in ([rank] if rank is not None else series.nodes().get(node, [])) if r in series.ranks]
    if ranks:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            median = np.nanmedian(series.matrix(name, ranks), axis=0)
        axes.plot(series.grid, median, color=FAILURE, linewidth=1.5, label=f"{who} (median)" if rank is None else who)


def _finish(axes: Axes, series: Series, title: str, unit: str, *, legend: bool = True) -> None:
    """Title, labels, and the run's restarts, checkpoints and failure marked on the time axis."""
    record = series.record
    axes.set_title(title, loc="left", fontsize=11)
    axes.set_ylabel(unit)
    axes.set_xlabel("seconds since the run started")
    axes.grid(alpha=0.3)
    restarts = sorted({round(t - series.t0, 1) for r in record.ranks.values() for t in r.starts[1:]})
    for index, at in enumerate(restarts[:50]):
        axes.axvline(at, color=RESTART, linestyle="--", linewidth=1, label="restart" if index == 0 else None)
    steps = sorted(
        {round(c["time"] - series.t0, 1) for c in record.checkpoints if isinstance(c.get("time"), (int, float))}
    )
    if steps:
        axes.plot(
            steps,
            [0.0] * len(steps),
            "|",
            color=CHECKPOINT,
            markersize=12,
            transform=axes.get_xaxis_transform(),
            label="checkpoint",
        )
    failure = series.summary.get("failure") or {}
    failed_at = _seconds(failure.get("time"), series)
    if failed_at is not None:
        axes.axvline(failed_at, color=FAILURE, linewidth=1.5, label="failure")
    if legend:
        handles, labels = axes.get_legend_handles_labels()
        if handles:
            axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), ncols=1 if len(handles) <= 12 else 2)


def _seconds(at: object, series: Series) -> float | None:
    return float(at) - series.t0 if isinstance(at, (int, float)) else None


def _file_name(name: str) -> str:
    return {"loss": "loss", "rate": "throughput-ranks", "memory": "memory"}[name]


def _event_field(name: str) -> str:
    return {"loss": "loss", "rate": "samples_per_s", "memory": "memory_peak_bytes"}[name]
