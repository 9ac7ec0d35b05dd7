"""`npu-wizard report` on run folders someone else could write into: what it writes stays its own.

A run folder is often shared (a cluster's scratch disk); its files are data, never markup or instructions. The
folders here are built the way EventWriter and the runner leave them, then given hostile contents.
"""

from __future__ import annotations

import json
import os
import stat
from html import escape
from html.parser import HTMLParser
from pathlib import Path

import pytest

from runtime.events import EventWriter
from tests.test_run_report import report_text, user_script_run
from wizard.atomic_files import write_json
from wizard.cli import main
from wizard.run_page.command import report_at_end


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
    assert (run_dir / "report.html").read_text().startswith("<!DOCTYPE html>")
    assert json.loads((run_dir / "summary.json").read_text()) == {"outcome": "finished"}
    leftovers = {p.name for p in [*run_dir.iterdir(), *pngs.iterdir()] if p.name.endswith(".tmp")}
    assert leftovers == {".report.html.tmp", ".loss.png.tmp", ".summary.json.tmp"}  # the links, untouched


@pytest.mark.parametrize(("umask", "mode"), [(0o077, 0o600), (0o022, 0o644)])
def test_the_report_and_the_summary_get_the_mode_the_umask_gives_a_new_file(
    tmp_path: Path, umask: int, mode: int
) -> None:
    """A user whose umask is 077 keeps the run's report to themself, as every file they make."""
    run_dir = user_script_run(tmp_path / "run", steps=True)
    pngs = tmp_path / "plots"
    pngs.mkdir()
    before = os.umask(umask)
    try:
        assert main(["report", str(run_dir), "--png", str(pngs)]) == 0
        write_json(run_dir / "summary.json", {"outcome": "finished"})
    finally:
        os.umask(before)
    for written in (run_dir / "report.html", pngs / "loss.png", run_dir / "summary.json"):
        assert stat.S_IMODE(written.stat().st_mode) == mode, written


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
    assert "<dt>steps</dt><dd>?</dd>" in page  # a count or nothing
    for shown in (f"<td>{SHOWN}</td>", f"<li>rank 0: {SHOWN}</li>", f"hint: {SHOWN}"):
        assert shown in page


@pytest.mark.parametrize("kind", ["folder at report.html", "folder at the old temporary name"])
def test_a_report_that_cannot_be_written_says_so_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    run_dir = user_script_run(tmp_path / "run", steps=True)
    (run_dir / ("report.html" if kind.endswith("report.html") else ".report.html.tmp")).mkdir()
    code = main(["report", str(run_dir)])
    err = capsys.readouterr().err
    if kind.endswith("report.html"):
        assert code == 1
        assert err.startswith(f"npu-wizard: cannot write {run_dir / 'report.html'}: ") and err.count("\n") == 1
        assert "Traceback" not in err
    else:  # the temporary file has a name of its own now: a folder at the old one is in nobody's way
        assert code == 0, err
        assert (run_dir / "report.html").is_file()
    assert [p.name for p in run_dir.iterdir() if p.name.startswith(".report.html.") and p.is_file()] == []


# ---- values of the wrong kind give a page, never a traceback --------------------------------------------------


def started(rank: int, **fields: object) -> dict[str, object]:
    return {"schema": 1, "event": "started", "rank": rank, "time": 1.7e9, "pid": 100 + rank, "world_size": 2, **fields}


def step(rank: int, number: object, at: float, **fields: object) -> dict[str, object]:
    event = {"schema": 1, "event": "step", "rank": rank, "time": at, "step": number, "loss": 1.0}
    return {**event, "samples_per_s": 100.0, "forward_s": 0.01, "data_s": 0.001, **fields}


