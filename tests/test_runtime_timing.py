"""runtime/timing.py: each rank's data-wait and forward time per logged window, cheaply.

On the CPU the host clock times real work here. The NPU branch runs against
the torch_npu test double (no NPU exists here), which records every Event
call: the forward must be timed with device events made with enable_timing,
reused from window to window, read only at the window's end, and never
waited on.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from runtime import device, events, timing
from tests.doubles.torch_npu_double import install_torch_npu_double, load_package


def busy(seconds: float) -> None:
    """Real work on the CPU for about `seconds` (the host clock must see it)."""
    end = time.perf_counter() + seconds
    weights = torch.ones(64, 64)
    while time.perf_counter() < end:
        weights = weights @ torch.ones(64, 64) / 64


def slow_batches(count: int, seconds: float) -> list[int]:
    """A loader whose every batch takes `seconds` of work to make."""

    def make() -> object:
        for index in range(count):
            busy(seconds)
            yield index

    return make()


def test_the_cpu_timer_gives_the_mean_data_wait_and_forward_per_step() -> None:
    timer = timing.StepTimer("cpu")
    forwards = []
    for _ in timer.batches(slow_batches(4, 0.02)):
        started = time.perf_counter()
        with timer.forward():
            busy(0.01)
        forwards.append(time.perf_counter() - started)  # encloses the timer's own measure
    window = timer.window()
    assert set(window) == {"data_s", "forward_s"}
    assert window["data_s"] >= 0.02, window
    assert 0.01 <= window["forward_s"] <= sum(forwards) / 4, (window, forwards)


def test_each_window_starts_afresh_and_spans_an_epoch_end() -> None:
    timer = timing.StepTimer("cpu")
    for _ in timer.batches(range(2)):
        with timer.forward():
            busy(0.1)
    timer.window()
    forwards = []
    for _epoch in range(2):  # a window that an epoch end cuts in two still counts every step once
        for _ in timer.batches(range(2)):
            started = time.perf_counter()
            with timer.forward():
                busy(0.002)
            forwards.append(time.perf_counter() - started)
    window = timer.window()
    # the mean of these 4 steps (each enclosed by the test's own clock), nothing of the window before
    assert 0.002 <= window["forward_s"] <= sum(forwards) / 4, (window, forwards)
    assert timer.window() == {}  # no step since: nothing to say


def test_timing_off_leaves_the_loop_untouched() -> None:
    timer = timing.StepTimer("cpu", enabled=timing.timing_enabled({timing.ENV_STEP_TIMING: "0"}))
    batches = [1, 2, 3]
    assert timer.batches(batches) is batches
    with timer.forward():
        busy(0.001)
    assert timer.window() == {}
    assert timing.timing_enabled({})


def test_under_gradient_accumulation_the_times_are_per_optimizer_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two micro-batches a step: data_s and forward_s add up over both, so ranks compare optimizer steps.

    The timer's clock is a stand-in the test moves: each batch takes 0.02 s to load and each forward 0.01 s."""
    now = [0.0]
    monkeypatch.setattr(timing, "perf_counter", lambda: now[0])

    def loading(count: int) -> Iterator[int]:
        for index in range(count):
            now[0] += 0.02
            yield index

    timer = timing.StepTimer("cpu", micro_batches=2)
    for _ in timer.batches(loading(4)):  # 2 optimizer steps
        with timer.forward():
            now[0] += 0.01
    window = timer.window()
    assert window == pytest.approx({"data_s": 0.04, "forward_s": 0.02}), window


