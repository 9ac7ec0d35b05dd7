"""The report page: one HTML file with its style and its plots inside (base64 PNG), nothing fetched from anywhere.

The figures and the root cause come from the monitor's own code (`summarize`, `failure_report`), so the page
says what `npu-wizard run` and `monitor` printed.
"""

from __future__ import annotations

import base64
import time
from html import escape
from pathlib import Path
from typing import Any

from wizard.monitor.lm_figures import median_words
from wizard.monitor.ranks import Failure, where
from wizard.monitor.summary_text import duration, failure_report, preempted_line
from wizard.run_page.hang_section import hang_section
from wizard.run_page.inferred import effective_summary
from wizard.run_page.plots import Plot
from wizard.run_page.profile_section import profile_section
from wizard.run_page.record import RunRecord

EVERY_PROCESS = 64  # up to this many ranks the processes table has a row each; beyond, a row per node
SHOWN_ROWS = 100  # rows of a long table (checkpoints, restarts) shown, the newest
# each has a colour
OUTCOMES = {"finished", "failed", "hung", "interrupted", "preempted", "abandoned", "unknown", "running"}

STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px auto; max-width: 1060px; color: #1f2328; background: #f6f8fa; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 28px; }
.meta { color: #57606a; font-size: 13px; }
.outcome { display: inline-block; padding: 2px 10px; border-radius: 10px; color: white; font-weight: 600; }
.finished { background: #1a7f37; } .failed, .hung { background: #c62828; }
.interrupted, .preempted, .abandoned, .unknown, .running { background: #9a6700; }
.box { background: white; border: 1px solid #d0d7de; border-radius: 6px; padding: 12px 16px; margin: 12px 0; }
.failure { border-color: #c62828; border-left-width: 6px; }
figure { background: white; border: 1px solid #d0d7de; border-radius: 6px; margin: 14px 0; padding: 8px; }
figure img { display: block; } figcaption { color: #57606a; font-size: 13px; margin-top: 4px; }
.missing { color: #57606a; font-style: italic; padding: 16px; }
pre { white-space: pre-wrap; word-break: break-word; font-size: 12px; background: #f6f8fa; padding: 8px; }
table { border-collapse: collapse; font-size: 13px; background: white; }
th, td { border: 1px solid #d0d7de; padding: 3px 8px; text-align: left; }
th { background: #eaeef2; }
dl { display: grid; grid-template-columns: max-content auto; gap: 2px 16px; margin: 0; }
dt { color: #57606a; }
"""


def render_page(record: RunRecord, plots: list[Plot], summary: dict[str, Any] | None = None) -> str:
    """The whole report as HTML text (`summary`: the run's effective summary, when it was made already)."""
    summary = effective_summary(record) if summary is None else summary
    project = Path(str(record.info.get("project") or "")).name or record.run_dir.name
    outcome = str(summary.get("outcome") or "unknown")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>npu-wizard report: {escape(record.run_dir.name)}</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>Run report: {escape(project)}</h1>",
        f'<p class="meta">run folder {escape(str(record.run_dir))} &middot; written {escape(_clock(time.time()))}</p>',
        _overview(record, summary, outcome),
        _failure(record, summary),
        hang_section(record, summary),
        "<h2>Training</h2>",
        *(_figure(plot) for plot in plots),
        _stragglers(summary),
        _attempts(summary),
        profile_section(record.run_dir, summary),
        _restarts(record),
        _checkpoints(record),
        _processes(record, summary),
        _warnings(summary),
        "</body></html>",
    ]
    return "\n".join(part for part in parts if part) + "\n"


def root_cause_text(record: RunRecord, summary: dict[str, Any]) -> str | None:
    """The failure report the monitor prints (root cause, traceback, log tail, hint), or None for no failure."""
    said = summary.get("failure")
    if not said:
        return None
    from_events = [f for f in record.state.failures() if f.rank == said.get("rank") and f.kind == said.get("kind")]
    if from_events:
        failure = from_events[0]
    else:
        failure = Failure(
            said.get("rank"), said.get("node"), said.get("time") or 0.0, str(said.get("kind")), str(said.get("summary"))
        )
    text = failure_report(failure, record.run_dir)
    if said.get("hint") and failure.hint is None:
        text += f"\nhint: {said['hint']}"
    return text


def _overview(record: RunRecord, summary: dict[str, Any], outcome: str) -> str:
    said = record.info.get("node_count")  # a count, or nothing: run.json is as anyone wrote it
    nodes = said if type(said) is int and said > 0 else len({record.node_of(r) for r in record.state.ranks} - {None})
    rate, loss = summary.get("samples_per_s"), summary.get("final_loss")
    rows = {  # plain text, escaped below; the outcome alone is markup
        "ranks": f"{record.world_size} on {nodes or '?'} node(s)" + _launcher(record),
        "started": _clock(record.started_at) if record.started_at else "?",
        "wall time": duration(summary.get("wall_s")),
        "steps": "?" if summary.get("steps") is None else str(summary["steps"]),
        "throughput": f"{rate:,.0f} samples/s overall" if isinstance(rate, (int, float)) else "no step logged",
        "final loss": f"{loss:.4f}" if isinstance(loss, (int, float)) else "none logged",
        "restarts": str(summary.get("restarts", 0)),
        **_language_model_rows(summary.get("language_model")),
    }
    if record.skipped_lines:
        rows["note"] = f"{record.skipped_lines} event line(s) too long to read were skipped"
    kind = (outcome.split() or ["unknown"])[0]
    shown = f'<span class="outcome {kind if kind in OUTCOMES else "unknown"}">{escape(outcome)}</span>' + (
        " (no summary.json: figures read from the events)" if summary.get("inferred") else ""
    )
    body = f"<dt>outcome</dt><dd>{shown}</dd>" + "".join(
        f"<dt>{name}</dt><dd>{escape(value)}</dd>" for name, value in rows.items()
    )
    return f'<div class="box"><dl>{body}</dl></div>'


def _language_model_rows(figures: dict[str, Any] | None) -> dict[str, str]:
    """The overview's rows for a language model: tokens/s, MFU, the last and best validation loss (none for others)."""
    if not figures:
        return {}
    rows = {}
    tokens, mfu, windows = (figures.get(key) for key in ("tokens_per_s", "mfu", "windows"))
    if tokens is not None:
        rows["tokens/s"] = f"{tokens:,.0f} ({median_words(windows)})"
    if mfu is not None:
        rows["MFU"] = f"{mfu:.1%} (median)"
    last, best = figures.get("last_eval"), figures.get("best_eval")
    if last:
        rows["validation loss"] = f"{last['val_loss']:.4f} at step {last['step']}"
    if best:
        rows["best validation loss"] = f"{best['val_loss']:.4f} at step {best['step']}"
    return rows


def _launcher(record: RunRecord) -> str:
    launcher, engine = record.info.get("launcher"), record.info.get("engine")
    said = ", ".join(str(x) for x in (launcher, engine) if x)
    return f" ({said})" if said else ""


def _failure(record: RunRecord, summary: dict[str, Any]) -> str:
    text = root_cause_text(record, summary)
    if text is None:
        if summary.get("outcome") == "interrupted":
            return (
                '<div class="box failure" id="failure"><h2>Interrupted</h2><p>the job was stopped (Ctrl-C or a '
                "signal) before it finished; every process of it was stopped.</p></div>"
            )
        if summary.get("outcome") == "preempted" and isinstance(summary.get("preempted"), dict):
            return (
                '<div class="box failure" id="failure"><h2>Preempted</h2><p>'
                f"{escape(preempted_line(summary['preempted']))}.</p></div>"
            )
        return ""
    said = summary["failure"]
    first_line = (str(said.get("summary")).splitlines() or ["(no message)"])[0]
    headline = f"{where(said.get('rank'), said.get('node'))}: {first_line}"
    return (
        '<div class="box failure" id="failure"><h2>Failure: root cause</h2>'
        f"<p><b>{escape(headline)}</b></p><pre>{escape(text)}</pre></div>"
    )


def _figure(plot: Plot) -> str:
    if plot.png is None:
        return (
            f'<figure id="{plot.name}"><figcaption><b>{escape(plot.title)}</b></figcaption>'
            f'<p class="missing">{escape(plot.missing or "")}</p></figure>'
        )
    width, height = plot.size
    data = base64.b64encode(plot.png).decode("ascii")
    return (
        f'<figure id="{plot.name}"><img class="plot" id="plot-{plot.name}" alt="{escape(plot.title)}" '
        f'width="{width}" height="{height}" src="data:image/png;base64,{data}">'
        f"<figcaption>{escape(plot.note)}</figcaption></figure>"
    )


def _stragglers(summary: dict[str, Any]) -> str:
    found = summary.get("stragglers")
    if summary.get("stragglers_not_judged"):
        return f"<h2>Stragglers</h2><p>not judged: {escape(str(summary['stragglers_not_judged']))}</p>"
    if found is None:
        return ""
    if not found:
        return "<h2>Stragglers</h2><p>none: no rank or node was slower than the others for long.</p>"
    rows = []
    for s in found:
        node = "" if s.get("node") is None else f" (node {s.get('node')})"
        who = f"rank {s.get('rank')}{node}" if s.get("rank") is not None else f"node {s.get('node', '?')}"
        span = f"{_clock(s['start']) if isinstance(s.get('start'), (int, float)) else '?'} to " + (
            _clock(s["end"]) if isinstance(s.get("end"), (int, float)) else "the end"
        )
        rows.append([who, str(s.get("phase")), _pct(s.get("gap_pct")), _pct(s.get("lost_pct")), span])
    return "<h2>Stragglers</h2>" + _table(["who", "phase", "slower by", "job time lost", "when"], rows)


def _attempts(summary: dict[str, Any]) -> str:
    """The attempts of a job run with --restarts: how each ended, where the next resumed, what it cost."""
    attempts = summary.get("attempts") or []
    if len(attempts) < 2 and not any(a.get("refused") for a in attempts):
        return ""
    rows = []
    for a in attempts[-SHOWN_ROWS:]:
        recovery = a.get("failure_to_first_step_s")
        rows.append(
            [
                str(a.get("attempt")),
                str(a.get("outcome") or "running"),
                str(a.get("cause") or "") + (f" ({a['refused']})" if a.get("refused") else ""),
                "" if a.get("failed_at_step") is None or a.get("cause") is None else str(a["failed_at_step"]),
                "" if a.get("resumed_from_step") is None else str(a["resumed_from_step"]),
                "" if a.get("steps_lost") is None else str(a["steps_lost"]),
                "" if recovery is None else f"{recovery:.1f}",
            ]
        )
    head = [
        "attempt",
        "outcome",
        "cause",
        "failed at step",
        "next resumed from step",
        "steps lost",
        "failure to first step (s)",
    ]
    restarts = summary.get("job_restarts", len(attempts) - 1)
    said = f"<p>{restarts} restart(s) of the whole job (npu-wizard run --restarts).</p>"
    return "<h2>Attempts</h2>" + said + _table(head, rows)


def _restarts(record: RunRecord) -> str:
    starts = sorted((t, r.rank) for r in record.ranks.values() for t in r.starts[1:])
    if not starts:
        return "<h2>Restarts</h2><p>none: every rank started once.</p>"
    groups: list[tuple[float, list[int]]] = []
    for at, rank in starts:
        if groups and at - groups[-1][0] < 30:
            groups[-1][1].append(rank)
        else:
            groups.append((at, [rank]))
    rows = [[_clock(at), f"{at - record.started_at:.1f}", _ranks(ranks)] for at, ranks in groups[-SHOWN_ROWS:]]
    said = f"{len(groups)} restart(s) of the launcher's workers or of the whole job (see Attempts)"
    return f"<h2>Restarts</h2><p>{said}.</p>" + _table(["time", "seconds in", "ranks started again"], rows)


def _checkpoints(record: RunRecord) -> str:
    found = sorted((c for c in record.checkpoints if isinstance(c.get("time"), (int, float))), key=lambda c: c["time"])
    if not found:
        return "<h2>Checkpoints</h2><p>none written in this run.</p>"
    by_step: dict[object, list[dict[str, Any]]] = {}
    for checkpoint in found:  # each node's local rank 0 writes its own copy of a step
        by_step.setdefault(checkpoint.get("step"), []).append(checkpoint)
    rows = [
        [
            _clock(saved[0]["time"]),
            f"{saved[0]['time'] - record.started_at:.1f}",
            str(step),
            _ranks([c["rank"] for c in saved], limit=8),
            str(saved[0].get("path")) + (f" (and {len(saved) - 1} more)" if len(saved) > 1 else ""),
        ]
        for step, saved in list(by_step.items())[-SHOWN_ROWS:]
    ]
    shown = f"; the newest {SHOWN_ROWS} steps shown" if len(by_step) > SHOWN_ROWS else ""
    said = f"{len(found)} written at {len(by_step)} step(s){shown}."
    return f"<h2>Checkpoints</h2><p>{said}</p>" + _table(["time", "seconds in", "step", "by", "path"], rows)


def _processes(record: RunRecord, summary: dict[str, Any]) -> str:
    ranks = summary.get("ranks") or {}
    views = record.state.ranks
    if len(ranks) <= EVERY_PROCESS:
        rows = []
        for key, info in ranks.items():
            view = views.get(int(key))
            rows.append(
                [
                    key,
                    str(info.get("node", "?")),
                    str(view.host if view and view.host else "?"),
                    str(view.pid if view and view.pid else "?"),
                    str(view.device if view and view.device else "?"),
                    str(info.get("state")),
                    str(info.get("step")),
                    f"{info['loss']:.4f}" if isinstance(info.get("loss"), (int, float)) else "-",
                    str(info.get("restarts", 0)),
                ]
            )
        head = ["rank", "node", "host", "pid", "device", "state", "step", "loss", "restarts"]
        return "<h2>Processes</h2>" + _table(head, rows)
    by_node: dict[str, dict[str, Any]] = {}
    for info in ranks.values():
        node = by_node.setdefault(str(info.get("node", "?")), {"ranks": 0, "states": {}, "steps": []})
        node["ranks"] += 1
        node["states"][info.get("state")] = node["states"].get(info.get("state"), 0) + 1
        node["steps"].append(info.get("step") or 0)
    rows = [
        [
            node,
            str(n["ranks"]),
            ", ".join(f"{s} {c}" for s, c in n["states"].items()),
            f"{min(n['steps'])}-{max(n['steps'])}",
        ]
        for node, n in by_node.items()
    ]
    odd = [key for key, info in ranks.items() if info.get("state") != "finished"]
    listed = f"<p>ranks not finished: {escape(_ranks([int(k) for k in odd]))}</p>" if odd else ""
    return f"<h2>Processes</h2><p>{len(ranks)} ranks, a row per node.</p>{listed}" + _table(
        ["node", "ranks", "states", "steps"], rows
    )


def _warnings(summary: dict[str, Any]) -> str:
    warnings = summary.get("warnings") or []
    if not warnings:
        return ""
    items = "".join(
        f"<li>{escape(_ranks(w.get('ranks') or []))}: {escape(str(w.get('message')))}</li>"
        for w in warnings[:SHOWN_ROWS]
    )
    return f"<h2>Warnings</h2><ul>{items}</ul>"


def _table(head: list[str], rows: list[list[str]]) -> str:
    header = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{header}</tr></thead><tbody>{body}</tbody></table>"


def _ranks(ranks: list[int], limit: int = 40) -> str:
    """`0-3, 7`: ranks as ranges, at most `limit` of them named."""
    ranks = sorted(set(ranks))
    spans: list[list[int]] = []
    for rank in ranks:
        if spans and rank == spans[-1][1] + 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    words = [f"{a}-{b}" if b > a else f"{a}" for a, b in spans[:limit]]
    more = f" and {len(spans) - limit} more" if len(spans) > limit else ""
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(words) + more


def _pct(value: object) -> str:
    return f"{value:.0f}%" if isinstance(value, (int, float)) else "?"


def _clock(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))