ODD_FOLDERS: dict[str, dict[str, object]] = {
    "an empty failure summary": {
        "summary.json": {"outcome": "failed", "world_size": 1, "failure": {"rank": 0, "kind": "error", "summary": ""}},
        "rank-0": [started(0, node=0), step(0, 1, 1.7e9 + 1)],
    },
    "a node that is a string": {
        "rank-0": [started(0, node="x"), step(0, 1, 1.7e9 + 1), step(0, "3", 1.7e9 + 2)],
        "rank-1": [started(1, node=[1]), step(1, 1, 1.7e9 + 1)],
    },
    "a node_count that is no count": {
        "run.json": {"node_count": "<img src=x onerror=alert(1)>", "world_size": 2, "launcher": "torchrun"},
        "rank-0": [started(0), *(step(0, n, 1.7e9 + n) for n in range(1, 5))],
        "rank-1": [started(1), *(step(1, n, 1.7e9 + n) for n in range(1, 5))],
    },
    "events of the wrong types": {
        "rank-0": [
            started(0, node=0, world_size="2", resumed_step="5", total_steps="many"),
            step(0, "1", 1.7e9 + 1, loss="nan", samples_per_s="fast", epoch=[0]),
            {"schema": 1, "event": "checkpoint", "rank": 0, "time": "later", "step": [2], "path": ["<x>"]},
            {"schema": 1, "event": "checkpoint", "rank": 0, "time": 1.7e9 + 2, "step": {"a": 1}, "path": None},
            {"schema": 1, "event": "error", "rank": 0, "time": 1.7e9 + 3, "type": None, "message": None},
            {"schema": 1, "event": "warning", "rank": 0, "time": 1.7e9 + 3, "kind": ["a"], "message": {"a": 1}},
            {"schema": 1, "event": "finished", "rank": 0, "time": 1.7e9 + 4, "step": "done"},
        ],
    },
    "numbers that are no numbers": {
        "run.json": {"started_at": float("nan"), "world_size": 2},
        "rank-0": [
            started(0, node=0, time=float("nan")),
            step(0, 1, float("inf"), samples_per_s=float("inf"), loss=float("nan")),
            step(0, 2, 1.7e9 + 2, samples_per_s=float("inf"), forward_s=float("inf")),
            step(0, 3, 1.7e9 + 3, samples_per_s=1e308, loss=-1e308),
        ],
        "rank-1": [started(1, node=1), step(1, 1, 1.7e9 + 1, loss=1e308), step(1, 2, 1.7e9 + 2, loss=-1e308)],
    },
    "a summary.json of the wrong types": {
        "summary.json": {
            "outcome": "  ",
            "world_size": "2",
            "started_at": "yesterday",
            "wall_s": "long",
            "steps": [1],
            "samples_per_s": "fast",
            "final_loss": [1],
            "restarts": None,
            "failure": "it broke",
            "ranks": {"x": {}, "0": "y", "1": {"node": [1], "step": "3", "loss": "low", "state": 5}},
            "warnings": ["w", {"ranks": "ab", "message": None}, {"ranks": [[1]], "message": 1}],
            "stragglers": ["a", {"start": "x", "gap_pct": "big", "node": [1], "rank": "3", "phase": 1}],
        },
        "rank-0": [started(0, node=0), step(0, 1, 1.7e9 + 1)],
        "rank-1": [started(1, node=1), step(1, 1, 1.7e9 + 1)],
    },
    "a failure of the wrong types in summary.json": {
        "summary.json": {
            "outcome": "failed",
            "ranks": {"0": {"node": 0, "state": "failed", "step": 1}, **{str(r): {"step": "x"} for r in range(1, 70)}},
            "failure": {"rank": "../../x", "node": "n", "kind": None, "summary": ["a"], "time": "then", "hint": 3},
            "stragglers": [{"rank": None, "node": "1", "phase": "forward", "start": 1.7e9, "end": 1.7e9 + 9}],
        },
        "rank-0": [started(0, node=0), step(0, 1, 1.7e9 + 1), step(0, 2, 1.7e9 + 2)],
    },
    "a time of 400 digits": {  # past any float
        "summary.json": {"outcome": "finished", "started_at": 10**400, "ended_at": 10**400, "wall_s": 10**400},
        "rank-0": [
            started(0, node=0),
            *(step(0, n, 1.7e9 + n) for n in range(1, 5)),
            {"schema": 1, "event": "checkpoint", "rank": 0, "time": 10**400, "step": 4, "path": "x"},
            step(0, 5, 10**400),
        ],
    },
    "a time of 400 digits with no summary.json": {
        "run.json": {"started_at": 10**400, "world_size": 1},
        "rank-0": [
            started(0, node=0, time=10**400),
            *(step(0, n, 1.7e9 + n) for n in range(1, 5)),
            step(0, 5, 10**400),
        ],
    },
    "a step past a 64-bit column": {
        "rank-0": [started(0, node=0), *(step(0, n, 1.7e9 + n) for n in range(1, 5)), step(0, 10**20, 1.7e9 + 5)],
    },
    "figures of 400 digits": {
        "rank-0": [
            started(0, node=0),
            step(0, 1, 1.7e9 + 1),
            step(0, 2, 1.7e9 + 2, loss=10**400, samples_per_s=10**400, forward_s=10**400, data_s=10**400),
            step(0, 3, 1.7e9 + 3, loss=10**400, samples_per_s=10**400, forward_s=10**400, data_s=10**400),
        ],
    },
    "a rank of 5000 digits in summary.json": {  # past what int() reads
        "run.json": {"started_at": 1.0},
        "summary.json": {"outcome": "finished", "ranks": {"9" * 5000: {}, "0": {"state": "finished"}}},
        "rank-0": [started(0, node=0), step(0, 1, 1.7e9 + 1)],
    },
    "a start past any date": {
        "run.json": {"started_at": 1e300, "node_count": 1},
        "summary.json": {
            "outcome": "finished",
            "wall_s": 1e300,
            "started_at": 1e300,
            "stragglers": [{"rank": 0, "node": 0, "phase": "forward", "start": 1e300, "end": -1e300}],
        },
        "rank-0": [started(0, node=0), *(step(0, n, 1.7e9 + n, loss=1.0) for n in range(1, 5))],
    },
}


