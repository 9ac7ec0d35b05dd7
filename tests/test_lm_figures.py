"""A language model's tokens/s, MFU and validation loss in the monitor, the summary and the report (issue 38).

The run folders are written with runtime/events.py's EventWriter as the generated train.py writes them
(tests/lm_runs.py). An image model's folder, written the same way without them, must show none of these figures.
The live view's line is pinned in tests/test_monitor_app.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from runtime.events import read_events
from tests.lm_runs import LOGGED_STEPS, VAL_LOSS, gpt_run, image_run
from wizard.atomic_files import write_json
from wizard.cli import main
from wizard.monitor.attach import RunFolder
from wizard.monitor.lm_figures import Evaluation
from wizard.monitor.plain_lines import progress_block
from wizard.monitor.state import JobState
from wizard.monitor.summary_file import checked
from wizard.monitor.summary_text import format_summary, summarize


def written_summary(folder: RunFolder) -> dict:
    """summary.json as the runner writes it for this folder's job, read back as `monitor` and `report` read it."""
    summary = summarize(folder.state, started_at=folder.started_at, ended_at=folder.started_at + 60, outcome="finished")
    write_json(folder.run_dir / "summary.json", summary)
    return json.loads((folder.run_dir / "summary.json").read_text())


def report_page(run_dir: Path) -> str:
    """report.html as `npu-wizard report RUN` writes it."""
    assert main(["report", str(run_dir)]) == 0
    return (run_dir / "report.html").read_text()


def overview_rows(page: str) -> dict[str, str]:
    """The report's figures table: each name with its value."""
    return dict(re.findall(r"<dt>([^<]*)</dt><dd>([^<]*)</dd>", page))


def test_the_state_keeps_rank_0s_newest_tokens_per_s_and_mfu_and_each_validation_loss_once(tmp_path: Path) -> None:
    figures = RunFolder(gpt_run(tmp_path / "run")).state.lm_figures
    assert (figures.tokens_per_s, figures.mfu) == (25_800.0, 0.43)
    # every rank wrote each evaluation: it is kept once, with the time rank 0 wrote it
    assert [(e.step, e.val_loss) for e in figures.evaluations()] == list(zip(LOGGED_STEPS, VAL_LOSS, strict=True))
    assert figures.last_eval == figures.evaluations()[-1]
    assert isinstance(figures.best, Evaluation) and (figures.best.step, figures.best.val_loss) == (20, 2.5)


def test_a_lower_rank_heard_later_takes_over_and_its_figures_alone_count(tmp_path: Path) -> None:
    run_dir = gpt_run(tmp_path / "run")
    in_order = RunFolder(run_dir).state.lm_figures
    state = JobState(2)
    events = read_events(run_dir)
    state.ingest_all([*events[1], *events[0]])  # rank 1's file first, then rank 0's
    assert state.lm_figures.summary() == in_order.summary()
    assert state.lm_figures.evaluations() == in_order.evaluations()


def test_the_plain_view_shows_tokens_per_s_mfu_and_the_last_validation_loss(tmp_path: Path) -> None:
    state = RunFolder(gpt_run(tmp_path / "run", finished=False)).state
    head, *ranks = progress_block(state, 12.0, state.now()).splitlines()
    parts = head.split(" | ")
    assert parts[:2] == ["[   12.0s] 2 ranks: running 2", "step 30/40 loss 3.0000, val loss 2.6000 at step 30"]
    assert parts[2] == "404 samples/s, 25,800 tokens/s, MFU 43.0%"
    assert parts[3].startswith("ETA ")
    # each rank's own share of the samples: tokens/s and MFU are the job's, shown once
    assert ranks == [f"  rank {rank} (node 0): running, step 30, loss 3.0000, 202 samples/s" for rank in (0, 1)]


def test_the_summary_says_the_median_tokens_per_s_and_mfu_and_the_last_and_best_validation_loss(
    tmp_path: Path,
) -> None:
    summary = written_summary(RunFolder(gpt_run(tmp_path / "run")))
    # medians of rank 0's windows: the start-up window is not the run's figure
    assert summary["language_model"] == {
        "tokens_per_s": 25_600.0,
        "mfu": 0.42,
        "windows": 3,
        "last_eval": {"step": 30, "val_loss": 2.6},
        "best_eval": {"step": 20, "val_loss": 2.5},
    }
    lines = format_summary(checked(summary)).splitlines()
    assert lines[3:6] == [
        "final loss 3.0000",
        "tokens/s 25,600 (median of 3 logged windows), MFU 42.0%",
        "validation loss 2.6000 at step 30, best 2.5000 at step 20",
    ]


def test_the_report_lists_the_figures_and_draws_the_validation_loss_on_the_loss_plot(tmp_path: Path) -> None:
    folder = RunFolder(gpt_run(tmp_path / "run"))
    written_summary(folder)
    page = report_page(folder.run_dir)
    rows = overview_rows(page)
    assert {name: rows[name] for name in ("tokens/s", "MFU", "validation loss", "best validation loss")} == {
        "tokens/s": "25,600 (median of 3 logged windows)",
        "MFU": "42.0% (median)",
        "validation loss": "2.6000 at step 30",
        "best validation loss": "2.5000 at step 20",
    }
    assert 'id="plot-loss"' in page
    assert "black: the validation loss at each evaluation, averaged over every rank" in page


def test_a_report_without_summary_json_works_the_same_figures_out_of_the_events(tmp_path: Path) -> None:
    rows = overview_rows(report_page(gpt_run(tmp_path / "run")))
    assert rows["tokens/s"] == "25,600 (median of 3 logged windows)"
    assert rows["best validation loss"] == "2.5000 at step 20"


def test_an_image_model_run_shows_no_language_model_figure_in_the_plain_view_or_the_summary(tmp_path: Path) -> None:
    folder = RunFolder(image_run(tmp_path / "run"))
    line = progress_block(folder.state, 12.0, folder.state.now()).splitlines()[0]
    summary = written_summary(folder)
    assert summary["language_model"] is None
    for words in ("tokens/s", "MFU", "val loss", "validation loss"):
        assert words not in line and words not in format_summary(checked(summary)), words


def test_an_image_model_run_report_lists_no_language_model_figure(tmp_path: Path) -> None:
    folder = RunFolder(image_run(tmp_path / "run"))
    written_summary(folder)
    # the page's words, without its embedded plots: base64 can spell MFU by chance (a CI run once had it)
    page = re.sub(r"data:image/[a-z]+;base64,[A-Za-z0-9+/=]+", "", report_page(folder.run_dir))
    for words in ("tokens/s", "MFU", "validation loss"):
        assert words not in page, words


def test_a_summary_json_whose_language_model_figures_are_no_figures_reads_as_none() -> None:
    hostile = {"tokens_per_s": "fast", "mfu": [0.4], "windows": -3, "last_eval": {"step": "ten", "val_loss": 2.0}}
    assert checked({"language_model": hostile})["language_model"] is None
    half = checked({"language_model": {"tokens_per_s": 1e5, "best_eval": {"step": 4, "val_loss": float("nan")}}})
    assert half["language_model"] == {
        "tokens_per_s": 1e5,
        "mfu": None,
        "windows": None,
        "last_eval": None,
        "best_eval": None,
    }
    assert format_summary(half).splitlines()[4] == "tokens/s 100,000 (median of the logged windows)"
