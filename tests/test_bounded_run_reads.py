"""Readers of a run folder's files outside the monitor: bounded, no link followed (issue 36, item 18)."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

from runtime import events
from runtime.preemption import preempted_step
from wizard.bundle.nodes import run_info


def _preempted_line(step: int) -> str:
    return json.dumps({"event": "preempted", "step": step, "time": 1.0}) + "\n"


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
