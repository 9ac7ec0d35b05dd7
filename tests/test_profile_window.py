"""runtime/profile_window.py: a window of steps recorded by the device's profiler, driven by the step calls.

In this process, with torch's real profiler on the CPU; the NPU branch with
the torch_npu test double (no NPU here), per release.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from runtime import events, profile_window, report, status
from tests.doubles.torch_npu_double import install_torch_npu_double, load_package
from wizard.answers import hardware

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def profiling(monkeypatch: pytest.MonkeyPatch) -> Iterator[callable]:
    """Set the run's profile variables and reload the module, which reads them once; clean up after."""

    def plan(window: str | None = None, ranks: str | None = None) -> None:
        for name, value in ((profile_window.ENV_PROFILE, window), (profile_window.ENV_PROFILE_RANKS, ranks)):
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        importlib.reload(profile_window)

    asks = dict(status._handlers)
    yield plan
    monkeypatch.delenv(profile_window.ENV_PROFILE, raising=False)
    monkeypatch.delenv(profile_window.ENV_PROFILE_RANKS, raising=False)
    importlib.reload(profile_window)
    # a plan's reload registers the "profile" ask with runtime.status: leave the process's handlers as they were
    status._handlers.clear()
    status._handlers.update(asks)


def train(steps: range, call: callable = profile_window.step) -> None:
    """A tiny model's steps, each followed by the step call (train.py's, or report.step)."""
    model = torch.nn.Linear(16, 16)
    for step in steps:
        with torch.profiler.record_function("one_step_of_work"):
            model(torch.randn(8, 16)).sum().backward()
        call(step)


def steps_in(trace: Path) -> list[str]:
    """The ProfilerStep spans a chrome trace holds (json.load opens it: the viewers' format)."""
    document = json.loads(trace.read_text())
    return [e["name"] for e in document["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")]


def profile_events(run_dir: Path, rank: int = 0) -> list[dict]:
    path = events.events_path(run_dir, rank)
    return [json.loads(line) for line in path.read_text().splitlines() if '"profile"' in line]


@pytest.mark.parametrize(("text", "window"), [("20:30", (20, 30)), ("1:2", (1, 2)), ("50:60", (50, 60))])
def test_a_window_is_a_to_b(text: str, window: tuple[int, int]) -> None:
    assert profile_window.parse_window(text) == window


@pytest.mark.parametrize("text", ["", "20", "30:20", "20:20", "0:10", "a:b", "-1:3", "1:2:3", "２:３"])
def test_a_bad_window_is_refused_with_what_to_give(text: str) -> None:
    with pytest.raises(ValueError, match="A:B|A must be"):
        profile_window.parse_window(text)


def test_ranks_are_all_a_list_or_the_straggler() -> None:
    assert profile_window.parse_ranks("all") == (None, False, 1)
    assert profile_window.parse_ranks("0,3") == (frozenset({0, 3}), False, 1)
    assert profile_window.parse_ranks("straggler") == (None, True, 1)
    assert profile_window.parse_ranks("straggler:3") == (None, True, 3)
    for bad in ("", "x", "0,,3", "straggler:0", "straggler:x", "-1"):
        with pytest.raises(ValueError):
            profile_window.parse_ranks(bad)


def test_off_the_step_call_makes_no_profiler_and_imports_no_torch(tmp_path: Path) -> None:
    """Without NPU_WIZARD_PROFILE a user's script's report.step calls never touch the profiler (nor import torch)."""
    code = (
        "import sys\n"
        "from runtime import events, profile_window, report\n"
        f"writer = events.EventWriter({str(tmp_path)!r}, 0)\n"
        "for step in range(1, 2001):\n"
        "    report.step(step)\n"
        "profile_window.close()\n"
        "writer.close()\n"
        "print(profile_window._windows is None, 'torch' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("NPU_WIZARD_")}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False"]
    assert not (tmp_path / "profile").exists()


def test_the_window_holds_the_steps_after_a_up_to_b(profiling: callable, tmp_path: Path) -> None:
    profiling("5:8", "all")
    writer = events.EventWriter(tmp_path, 0)
    try:
        train(range(1, 13))
    finally:
        writer.close()
    (trace,) = (tmp_path / "profile" / "rank-0").glob("rank-0.*.pt.trace.json")
    assert len(steps_in(trace)) == 3  # steps 6, 7 and 8: the waiting and warm-up steps are not in it
    (said,) = profile_events(tmp_path)
    assert (said["first"], said["last"], said["reason"], said["outcome"]) == (5, 8, "planned", "recorded")
    assert said["path"] == str(tmp_path / "profile" / "rank-0")


def test_report_step_drives_the_window_of_a_users_script(profiling: callable, tmp_path: Path) -> None:
    profiling("2:4", "all")
    writer = events.EventWriter(tmp_path, 0)
    try:
        train(range(1, 8), call=report.step)
    finally:
        writer.close()
    (trace,) = (tmp_path / "profile" / "rank-0").glob("*.pt.trace.json")
    assert len(steps_in(trace)) == 2


def test_only_the_ranks_asked_for_record(profiling: callable, tmp_path: Path) -> None:
    profiling("2:4", "1,3")
    writer = events.EventWriter(tmp_path, 2)
    try:
        train(range(1, 8))
    finally:
        writer.close()
    assert not (tmp_path / "profile").exists()


