"""The report's "Where each rank was": the hang verdict, a timeline of every rank up to the hang, and a table.

The verdict comes from the run folder's hang/ files (wizard/monitor/hang_verdict.py), else from summary.json's
"hang" where the files are gone. The timeline has a row per rank (a row per group of ranks beyond EVERY_ROW):
when it stepped, the straggler flags the monitor raised before, and where it was at the hang: in the collective
the others wait in, out of step with them (never entered, another collective), outside any collective, or
silent. Drawn like the report's other plots (matplotlib's Agg renderer, PNG inside the page).
"""

from __future__ import annotations

import base64
from html import escape
from typing import Any

from matplotlib.figure import Figure

from wizard.monitor.hang_verdict import hang_summary, ranks_text
from wizard.run_page.plots import DPI, STRAGGLER, WIDTH_PX, plot_text, png_bytes
from wizard.run_page.record import RunRecord

EVERY_ROW = 64  # up to this many ranks a row each on the timeline and in the table; beyond, a row per group
ROW_PX, MIN_HEIGHT_PX = 22, 200
MARKS = {  # each kind of place at the hang: colour, marker, legend
    "waiting": ("#1f6feb", "o", "waits in the collective"),
    "outside": ("#2a7f62", "s", "outside any collective"),
    "never_entered": ("#c62828", "D", "never entered it"),
    "differs": ("#c62828", "P", "in another collective"),
    "elsewhere": ("#9a6700", "s", "elsewhere"),
    "did_not_answer": ("#1f2328", "X", "did not answer"),
}
STEPPING = "#b6c2cf"


def hang_of(record: RunRecord, summary: dict[str, Any]) -> dict[str, Any] | None:
    """The verdict on the run's hang: from its hang/ files, else as summary.json kept it; None for no hang."""
    return hang_summary(record.run_dir) or summary.get("hang") or None


def hang_section(record: RunRecord, summary: dict[str, Any]) -> str:
    """The section's HTML ("" for a run that did not hang)."""
    hang = hang_of(record, summary)
    if not hang or not hang.get("text"):
        return ""
    rows = _rows(hang)
    asked = hang.get("reason") == "asked"  # a snapshot the user asked for (monitor --stacks), no hang verdict
    at = "when the stacks were asked" if asked else "at the hang"
    problems = "".join(f"<li>{escape(str(line))}</li>" for line in hang.get("problems") or [])
    folder = f'<p class="meta">stacks and recorder dumps: {escape(str(hang.get("folder") or "hang/"))}</p>'
    verdict = (
        f'<h2 id="hang">Where each rank was{f" {at}" if asked else ""}</h2>'
        f'<div class="box{"" if asked else " failure"}"><p><b>{escape(str(hang["text"]))}</b></p>{folder}'
        + (f"<p>files not read:</p><ul>{problems}</ul>" if problems else "")
        + "</div>"
    )
    if not rows:  # no rank's place kept (a summary.json written by something else)
        return verdict
    png, (width, height) = timeline(record, summary, hang, rows), _size(rows)
    data = base64.b64encode(png).decode("ascii")
    return (
        verdict + f'<figure id="hang-timeline"><img class="plot" id="plot-hang-timeline" alt="Where each rank was" '
        f'width="{width}" height="{height}" src="data:image/png;base64,{data}">'
        f"<figcaption>from each rank's start to its last logged step (grey), the straggler flags before "
        f"(orange), and where it was {at}</figcaption></figure>" + _table(rows, at)
    )


def _rows(hang: dict[str, Any]) -> list[tuple[str, list[int], dict[str, Any]]]:
    """(label, ranks, group) per row: a rank each, or a group each beyond EVERY_ROW ranks."""
    groups = [g for g in hang.get("groups") or [] if isinstance(g, dict) and g.get("ranks")]
    if sum(len(g["ranks"]) for g in groups) <= EVERY_ROW:
        found = [(f"rank {rank}", [rank], group) for group in groups for rank in group["ranks"]]
        return sorted(found, key=lambda row: row[1][0])
    return [(ranks_text(group["ranks"]), group["ranks"], group) for group in groups[:EVERY_ROW]]


def _size(rows: list[Any]) -> tuple[int, int]:
    return WIDTH_PX, max(MIN_HEIGHT_PX, 90 + ROW_PX * len(rows))


