"""`report` and `monitor` on run folders whose files are no regular files, or hold values of the wrong kind.

A run folder is anyone's to write into: a FIFO in place of summary.json used to hang both commands, a run.json
linked to /dev/zero ended in a MemoryError, an events file that is a FIFO blocked `monitor` for ever. Each file
of a run folder is read only if it is a regular file, to a bound; anything else is refused in one line that
names it. The commands run in a fresh interpreter with a minute and 2 GiB to finish (tests/test_hostfile.py).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from runtime.events import EventFollower, EventWriter
from tests.test_bad_input import refused
from tests.test_hostfile import npu_wizard
from wizard.cli import main
from wizard.monitor.attach import RunFolder, run_folder_path, watch_plain
from wizard.monitor.run_files import RunFileError, read_events
from wizard.run.smoke import print_smoke_report


def finished_run(run_dir: Path, ranks: int = 2) -> Path:
    """A run folder as two ranks of a user's script leave it, with run.json and summary.json as the runner writes."""
    for rank in range(ranks):
        writer = EventWriter(run_dir, rank)
        writer.started(local_rank=rank, node=0, device="cpu", world_size=ranks)
        for step in range(1, 5):
            writer.emit("step", step=step, loss=1.0 / step, samples_per_s=100.0)
        writer.finished()
        writer.close()
    (run_dir / "logs").mkdir()
    (run_dir / "run.json").write_text(json.dumps({"world_size": ranks, "started_at": 1.0e9, "node_count": 1}))
    (run_dir / "summary.json").write_text(json.dumps({"outcome": "finished", "world_size": ranks, "steps": 4}))
    return run_dir


def planted(path: Path, kind: str) -> None:
    """Put a FIFO nobody writes to, or a link to /dev/zero, in place of `path`."""
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")


KINDS = {"fifo": "is a FIFO, not a regular file", "zero": "is a symbolic link, not a regular file"}


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("name", ["summary.json", "run.json", "events/rank-1.jsonl"])
@pytest.mark.parametrize("command", ["report", "monitor"])
def test_a_file_of_the_run_folder_that_is_no_regular_file_is_refused_by_name(
    tmp_path: Path, command: str, name: str, kind: str
) -> None:
    run_dir = finished_run(tmp_path / "run")
    planted(run_dir / name, kind)
    args = ["monitor", "--plain", str(run_dir)] if command == "monitor" else ["report", str(run_dir)]
    result = npu_wizard(*args, cwd=tmp_path)
    refused(result, f"{run_dir / name} {KINDS[kind]}: npu-wizard reads only regular files in a run folder")
    assert not (run_dir / "report.html").exists()


def test_a_summary_json_past_its_bound_is_refused_not_read_whole(tmp_path: Path) -> None:
    run_dir = finished_run(tmp_path / "run")
    with (run_dir / "summary.json").open("r+b") as handle:
        handle.truncate(65 * 2**20)  # sparse: 65 MiB on paper, nothing on the disk
    refused(npu_wizard("report", str(run_dir), cwd=tmp_path), f"{run_dir / 'summary.json'} holds over 67,108,864 bytes")


SUMMARY_OF_THE_WRONG_KINDS = {
    "outcome": ["finished"],
    "wall_s": "long",
    "time_to_first_step_s": [1],
    "steps": "4",
    "restarts": {"a": 1},
    "samples_per_s": "fast",
    "final_loss": "low",
    "checkpoint": {"step": "4", "path": 7, "rank": None},
    "ranks": {"0": {"state": 3, "loss": "x", "samples_per_s": "y", "printed_s_before_end": "z", "steps_reported": 0}},
    "warnings": [{"ranks": "0", "message": 4}, 7],
    "stragglers": [{"rank": 1, "start": "then", "gap_pct": "x"}, {"rank": 1, "start": 1.0e9, "gap_pct": "x"}],
    "never_reported": "1",
    "failure": {"rank": "0", "node": [], "summary": {"a": 1}, "hint": 5, "log_tail": "abc"},
}