def test_a_rank_resumed_past_the_window_says_so_and_records_nothing(
    profiling: callable, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profiling("5:8", "all")
    writer = events.EventWriter(tmp_path, 0)
    try:
        train(range(40, 45))
    finally:
        writer.close()
    assert not (tmp_path / "profile").exists()
    assert "profile: rank 0 is past step 5 (at step 40), so the window 5:8 is not recorded" in capsys.readouterr().err


def test_a_window_the_training_ends_in_is_written_cut_short(profiling: callable, tmp_path: Path) -> None:
    profiling("3:20", "all")
    writer = events.EventWriter(tmp_path, 0)
    try:
        train(range(1, 8))
        profile_window.close()
    finally:
        writer.close()
    (trace,) = (tmp_path / "profile" / "rank-0").glob("*.pt.trace.json")
    # steps 4 to 7 (1 waits, 2 warms up, 3 starts nothing), and the span the last step call opened
    assert len(steps_in(trace)) == 5
    (said,) = profile_events(tmp_path)
    assert said["outcome"] == "cut short: the training ended first"


def test_a_request_records_the_next_steps(profiling: callable, tmp_path: Path) -> None:
    """The runner's ask (a straggler): the next step warms up, the N after it are recorded."""
    profiling(None, "straggler")
    writer = events.EventWriter(tmp_path, 0)
    try:
        train(range(1, 5))
        assert not (tmp_path / "profile").exists()  # straggler mode: nothing until asked
        profile_window.request(3)
        train(range(5, 12))
    finally:
        writer.close()
    (trace,) = (tmp_path / "profile" / "rank-0").glob("*.pt.trace.json")
    assert len(steps_in(trace)) == 3
    (said,) = profile_events(tmp_path)
    # asked before step 5: the profiler starts at its end, step 6 warms up, steps 7 to 9 are recorded
    assert (said["first"], said["last"], said["reason"]) == (6, 9, "asked")


@pytest.mark.parametrize("version", ["2.1.0.post10", "2.5.1"])
def test_on_an_npu_torch_npu_profiler_records_for_msprof_analyze(
    profiling: callable, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    """The torch_npu double stands in for an NPU: level 1, text export, profile/ascend; async parse where it can."""
    double = install_torch_npu_double(tmp_path / "double", version)
    monkeypatch.setenv("TORCH_NPU_DOUBLE_RECORD", str(double.record_dir))
    monkeypatch.setitem(sys.modules, "torch_npu", load_package(tmp_path / "double", version))
    if hardware.has_profiler_async_parse(version):  # the launch script sets it from the release (run-node.sh)
        monkeypatch.setenv(profile_window.ENV_ASYNC_PARSE, "1")
    profiling("3:6", "all")
    run_dir = tmp_path / "run"
    writer = events.EventWriter(run_dir, 5)
    try:
        train(range(1, 10))
    finally:
        writer.close()
    calls = double.profiler_calls()
    made = {call["call"]: call for call in calls}
    assert made["profile"]["activities"] == ["CPU", "NPU"]
    assert made["_ExperimentalConfig"]["profiler_level"] == "Level1"
    assert made["_ExperimentalConfig"]["export_type"] == "text"
    assert (made["schedule"]["wait"], made["schedule"]["warmup"], made["schedule"]["active"]) == (1, 1, 3)
    assert made["tensorboard_trace_handler"]["dir_name"] == str(run_dir / "profile" / "ascend")
    assert made["tensorboard_trace_handler"]["worker_name"] == "rank-5"
    assert made["tensorboard_trace_handler"].get("async_mode") is (True if version == "2.5.1" else None)
    assert [call["call"] for call in calls].count("step") == 5 and calls[-1]["call"] == "stop"
    assert "analyse" in made
    (said,) = profile_events(run_dir, 5)
    assert said["path"] == str(run_dir / "profile" / "ascend")


def test_async_parse_is_refused_by_a_release_without_it(tmp_path: Path) -> None:
    """The double holds the release's signature: 2.1.0.post10's handler has no async_mode (so it is not passed)."""
    package = load_package(tmp_path, "2.1.0.post10")
    with pytest.raises(TypeError, match="async_mode"):
        package.profiler.tensorboard_trace_handler("x", worker_name="rank-0", async_mode=True)
    assert not hardware.has_profiler_async_parse("2.1.0.post10")
    assert hardware.has_profiler_async_parse("2.1.0.post12") and hardware.has_profiler_async_parse("2.4.0.post4")
    assert not hardware.has_profiler_async_parse("2.4.0.post2") and hardware.has_profiler_async_parse("2.9.0.post6")


def test_a_window_cut_short_says_the_last_step_it_recorded(profiling: callable, tmp_path: Path) -> None:
    profiling("3:100000", "all")
    writer = events.EventWriter(tmp_path, 0)
    try:
        train(range(1, 8))
        profile_window.close()
    finally:
        writer.close()
    (said,) = profile_events(tmp_path)
    assert (said["first"], said["last"]) == (3, 7)


def test_a_window_past_the_end_of_the_training_says_nothing_was_recorded(
    profiling: callable, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profiling("100:200", "all")
    writer = events.EventWriter(tmp_path, 0)
    try:
        train(range(1, 8))
        profile_window.close()
    finally:
        writer.close()
    assert not (tmp_path / "profile").exists()
    assert (
        "profile: the training ended at step 7, before the window 100:200: rank 0 recorded nothing"
        in capsys.readouterr().err
    )