@pytest.mark.parametrize("name", list(ODD_FOLDERS))
def test_values_of_the_wrong_kind_give_a_page_not_a_traceback(tmp_path: Path, name: str) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "events").mkdir(parents=True)
    for file, content in ODD_FOLDERS[name].items():
        if file.startswith("rank-"):
            lines = "".join(json.dumps(event) + "\n" for event in content)  # NaN and Infinity as json writes them
            (run_dir / "events" / f"{file}.jsonl").write_text(lines)
        else:
            (run_dir / file).write_text(json.dumps(content))
    page = report_text(run_dir)
    assert_no_markup_from_the_run(page)
    assert "Run report" in page


def test_a_line_nested_too_deep_to_parse_is_skipped(tmp_path: Path) -> None:
    run_dir = user_script_run(tmp_path / "run", steps=True)
    with (run_dir / "events" / "rank-0.jsonl").open("a") as events:
        events.write('{"schema": 1, "event": "warning", "rank": 0, "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    page = report_text(run_dir)
    assert page.count('<img class="plot"') == 3


def test_a_report_that_fails_at_the_end_of_a_run_says_so_in_one_line_and_raises_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run --report` writes the report before it raises for the run's outcome: a report must never raise."""
    import wizard.run_page.plots

    def a_drawing_bug(*args: object) -> None:  # stands in for whatever drawing may yet meet
        raise RuntimeError("matplotlib met something new\nand said more")

    run_dir = user_script_run(tmp_path / "run", steps=True, fail_rank=1)
    monkeypatch.setattr(wizard.run_page.plots, "draw_all", a_drawing_bug)
    assert report_at_end(run_dir) == "warning: report not written (RuntimeError: matplotlib met something new)"
    (run_dir / "report.html").mkdir()
    monkeypatch.undo()
    said = report_at_end(run_dir)
    assert (
        said.startswith(f"warning: report not written (cannot write {run_dir / 'report.html'}: ") and "\n" not in said
    )
