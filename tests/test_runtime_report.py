"""runtime.report: a user's script reports its steps and checkpoints; nothing happens outside npu-wizard."""

from __future__ import annotations

import contextlib
import random
import subprocess
import sys
import time
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
    monkeypatch.setenv(report.ENV_REPORT_S, "3600")  # a long interval: the stride only doubles, event by event
    monkeypatch.setenv("WORLD_SIZE", "4")
    writer = EventWriter(tmp_path, 2)
    try:
        report.step(1, loss=torch.tensor(2.0, requires_grad=True) * 1.0, samples=8)
        began = time.perf_counter()
        for step in range(2, 11):
            report.step(step, loss=torch.tensor(float(step)), samples=8, data_s=0.01 * step, forward_s=0.5)
        assert writer.step == 10  # the heartbeats know the newest step at once
        assert [e["step"] for e in step_events(writer)] == [1, 2, 4, 8]  # past 1, 2, 4, 8: strides 1, 2, 4, 8
        report.flush()
        within = time.perf_counter() - began
        first, *_, last = step_events(writer)
    finally:
        writer.close()
    assert (first["loss"], first["rank"]) == (2.0, 2)
    assert "samples_per_s" not in first  # the first call's samples took a time nobody measured
    assert (last["step"], last["loss"]) == (10, 10.0) and "total_steps" not in last
    assert last["data_s"] == pytest.approx((0.09 + 0.10) / 2)  # the window since step 8: steps 9 and 10
    assert last["forward_s"] == pytest.approx(0.5)
    # 2 calls x 8 samples on this rank, as the job's rate (x world size 4), as train.py reports it:
    # over a window shorter than the calls took
    assert last["samples_per_s"] >= 2 * 8 * 4 / within


class RecordingWriter:
    """A test double of runtime.events.EventWriter: keeps each emitted event with the fake clock's time."""

    def __init__(self, rank: int, clock: list[float], sink: list[tuple[int, dict]]) -> None:
        self.rank, self.clock, self.sink, self.epoch = rank, clock, sink, 0

    def progress(self, step: int, epoch: int) -> None:
        pass

    def emit(self, kind: str, **fields: object) -> None:
        self.sink.append((self.rank, {"event": kind, "time": self.clock[0], **fields}))


