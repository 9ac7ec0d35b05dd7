"""`npu-wizard report` on run folders someone else could write into: what it writes stays its own.

A run folder is often shared (a cluster's scratch disk); its files are data, never markup or instructions. The
folders here are built the way EventWriter and the runner leave them, then given hostile contents.
"""

from __future__ import annotations

import json
import stat
from html import escape
from html.parser import HTMLParser
from pathlib import Path

from runtime.events import EventWriter
from tests.test_run_report import report_text, user_script_run
from wizard.cli import main
from wizard.monitor.report import write_json


def test_a_link_planted_at_the_temporary_names_is_never_followed(tmp_path: Path) -> None:
    """`ln -s /tmp/victim RUN/.report.html.tmp` used to make the report overwrite /tmp/victim."""
    run_dir = user_script_run(tmp_path / "run", steps=True)
    pngs = tmp_path / "plots"
    pngs.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("not the report's")
    for planted in (run_dir / ".report.html.tmp", pngs / ".loss.png.tmp", run_dir / ".summary.json.tmp"):
        planted.symlink_to(victim)
    assert main(["report", str(run_dir), "--png", str(pngs)]) == 0
    write_json(run_dir / "summary.json", {"outcome": "finished"})
    assert victim.read_text() == "not the report's"
    for written in (run_dir / "report.html", pngs / "loss.png", run_dir / "summary.json"):
        assert stat.S_ISREG(written.lstat().st_mode), written
        assert stat.S_IMODE(written.stat().st_mode) == 0o644, written
    assert (run_dir / "report.html").read_text().startswith("<!DOCTYPE html>")
    assert json.loads((run_dir / "summary.json").read_text()) == {"outcome": "finished"}
    leftovers = {p.name for p in [*run_dir.iterdir(), *pngs.iterdir()] if p.name.endswith(".tmp")}
    assert leftovers == {".report.html.tmp", ".loss.png.tmp", ".summary.json.tmp"}  # the links, untouched


def test_a_report_in_place_of_a_link_replaces_the_link_not_its_target(tmp_path: Path) -> None:
    run_dir = user_script_run(tmp_path / "run", steps=True)
    victim = tmp_path / "victim"
    victim.write_text("not the report's")
    (run_dir / "report.html").symlink_to(victim)
    page = report_text(run_dir)
    assert victim.read_text() == "not the report's"
    assert not (run_dir / "report.html").is_symlink() and "Run report" in page


# ---- what the run folder says is shown as text, never as markup ----------------------------------------------

HOSTILE = "<img src=x onerror=alert(1)><script>alert(2)</script>\"'"
SHOWN = escape(HOSTILE, quote=True)


class Markup(HTMLParser):
    """The tags and attributes of a page, as a browser would build them."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def assert_no_markup_from_the_run(page: str) -> None:
    """No tag, attribute or image source of the page came from the run folder's values."""
    markup = Markup()
    markup.feed(page)
    assert {tag for tag, _ in markup.tags} <= {*PAGE_TAGS}, {tag for tag, _ in markup.tags} - PAGE_TAGS
    for tag, attrs in markup.tags:
        assert not [name for name in attrs if name.startswith("on")], (tag, attrs)
        if tag == "img":
            assert (attrs.get("src") or "").startswith("data:image/png;base64,"), attrs
    assert "<script" not in page.lower() and "<img src=x" not in page


PAGE_TAGS = {
    *("html", "head", "meta", "title", "style", "body", "h1", "h2", "p", "div", "span", "dl", "dt", "dd"),
    *("b", "figure", "figcaption", "img", "pre", "table", "thead", "tbody", "tr", "th", "td", "ul", "li"),
}


def hostile_events(run_dir: Path) -> None:
    """Two ranks whose events carry HOSTILE in every text they hold; rank 1 fails and its log says HOSTILE."""
    for rank in (0, 1):
        writer = EventWriter(run_dir, rank)
        writer.emit("started", local_rank=0, node=rank, host=HOSTILE, device=HOSTILE, pid=HOSTILE, world_size=2)
        for step in range(1, 6):
            writer.emit("step", step=step, loss=1.0 / step, samples_per_s=100.0, forward_s=0.01, data_s=0.001)
        writer.emit("checkpoint", step=HOSTILE, path=HOSTILE)
        writer.emit("warning", kind=HOSTILE, message=HOSTILE)
        if rank == 1:
            writer.emit("error", type=HOSTILE, message=f"{HOSTILE}\n{HOSTILE}", traceback=HOSTILE)
        else:
            writer.finished()
        writer.close()
    (run_dir / "logs").mkdir()
    (run_dir / "logs" / "rank-1.log").write_text(f"{HOSTILE}\n" * 3)


def test_every_value_from_run_json_and_the_events_is_shown_as_text(tmp_path: Path) -> None:
    """`"node_count": "<script>alert(1)</script>"` in run.json used to become a live script tag."""
    run_dir = tmp_path / "run <b>'\"&"
    hostile_events(run_dir)
    info = {"project": f"/x/{HOSTILE}", "node_count": HOSTILE, "world_size": 2, "launcher": HOSTILE}
    (run_dir / "run.json").write_text(json.dumps({**info, "engine": HOSTILE, "started_at": HOSTILE}))
    page = report_text(run_dir)
    assert_no_markup_from_the_run(page)
    assert "<dd>2 on 2 node(s)" in page  # node_count is a count or nothing: here the ranks' own nodes say
    for shown in (f"({SHOWN}, {SHOWN})", f"<td>{SHOWN}</td>", f"<b>rank 1 (node 1): {SHOWN}: {SHOWN}</b>"):
        assert shown in page
    assert f"  | {SHOWN}" in page  # the failing rank's log lines
    assert f"<li>ranks 0-1: {SHOWN}</li>" in page  # the warning both ranks gave


def test_every_value_from_summary_json_is_shown_as_text(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    hostile_events(run_dir)
    rank = {"node": HOSTILE, "state": HOSTILE, "step": HOSTILE, "loss": HOSTILE, "restarts": HOSTILE}
    summary = {
        "outcome": HOSTILE,
        "world_size": 2,
        "wall_s": 12.0,
        "steps": HOSTILE,
        "restarts": HOSTILE,
        "ranks": {"0": rank, "1": rank},
        "failure": {"rank": 1, "node": 1, "kind": HOSTILE, "summary": HOSTILE, "time": 1.0, "hint": HOSTILE},
        "warnings": [{"ranks": [0], "message": HOSTILE}],
        "stragglers": [{"rank": 1, "node": 1, "phase": HOSTILE, "start": 1.0, "end": None, "gap_pct": 20.0}],
    }
    (run_dir / "summary.json").write_text(json.dumps(summary))
    page = report_text(run_dir)
    assert_no_markup_from_the_run(page)
    assert f'<span class="outcome unknown">{SHOWN}</span>' in page
    for shown in (f"<dd>{SHOWN}</dd>", f"<td>{SHOWN}</td>", f"<li>rank 0: {SHOWN}</li>", f"hint: {SHOWN}"):
        assert shown in page
