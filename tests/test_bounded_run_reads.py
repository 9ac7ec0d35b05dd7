"""Readers of a run folder's files outside the monitor: bounded, no link followed (issue 36, item 18)."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from runtime import events
from runtime.preemption import preempted_step
from wizard.bundle.nodes import run_info


def _preempted_line(step: int) -> str:
    return json.dumps({"event": "preempted", "step": step, "time": 1.0}) + "\n"


@pytest.mark.usefixtures("python_gc_defaults")  # a tracemalloc peak of this process
def test_the_last_event_of_a_large_events_file_is_found_reading_only_its_end(tmp_path: Path) -> None:
    path = events.events_path(tmp_path, 0)
    path.parent.mkdir(parents=True)
    with path.open("w") as file:
        file.write(json.dumps({"event": "note", "text": "x" * (40 * 2**20)}) + "\n")
        file.write(_preempted_line(7))
    tracemalloc.start()
    try:
        step = preempted_step(tmp_path, [0])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert step == 7
    assert peak < 8 * 2**20


def test_an_events_file_that_is_a_link_is_not_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_text(_preempted_line(3))
    path = events.events_path(tmp_path, 0)
    path.parent.mkdir(parents=True)
    path.symlink_to(elsewhere)
    assert preempted_step(tmp_path, [0]) is None


def test_run_info_does_not_follow_a_link_in_place_of_run_json(tmp_path: Path) -> None:
    private = tmp_path / "private.json"
    private.write_text(json.dumps({"engine": "ssh", "secret": 1}))
    (tmp_path / "run.json").symlink_to(private)
    assert run_info(tmp_path) == {}


def test_run_info_of_a_fifo_in_place_of_run_json_is_empty_without_blocking(tmp_path: Path) -> None:
    import os

    os.mkfifo(tmp_path / "run.json")
    assert run_info(tmp_path) == {}


def test_part_of_a_log_is_its_end_from_a_whole_line_with_the_files_size(tmp_path: Path) -> None:
    from wizard.monitor.run_files import read_part

    log = tmp_path / "rank-0.log"
    log.write_bytes(b"first line\nsecond line\nthird\n")
    tail, head = read_part(log, 12), read_part(log, 15, head=True)
    assert (tail.data, tail.size, tail.cut) == (b"third\n", 29, True)
    assert (head.data, head.cut) == (b"first line\n", True)
    assert read_part(log, 64) == read_part(log, 64, head=True) and not read_part(log, 64).cut
    assert read_part(tmp_path / "none.log", 64) is None


def test_a_folder_listing_and_a_part_read_refuse_what_the_whole_reads_refuse(tmp_path: Path) -> None:
    import os

    import pytest

    from wizard.monitor.run_files import RunFileError, entries, is_folder, read_part

    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rank-0.log").symlink_to("/etc/passwd")
    os.mkfifo(tmp_path / "logs" / "rank-1.log")
    (tmp_path / "hang").symlink_to(tmp_path / "logs")
    assert [name for name, _ in entries(tmp_path / "logs")] == ["rank-0.log", "rank-1.log"]
    for name, kind in (("rank-0.log", "a symbolic link"), ("rank-1.log", "a FIFO")):
        with pytest.raises(RunFileError, match=f"rank-{name[5]}.log is {kind}, not a regular file: npu-wizard reads"):
            read_part(tmp_path / "logs" / name, 64)
    with pytest.raises(RunFileError, match="hang is a symbolic link, not a regular file"):
        is_folder(tmp_path / "hang")
    assert is_folder(tmp_path / "logs") and not is_folder(tmp_path / "events")


def test_a_json_file_nested_past_what_json_reads_is_no_object_and_no_crash(tmp_path: Path) -> None:
    from wizard.monitor.run_files import read_json_object

    (tmp_path / "run.json").write_bytes(b'{"x": ' + b"[" * 200_000 + b"]" * 200_000 + b"}")
    assert read_json_object(tmp_path / "run.json") is None  # json's RecursionError, caught where the file is read
