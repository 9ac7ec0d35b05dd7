"""A run that restarted is bundled: the runner's own logs/attempt-N/ and hang/attempt-N/ folders are taken."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from wizard.bundle.collect import collect
from wizard.bundle.redact import Redactor
from wizard.errors import TargetError
from wizard.run.attempts import keep_logs


def restarted_run(tmp_path: Path) -> Path:
    """A run folder whose first attempt failed and whose second is running, its files kept as the runner keeps them."""
    run_dir = tmp_path / "project" / "runs" / "20260101T000000Z"
    for folder in ("events", "logs", "hang"):
        (run_dir / folder).mkdir(parents=True)
    (run_dir / "events" / "rank-0.jsonl").write_text('{"event": "step", "rank": 0, "step": 3}\n')
    (run_dir / "logs" / "rank-0.log").write_text("first attempt\n")
    (run_dir / "hang" / "rank-0.txt").write_text("first attempt's stacks\n")
    keep_logs(run_dir, 1)
    (run_dir / "logs" / "rank-0.log").write_text("second attempt\n")
    return run_dir


def members_of(run_dir: Path) -> dict[str, bytes]:
    return dict(collect(run_dir, Redactor(), {"PATH": ""}).members)


def test_the_logs_and_stacks_of_every_attempt_are_bundled(tmp_path: Path) -> None:
    members = members_of(restarted_run(tmp_path))
    assert members["logs/rank-0.log"] == b"second attempt\n"
    assert members["logs/attempt-1/rank-0.log"] == b"first attempt\n"
    assert members["hang/attempt-1/rank-0.txt"] == b"first attempt's stacks\n"


@pytest.mark.parametrize("planted", ["fifo", "link", "folder"])
def test_an_attempt_folder_is_read_one_level_deep_and_each_file_checked(tmp_path: Path, planted: str) -> None:
    run_dir = restarted_run(tmp_path)
    path = run_dir / "logs" / "attempt-1" / "rank-9.log"
    {"fifo": os.mkfifo, "link": lambda p: p.symlink_to("/etc/passwd"), "folder": os.mkdir}[planted](path)
    kind = {"fifo": "a FIFO", "link": "a symbolic link", "folder": "a folder"}[planted]
    with pytest.raises(TargetError, match=f"{path} is {kind}, not a regular file"):
        members_of(run_dir)


def test_a_link_in_place_of_an_attempt_folder_is_refused(tmp_path: Path) -> None:
    run_dir = restarted_run(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    (run_dir / "logs" / "attempt-2").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(TargetError, match="attempt-2 is a symbolic link, not a regular file"):
        members_of(run_dir)


def test_another_folder_in_logs_is_still_refused(tmp_path: Path) -> None:
    run_dir = restarted_run(tmp_path)
    (run_dir / "logs" / "mine").mkdir()
    with pytest.raises(TargetError, match="mine is a folder, not a regular file"):
        members_of(run_dir)
