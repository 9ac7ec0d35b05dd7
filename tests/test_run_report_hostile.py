"""`npu-wizard report` on run folders someone else could write into: what it writes stays its own.

A run folder is often shared (a cluster's scratch disk); its files are data, never markup or instructions. The
folders here are built the way EventWriter and the runner leave them, then given hostile contents.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

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
