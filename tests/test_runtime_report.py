"""runtime.report: a user's script reports its steps and checkpoints; nothing happens outside npu-wizard."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from runtime import events, report
from runtime.events import EventWriter

REPO = Path(__file__).resolve().parent.parent


def step_events(writer: EventWriter) -> list[dict]:
    return [e for e in events.read_rank_events(writer.path) if e["event"] == "step"]


def test_outside_npu_wizard_the_calls_do_nothing(tmp_path: Path) -> None:
    code = (
        "from runtime import report\n"
        "for step in range(1, 1001):\n"
        "    report.step(step, loss=0.5, samples=32, data_s=0.1, forward_s=0.2, total_steps=1000)\n"
        "report.checkpoint(1000, 'ckpt.pt')\n"
        "report.flush()\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (result.returncode, result.stdout.strip()) == (0, "ok"), result.stderr
    assert list(tmp_path.iterdir()) == []  # no events, no logs, no runs/ folder


def test_each_window_becomes_one_step_event(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(report.ENV_REPORT_S, "3600")  # one event, then none until the flush
    monkeypatch.setenv("WORLD_SIZE", "4")
    writer = EventWriter(tmp_path, 2)
    try:
        report.step(1, loss=torch.tensor(2.0, requires_grad=True) * 1.0, samples=8)
        for step in range(2, 11):
            report.step(step, loss=torch.tensor(float(step)), samples=8, data_s=0.01 * step, forward_s=0.5)
        assert writer.step == 10  # the heartbeats know the newest step at once
        assert [e["step"] for e in step_events(writer)] == [1]
        report.flush()
        first, last = step_events(writer)
    finally:
        writer.close()
    assert (first["loss"], first["rank"]) == (2.0, 2)
    assert "samples_per_s" not in first  # the first call's samples took a time nobody measured
    assert (last["step"], last["loss"]) == (10, 10.0) and "total_steps" not in last
    assert last["data_s"] == pytest.approx(sum(0.01 * s for s in range(2, 11)) / 9)
    assert last["forward_s"] == pytest.approx(0.5)
    # 9 calls x 8 samples on this rank, as the job's rate (x world size 4), as train.py reports it
    elapsed = last["time"] - first["time"]
    assert last["samples_per_s"] == pytest.approx(9 * 8 * 4 / elapsed, rel=0.2)


def test_total_steps_and_a_zero_interval_write_every_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(report.ENV_REPORT_S, "0")
    writer = EventWriter(tmp_path, 0)
    try:
        for step in range(1, 4):
            report.step(step, loss=1.0 / step, total_steps=30)
        report.flush()  # nothing pending: no fourth event
        found = step_events(writer)
    finally:
        writer.close()
    assert [(e["step"], e["total_steps"]) for e in found] == [(1, 30), (2, 30), (3, 30)]
    assert all("lr" not in e and "epoch" not in e for e in found)


def test_a_loss_that_is_no_number_is_left_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(report.ENV_REPORT_S, "0")
    writer = EventWriter(tmp_path, 0)
    try:
        report.step(1, loss="nan-ish")
        [found] = step_events(writer)
    finally:
        writer.close()
    assert found["step"] == 1 and "loss" not in found


def test_a_checkpoint_is_an_event(tmp_path: Path) -> None:
    writer = EventWriter(tmp_path, 1)
    try:
        report.checkpoint(40, tmp_path / "epoch-1.pt")
    finally:
        writer.close()
    [saved] = [e for e in events.read_rank_events(writer.path) if e["event"] == "checkpoint"]
    assert (saved["step"], saved["path"]) == (40, str(tmp_path / "epoch-1.pt"))


def test_a_new_writer_starts_a_new_window(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(report.ENV_REPORT_S, "3600")
    first = EventWriter(tmp_path / "a", 0)
    report.step(1, loss=1.0)
    first.close()
    second = EventWriter(tmp_path / "b", 0)
    try:
        report.step(7, loss=3.0)
        [found] = step_events(second)
    finally:
        second.close()
    assert (found["step"], found["loss"]) == (7, 3.0)