def test_every_rank_writes_at_the_same_steps_so_a_slow_rank_is_named_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Four ranks in lockstep (a DDP job), each back from its step a random moment apart; rank 3's forward 50% longer.

    With a timer of its own per rank the ranks' events fell on different steps (2 of 473
    shared by all four) and the detector, matching windows by step, named rank 3 five times
    with a fifth of the seconds it cost.
    """
    from wizard.monitor.stragglers import StragglerDetector

    monkeypatch.setenv(report.ENV_REPORT_S, "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    clock = [1000.0]
    monkeypatch.setattr(report.time, "perf_counter", lambda: clock[0])
    sink: list[tuple[int, dict]] = []
    windows = [report._Window(RecordingWriter(rank, clock, sink)) for rank in range(4)]  # type: ignore[arg-type]
    jitter = random.Random(1)
    began = clock[0]
    for step in range(1, 3000):
        began += 0.05
        for rank, window in enumerate(windows):
            clock[0] = began + jitter.uniform(0, 0.002)
            window.add(step, 1.0, 32, 0.001, 0.03 if rank == 3 else 0.02, None)
    steps = {rank: {e["step"] for r, e in sink if r == rank} for rank in range(4)}
    shared = set.intersection(*steps.values())
    assert all(len(shared) >= 0.95 * len(own) for own in steps.values()), {r: len(s) for r, s in steps.items()}
    assert 100 <= len(shared) <= 300  # about one event a second over 150 s
    found = StragglerDetector(lambda rank: rank // 2)
    for rank in range(4):
        found.rank_started(rank)
    for rank, event in sorted(sink, key=lambda item: item[1]["time"]):
        found.add(rank, event)
    assert [(f.rank, f.node, f.end) for f in found.findings] == [(3, 1, None)]
    assert found.findings[0].gap_pct == pytest.approx(50, abs=5)


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


def test_a_checkpoint_is_an_event_with_an_absolute_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    writer = EventWriter(tmp_path, 1)
    try:
        report.checkpoint(40, tmp_path / "epoch-1.pt")
        report.checkpoint(80, "./ckpt/epoch-2.pt")
    finally:
        writer.close()
    saved = [e for e in events.read_rank_events(writer.path) if e["event"] == "checkpoint"]
    assert [(e["step"], e["path"]) for e in saved] == [
        (40, str(tmp_path / "epoch-1.pt")),
        (80, str(tmp_path / "ckpt" / "epoch-2.pt")),
    ]


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


def recorded(monkeypatch: pytest.MonkeyPatch, steps: list[tuple[int, float]]) -> list[dict]:
    """The step events of one rank whose calls come at (step, seconds since the start), as a fake clock says."""
    monkeypatch.setenv(report.ENV_REPORT_S, "1")
    clock = [1000.0]
    monkeypatch.setattr(report.time, "perf_counter", lambda: clock[0])
    sink: list[tuple[int, dict]] = []
    window = report._Window(RecordingWriter(0, clock, sink))  # type: ignore[arg-type]
    for step, at in steps:
        clock[0] = 1000.0 + at
        window.add(step, 1.0, 32, 0.001, 0.002, None)
    return [event for _, event in sink]


def test_a_script_counting_steps_per_epoch_reports_in_every_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    """30 epochs of 500 steps of 2 ms, numbered 1..500 in each: before, the stride outgrew the epoch and the
    events stopped in the first one (10 events in 30 s)."""
    calls = [(step, (epoch * 500 + step) * 0.002) for epoch in range(30) for step in range(1, 501)]
    found = recorded(monkeypatch, calls)
    epochs = {int((event["time"] - 1000.0) // 1.0) for event in found}  # each epoch is 1 s
    assert epochs >= set(range(30)), sorted(epochs)
    assert len(found) <= 30 * 4  # about one a second, and one as each epoch starts again


def test_steps_that_slow_down_a_hundred_fold_still_report_every_few_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    fast = [(step, step * 0.001) for step in range(1, 10_001)]  # 10 s of 1 ms steps: the stride grows to 512
    slow = [(10_000 + step, 10.0 + step * 0.1) for step in range(1, 301)]  # then 30 s of 100 ms steps
    times = [event["time"] - 1000.0 for event in recorded(monkeypatch, fast + slow)]
    gaps = [later - earlier for earlier, later in zip(times, times[1:], strict=False) if earlier >= 10.0]
    assert gaps and max(gaps) <= report.OVERDUE * 1.0 + 0.1, gaps  # before: 4.2 s, 6.4 s, ...


def warnings_of(writer: EventWriter) -> list[str]:
    return [e["message"] for e in events.read_rank_events(writer.path) if e["event"] == "warning"]


@pytest.mark.parametrize(
    ("values", "dropped"),
    [
        ({"loss": 10**400}, "loss=1000000000000000000000000000000000000000...(401 characters)"),
        ({"samples": 10**400}, "samples=1000000000000000000000000000000000000000...(401 characters)"),
        ({"samples": float("inf")}, "samples=inf"),
        ({"data_s": "slow"}, "data_s='slow'"),
        ({"total_steps": 2.5}, "total_steps=2.5"),
        ({"loss": torch.ones(2)}, "loss=tensor([1., 1.])"),
    ],
    ids=["huge-loss", "huge-samples", "infinite-samples", "text-data-s", "fractional-total", "two-element-loss"],
)
def test_a_value_the_hook_cannot_take_is_dropped_with_one_warning_and_never_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, values: dict, dropped: str
) -> None:
    """Before, report.step(1, loss=10**400) raised OverflowError into the training loop, and every later call too."""
    monkeypatch.setenv(report.ENV_REPORT_S, "0")
    monkeypatch.setattr(report, "_warned", set(), raising=False)
    writer = EventWriter(tmp_path, 0)
    try:
        for step in range(1, 4):
            report.step(step, **values)
        report.step(4, loss=0.25, samples=8)
        report.flush()
        found = step_events(writer)
        said = warnings_of(writer)
    finally:
        writer.close()
    assert [e["step"] for e in found] == [1, 2, 3, 4]
    (name,) = values
    assert all(name not in e for e in found[:3])
    assert found[3]["loss"] == 0.25
    assert len(said) == 1 and said[0].startswith(f"runtime.report: {dropped} cannot be recorded"), said
    assert said[0].endswith("it is left out (this warning is given once)")


@pytest.mark.parametrize("bad", ["7", None, 1.5, 2**63, 10**400], ids=["text", "none", "fraction", "2**63", "10**400"])
def test_a_step_that_is_no_whole_number_drops_the_call_and_the_next_ones_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: object
) -> None:
    monkeypatch.setenv(report.ENV_REPORT_S, "0")
    monkeypatch.setattr(report, "_warned", set(), raising=False)
    writer = EventWriter(tmp_path, 0)
    try:
        report.step(bad, loss=1.0)  # type: ignore[arg-type]
        report.step(bad, loss=1.0)  # type: ignore[arg-type]
        report.step(torch.tensor(5), loss=0.5)  # a 0-d integer tensor is a whole number
        report.checkpoint(bad, "x.pt")  # type: ignore[arg-type]
        report.checkpoint(5, None)  # type: ignore[arg-type]
        report.flush()
        found = step_events(writer)
        said = warnings_of(writer)
    finally:
        writer.close()
    assert [(e["step"], e["loss"]) for e in found] == [(5, 0.5)]
    assert [line.split("=", 1)[0] for line in said] == [
        "runtime.report: step",
        "runtime.report: checkpoint step",
        "runtime.report: checkpoint path",
    ]


def test_a_full_disk_or_a_raising_argument_never_raises_into_the_training_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class RaisingIndex:
        def __index__(self) -> int:
            raise ZeroDivisionError("a user's __index__")

    class RaisingPath:
        def __fspath__(self) -> str:
            raise RuntimeError("a user's __fspath__")

    monkeypatch.setenv(report.ENV_REPORT_S, "0")
    monkeypatch.setattr(report, "_warned", set(), raising=False)
    writer = EventWriter(tmp_path, 0)
    try:
        report.step(RaisingIndex(), loss=1.0)  # type: ignore[arg-type]
        report.checkpoint(RaisingIndex(), "x.pt")  # type: ignore[arg-type]
        report.checkpoint(5, RaisingPath())  # type: ignore[arg-type]
        events_file = writer._file
        writer._file = open("/dev/full", "w", buffering=1)  # noqa: SIM115 - each write fails with ENOSPC
        try:
            report.step(6, loss=0.5)  # before: OSError from the warning about the step the disk refused
            report.flush()
            report.checkpoint(6, "x.pt")  # before: OSError raised into the script
        finally:
            writer._file, full = events_file, writer._file
            with contextlib.suppress(OSError):  # closed even though its last flush fails
                full.close()
    finally:
        writer.close()