class RecordedHangs:
    """Stands in for runtime.rehearsal.Hangs: records the steps its hooks are called at."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def before_batch(self, step: int) -> None:
        self.calls.append(("before_batch", step))

    def after_forward(self, step: int) -> None:
        self.calls.append(("after_forward", step))


@pytest.mark.parametrize("enabled", [True, False], ids=["timing on", "timing off"])
def test_a_rehearsed_hang_is_at_its_optimizer_step_with_timing_on_or_off(
    enabled: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """NPU_WIZARD_STEP_TIMING=0 leaves the rehearsal in place, and step N is the Nth optimizer step, once."""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("NPU_WIZARD_REHEARSE", f"hang:1:2:data,hang:1:3:sleep,release={tmp_path}")
    for step in (2, 3):
        (tmp_path / f"step-{step}").touch()  # released at once: the test sees the calls, not a wait
    timer = timing.StepTimer("cpu", enabled=enabled, micro_batches=2)
    assert timer._hang is not None and dict(timer._hang.at) == {2: "data", 3: "sleep"}
    recorded = RecordedHangs()
    timer._hang = recorded  # type: ignore[assignment]
    for _ in timer.batches(range(6)):  # 3 optimizer steps of 2 micro-batches
        with timer.forward():
            pass
    assert recorded.calls == [
        ("before_batch", 1), ("after_forward", 1),
        ("before_batch", 2), ("after_forward", 2),
        ("before_batch", 3), ("after_forward", 3),
        ("before_batch", 4),  # the loader then says there is no more
    ]  # fmt: skip
    assert (timer.window() != {}) is enabled


def test_a_rehearsed_data_hang_stays_at_its_step_after_an_epoch_dropped_a_short_group(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Epochs of 5 micro-batches, 2 a step: the fifth is fetched and dropped (no step runs it), and the
    second epoch's steps 3 and 4 still get their own data hooks."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("NPU_WIZARD_REHEARSE", f"hang:0:4:data,release={tmp_path}")
    timer = timing.StepTimer("cpu", enabled=False, micro_batches=2)
    recorded = RecordedHangs()
    timer._hang = recorded  # type: ignore[assignment]
    for _epoch in range(2):
        batches = iter(timer.batches(range(5)))
        while len(group := list(itertools.islice(batches, 2))) == 2:  # as train.py's optimizer_steps
            for _ in group:
                with timer.forward():
                    pass
    fetched_for = [step for call, step in recorded.calls if call == "before_batch"]
    ran = [step for call, step in recorded.calls if call == "after_forward"]
    assert ran == [1, 2, 3, 4]
    # epoch 1 asks for step 3's data before its loader runs dry; epoch 2 loads steps 3 and 4 each once
    assert fetched_for == [1, 2, 3, 3, 4, 5], recorded.calls


@pytest.fixture
def npu_double(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> object:
    """torch_npu as the test double (no NPU here), recording its calls."""
    double = install_torch_npu_double(tmp_path, "2.6.0")
    package = load_package(tmp_path, "2.6.0")
    monkeypatch.setenv("TORCH_NPU_DOUBLE_RECORD", str(double.record_dir))
    monkeypatch.setattr(device, "_import_torch_npu", lambda: package)
    return double


def test_on_npu_the_forward_is_timed_with_device_events_read_at_the_window_end(npu_double: object) -> None:
    timer = timing.StepTimer("npu")
    for _ in timer.batches(range(3)):
        with timer.forward():
            busy(0.01)
    calls = [call["call"] for call in npu_double.event_calls()]
    assert calls == ["Event", "Event", "record", "record"] * 3  # a pair per step, nothing read yet
    assert all(call["enable_timing"] for call in npu_double.event_calls() if call["call"] == "Event")
    window = timer.window()
    assert window["forward_s"] >= 0.01, window
    read = [call["call"] for call in npu_double.event_calls()[len(calls) :]]
    assert read == ["elapsed_time"] * 3


def test_on_npu_the_events_are_reused_and_never_waited_on(npu_double: object) -> None:
    timer = timing.StepTimer("npu")
    for _window in range(3):
        for _ in timer.batches(range(4)):
            with timer.forward():
                pass
        timer.window()
    calls = [call["call"] for call in npu_double.event_calls()]
    assert calls.count("Event") == 8  # 4 steps a window: 4 pairs made once
    assert calls.count("record") == 24
    assert "synchronize" not in calls and "query" not in calls
    assert all(call["call"] != "synchronize" for call in npu_double.npu_calls())


def test_step_events_carry_the_two_times_only_when_given(tmp_path: Path) -> None:
    writer = events.EventWriter(tmp_path, 0)
    timed = writer.step_done(step=4, epoch=0, loss=1.0, samples_per_s=10.0, lr=0.1, data_s=0.002, forward_s=0.01)
    untimed = writer.step_done(step=8, epoch=0, loss=0.9, samples_per_s=10.0, lr=0.1)
    writer.close()
    assert (timed["data_s"], timed["forward_s"]) == (0.002, 0.01)
    assert "data_s" not in untimed and "forward_s" not in untimed
    assert [e.get("forward_s") for e in events.read_rank_events(events.events_path(tmp_path, 0))] == [0.01, None]