def timeline(record: RunRecord, summary: dict[str, Any], hang: dict[str, Any], rows: list[Any]) -> bytes:
    """The timeline as PNG: a row per rank (or group), seconds since the run started along."""
    width, height = _size(rows)
    figure = Figure(figsize=(width / DPI, height / DPI), dpi=DPI)
    figure.subplots_adjust(left=0.16, right=0.78, top=1 - 36 / height, bottom=48 / height)
    axes = figure.add_subplot()
    t0 = record.started_at
    at = hang.get("time")
    hang_x = (at - t0) if isinstance(at, (int, float)) else None
    labelled: set[str] = set()
    for y, (_, ranks, group) in enumerate(rows):
        spans = [_stepped(record, rank) for rank in ranks]
        spans = [s for s in spans if s is not None]
        if spans:
            start, end = min(s[0] for s in spans) - t0, max(s[1] for s in spans) - t0
            label = _once("start to last logged step", labelled)
            axes.barh(y, max(end - start, 0.2), left=start, height=0.5, color=STEPPING, label=label)
        for begin, end in _flags(record, summary.get("stragglers") or [], ranks, at):
            label = _once("straggler flag", labelled)
            axes.barh(y, max(end - begin, 0.2), left=begin - t0, height=0.7, color=STRAGGLER, alpha=0.8, label=label)
        if hang_x is not None:
            colour, marker, words = MARKS.get(str(group.get("kind")), ("#57606a", "o", "at the hang"))
            axes.plot(hang_x, y, marker=marker, color=colour, markersize=9, linestyle="", label=_once(words, labelled))
            axes.annotate(_short(group), (hang_x, y), xytext=(8, -3), textcoords="offset points", fontsize=8)
    if hang_x is not None:
        moment = "stacks asked" if hang.get("reason") == "asked" else "hang"
        axes.axvline(hang_x, color="#c62828", linewidth=1, linestyle="--", label=moment)
        left = min(axes.get_xlim()[0], hang_x)
        axes.set_xlim(left, hang_x + 0.4 * max(hang_x - left, 1.0))  # room for the words by each mark
    axes.set_yticks(range(len(rows)), [plot_text(row[0]) for row in rows], fontsize=8 if len(rows) > 16 else 10)
    axes.set_ylim(len(rows) - 0.5, -0.5)
    axes.set_xlabel("seconds since the run started")
    axes.set_title("Where each rank was", loc="left", fontsize=11)
    axes.grid(axis="x", alpha=0.3)
    axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return png_bytes(figure)


def _flags(record: RunRecord, stragglers: list[Any], ranks: list[int], hang_at: object) -> list[tuple[float, float]]:
    """(start, end) of each straggler flag naming one of `ranks`, or their node; a flag still up ends at the hang."""
    found = []
    for straggler in stragglers:
        named, begin, end = straggler.get("rank"), straggler.get("start"), straggler.get("end")
        mine = named in ranks or (named is None and any(record.node_of(r) == straggler.get("node") for r in ranks))
        if not mine or not isinstance(begin, (int, float)):
            continue
        end = end if isinstance(end, (int, float)) else hang_at
        found.append((float(begin), float(end) if isinstance(end, (int, float)) else float(begin)))
    return found


def _stepped(record: RunRecord, rank: int) -> tuple[float, float] | None:
    """From the rank's first start (or step) to its last step, or the last the monitor heard of it."""
    ranked, view = record.ranks.get(rank), record.state.ranks.get(rank)
    times = [*(ranked.starts[:1] if ranked else []), *(ranked.times[:1] if ranked and len(ranked.times) else [])]
    ends = [ranked.times[-1]] if ranked and len(ranked.times) else []
    if view is not None and view.last_said is not None:
        ends.append(view.last_said)
    if not times or not ends:
        return None
    return min(times), max(ends)


def _once(label: str, labelled: set[str]) -> str | None:
    if label in labelled:
        return None
    labelled.add(label)
    return label


def _short(group: dict[str, Any]) -> str:
    """A few words by the mark: `all_reduce #4`, `never entered`, `load_batch`, `T (stopped)`."""
    return plot_text(_words(group))


def _words(group: dict[str, Any]) -> str:
    collective, place = group.get("collective") or {}, group.get("place") or {}
    kind = group.get("kind")
    if kind == "did_not_answer":
        state = group.get("state")
        return f"no answer: {state}" if state else "no answer"
    op = f"{collective.get('op')}" + (f" #{collective['seq']}" if collective.get("seq") is not None else "")
    if kind == "never_entered":
        return f"never entered; in {place.get('function', '?')}"
    return op if collective else str(place.get("function") or "?")


def _table(rows: list[tuple[str, list[int], dict[str, Any]]], at: str = "at the hang") -> str:
    head = ["rank", at, "collective", "where (the user's code)", "code"]
    body = []
    for label, _, group in rows:
        collective, place = group.get("collective") or {}, group.get("place") or {}
        seq = collective.get("seq")
        named = f"{collective.get('op')}{f' #{seq}' if seq is not None else ''}" if collective else ""
        if not named and group.get("last_collective") is not None:
            named = f"last #{group['last_collective']}"
        where = f"{place.get('file')}:{place.get('line')} in {place.get('function')}" if place else "-"
        if group.get("kind") == "did_not_answer":
            where = f"process state: {group.get('state') or 'unknown'}"
        kind = str(group.get("kind") or "").replace("_", " ")
        cells = [label, kind, named or "-", where, str(place.get("code") or "") if place else ""]
        body.append("<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in cells) + "</tr>")
    header = "".join(f"<th>{escape(h)}</th>" for h in head)
    return f"<table><thead><tr>{header}</tr></thead><tbody>{''.join(body)}</tbody></table>"