def test_a_summary_json_of_the_wrong_kinds_ends_monitor_with_its_summary_not_a_traceback(tmp_path: Path) -> None:
    """`"wall_s": "long"` used to end `monitor` in a TypeError in duration()."""
    run_dir = finished_run(tmp_path / "run")
    (run_dir / "summary.json").write_text(json.dumps(SUMMARY_OF_THE_WRONG_KINDS))
    result = npu_wizard("monitor", "--plain", str(run_dir), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "outcome: unknown" in result.stdout and "wall time ?" in result.stdout
    assert "rank 1 was 0% slower in None" in result.stdout  # the one straggler with a start; "then" is none
    assert "failure: unknown rank: {" not in result.stdout
    report = npu_wizard("report", str(run_dir), cwd=tmp_path)
    assert report.returncode == 0 and "Traceback" not in report.stderr, report.stderr


def test_an_events_file_swapped_for_a_fifo_while_watched_is_passed_over_and_named(tmp_path: Path) -> None:
    run_dir = finished_run(tmp_path / "run")
    (run_dir / "summary.json").unlink()
    # RegularFollower passes a file over in the place EventFollower reads it: were that renamed, this would hang
    assert callable(vars(EventFollower).get("_read"))
    folder = RunFolder(run_dir, clock=lambda: 2.0e9)
    planted(run_dir / "events" / "rank-1.jsonl", "fifo")
    assert folder.tick() == "finished"  # no runner: both ranks finished (a blocking read would never return)
    assert folder.notes == [
        f"warning: {run_dir / 'events' / 'rank-1.jsonl'} is a FIFO, not a regular file: npu-wizard reads only "
        "regular files in a run folder (move it away)"
    ]
    printed = tmp_path / "printed"
    with printed.open("w") as out:
        watch_plain(folder, out=out, poll=0)
    assert folder.notes[0] in printed.read_text()


def test_a_log_linked_to_a_private_file_is_not_shown_by_the_monitor_or_the_report(tmp_path: Path) -> None:
    """logs/rank-0.log -> ~/.ssh/id_rsa showed the key in a failure's log tail, and in report.html."""
    run_dir = tmp_path / "run"
    writer = EventWriter(run_dir, 0)
    writer.started(local_rank=0, node=0, device="cpu", world_size=1)
    try:
        raise ValueError("bad batch")
    except ValueError as error:
        writer.error(error)
    writer.close()
    secret = tmp_path / "id_rsa"
    secret.write_text("PRIVATE KEY 1234\n")
    (run_dir / "logs").mkdir()
    (run_dir / "logs" / "rank-0.log").symlink_to(secret)
    result = npu_wizard("monitor", "--plain", str(run_dir), cwd=tmp_path)
    assert "PRIVATE KEY" not in result.stdout, result.stdout
    assert f"{run_dir / 'logs' / 'rank-0.log'} is a symbolic link, not a regular file" in result.stdout
    assert npu_wizard("report", str(run_dir), cwd=tmp_path).returncode == 0
    assert "PRIVATE KEY" not in (run_dir / "report.html").read_text()


def test_the_smoke_report_refuses_an_events_file_that_is_a_fifo(tmp_path: Path) -> None:
    run_dir = finished_run(tmp_path / "run")
    planted(run_dir / "events" / "rank-0.jsonl", "fifo")
    with pytest.raises(RunFileError, match="rank-0.jsonl is a FIFO, not a regular file"):
        print_smoke_report(run_dir, 2)
    assert sorted(read_events(finished_run(tmp_path / "other"))) == [0, 1]


# ---- the newest run of a project --------------------------------------------------------------------------------


def project_with_runs(tmp_path: Path, *names: str) -> Path:
    """A project folder (answers.yaml) whose runs/ holds a finished run of each name, oldest first by name."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "answers.yaml").write_text("project_name: project\n")
    for name in names:
        finished_run(project / "runs" / name)
    return project


def aged(folder: Path, seconds_ago: float) -> None:
    """Set the folder's modification time `seconds_ago` seconds back."""
    then = time.time() - seconds_ago
    os.utime(folder, (then, then))


def test_drawing_an_older_runs_report_does_not_make_it_the_newest(tmp_path: Path) -> None:
    """`report PROJECT` took the folder written last: drawing the older run hid the newer, failed one."""
    project = project_with_runs(tmp_path, "20260101-100000", "20260101-110000")
    older, newer = project / "runs" / "20260101-100000", project / "runs" / "20260101-110000"
    (older / "run.json").write_text(json.dumps({"world_size": 2, "started_at": 1.7e9}))
    (newer / "run.json").write_text(json.dumps({"world_size": 2, "started_at": 1.7e9 + 3600}))
    (newer / "summary.json").write_text(json.dumps({"outcome": "failed", "world_size": 2}))
    aged(older, 200)
    aged(newer, 100)
    assert main(["report", str(older)]) == 0  # the older folder is now the one written last
    assert main(["report", str(project)]) == 0
    assert "outcome failed" in (newer / "report.html").read_text()
    result = npu_wizard("monitor", "--plain", str(project), cwd=tmp_path)
    assert f"run folder: {newer}" in result.stdout and "outcome: failed" in result.stdout


def test_runs_without_run_json_are_ordered_by_the_stamp_of_their_name_then_their_first_event(tmp_path: Path) -> None:
    project = project_with_runs(tmp_path, "20260101-110000-1", "20260101-110000", "20260101-105959")
    for run_dir in (project / "runs").iterdir():
        (run_dir / "run.json").unlink()
        aged(run_dir, 0 if run_dir.name == "20260101-105959" else 100)
    assert run_folder_path(project) == project / "runs" / "20260101-110000-1"
    planted(project / "runs" / "20260101-105959" / "run.json", "fifo")  # an older run's: passed over, not read
    assert run_folder_path(project) == project / "runs" / "20260101-110000-1"
    latest = project / "runs" / "latest"  # the launch scripts run by hand: its ranks' first event says when
    finished_run(latest)
    (latest / "run.json").unlink()
    aged(latest, 500)
    assert run_folder_path(project) == latest
