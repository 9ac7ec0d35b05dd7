"""The report's profile section: traces read as a stream, bounded, summed up per rank and per straggler pair."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from wizard.run_page import trace_reader
from wizard.run_page.profile_section import profile_section
from wizard.run_page.profiles import find_traces, read_profile
from wizard.run_page.trace_reader import Reading, trace_events

DEVICE_TRACE = "h200-resnet18-reduce-overhead.pt.trace.json.gz"


def span(name: str, start: float, length: float, tid: int = 1, cat: str = "cpu_op") -> dict:
    """One complete event of a chrome trace."""
    return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": start, "dur": length}


def step_events(step: int, start: float, slow_ms: float = 0.0) -> list[dict]:
    """One step of 10 ms on thread 1: a data fetch, a matmul, an all_reduce, then a wait on gloo's thread."""
    events = [
        span(f"ProfilerStep#{step}", start, 10_000, cat="user_annotation"),
        span("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", start, 1_000, cat="user_annotation"),
        span("aten::mm", start + 1_000, 3_000),
        span("aten::add", start + 1_500, 500),  # inside aten::mm: its self time is 2.5 ms
        span("c10d::allreduce_", start + 4_000, 1_500),
        # 4 ms of the 4.5 the step thread waits with no operator, gloo's thread runs the collective
        span("gloo:all_reduce", start + 5_500, 4_000, tid=2),
    ]
    if slow_ms:
        events.append(span("test_slow_op", start + 9_000, slow_ms * 1000, cat="user_annotation"))
    return events


def write_trace(path: Path, events: list[dict], *, bare: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    document = events if bare else {"schemaVersion": 1, "deviceProperties": [], "traceEvents": events, "x": 1}
    path.write_text(json.dumps(document, indent=1))
    return path


def test_the_time_of_a_step_adds_up_by_category(tmp_path: Path) -> None:
    events = [event for step in range(3) for event in step_events(step, step * 10_000)]
    trace = write_trace(tmp_path / "profile" / "rank-0" / "rank-0.1.pt.trace.json", events)
    profile = read_profile(0, trace)
    assert profile.steps == 3
    per_step = {name: profile.per_step_ms(us) for name, us in profile.categories.items()}
    assert per_step == pytest.approx({"data wait": 1.0, "compute": 3.0, "communication": 5.5, "idle": 0.5})
    assert profile.top(3) == [("gloo:all_reduce", 4.0, 3), ("aten::mm", 2.5, 3), ("c10d::allreduce_", 1.5, 3)]


def test_a_bare_array_trace_reads_the_same(tmp_path: Path) -> None:
    """torch_npu's trace_view.json is an array of events, not an object."""
    events = [event for step in range(2) for event in step_events(step, step * 10_000)]
    trace = write_trace(tmp_path / "trace_view.json", events, bare=True)
    assert read_profile(0, trace).steps == 2


def test_values_cut_at_a_chunks_end_read_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 7 characters cut every number, string and event: what is read is what json.load reads."""
    monkeypatch.setattr(trace_reader, "CHUNK", 7)
    events = [*step_events(0, 123456.789), {"ph": "M", "name": "process_name", "args": {"name": "é python"}}]
    trace = write_trace(tmp_path / "t.json", events)
    assert list(trace_events(trace, 1000)) == json.loads(trace.read_text())["traceEvents"]


def test_a_cut_file_is_read_up_to_the_cut_and_says_so(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.json", step_events(0, 0))
    trace.write_bytes(trace.read_bytes()[:-200])
    reading = Reading()
    read = list(trace_events(trace, 1000, reading))
    assert 1 <= len(read) < 6
    assert reading.broken is not None and "breaks off" in reading.broken


def test_reading_stops_at_the_cap_and_the_section_says_so(tmp_path: Path) -> None:
    events = [event for step in range(50) for event in step_events(step, step * 10_000)]
    write_trace(tmp_path / "profile" / "rank-0" / "rank-0.1.pt.trace.json", events)
    html = profile_section(tmp_path, {}, cap=40)
    assert "capped: only the first 40 events of the trace were read" in html


@pytest.mark.usefixtures("python_gc_defaults")  # a tracemalloc peak of this process
def test_a_large_trace_is_read_in_bounded_memory(tmp_path: Path) -> None:
    """A trace of about 12 MB is streamed: the reader holds a chunk and an event, not the file."""
    trace = tmp_path / "big.json"
    with trace.open("w") as handle:
        handle.write('{"schemaVersion": 1, "traceEvents": [')
        for index in range(60_000):
            event = span(f"aten::op_{index % 50}", index * 10.0, 5.0)
            event["args"] = {"input dims": [[512, 512], [512]], "note": "x" * 40}
            handle.write(("," if index else "") + json.dumps(event))
        handle.write("]}")
    assert trace.stat().st_size > 11e6
    tracemalloc.start()
    try:
        read = sum(1 for _ in trace_events(trace, 10**9))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert read == 60_000
    assert peak < 8e6  # a 1 MiB chunk, as text, and its slices: not the 12 MB


def test_a_straggler_is_shown_beside_its_median_rank_slowed_operator_first(tmp_path: Path) -> None:
    folder = tmp_path / "profile"
    write_trace(folder / "rank-1" / "rank-1.5.pt.trace.json", [e for s in range(4) for e in step_events(s, s * 20_000)])
    slow = [e for s in range(4) for e in step_events(s, s * 20_000, slow_ms=6.0)]
    write_trace(folder / "rank-3" / "rank-3.5.pt.trace.json", slow)
    summary = {"profile": {"asked": [{"straggler": 3, "median": 1, "steps": 4, "at": 1.0}], "windows": []}}
    html = profile_section(tmp_path, summary)
    comparison = html[html.index("Straggler rank 3 beside median rank 1") :]
    first_row = comparison[comparison.index("<th>difference</th></tr>") :]
    assert first_row.startswith("<th>difference</th></tr><tr><td>test_slow_op</td><td>6.00</td><td>0.00</td>")
    assert "<h3>Rank 1</h3>" in html and "<h3>Rank 3</h3>" in html


def test_the_newest_trace_of_each_rank_is_found_npu_ones_too(tmp_path: Path) -> None:
    folder = tmp_path / "profile"
    write_trace(folder / "rank-0" / "rank-0.100.pt.trace.json", [])
    newest = write_trace(folder / "rank-0" / "rank-0.200.pt.trace.json", [])
    npu = write_trace(
        folder / "ascend" / "rank-2_20261127_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "trace_view.json", []
    )
    (folder / "ascend" / "rank-3_20261127_ascend_pt").mkdir()  # not parsed yet: no trace_view.json
    assert find_traces(tmp_path) == {0: newest, 2: npu}


def test_no_profile_no_section(tmp_path: Path) -> None:
    assert profile_section(tmp_path, {}) == ""


def test_a_cuda_trace_counts_each_step_once_and_its_kernels_as_operators(tmp_path: Path) -> None:
    # A real window of 10 steps recorded on an H200 by the generated train.py (ResNet-18, bf16, batch 256,
    # training.compile reduce-overhead) with NPU_WIZARD_PROFILE=20:30: torch marks each step on the host and
    # again on the device's stream (gpu_user_annotation), which read as 20 steps before.
    trace = tmp_path / "rank-0.pt.trace.json"
    trace.write_bytes(gzip.decompress((Path(__file__).parent / "data" / DEVICE_TRACE).read_bytes()))

    profile = read_profile(0, trace)

    assert profile.steps == 10 and not profile.reading.capped
    assert "cudaGraphLaunch" in profile.operators  # reduce-overhead replays the step as a CUDA graph
    assert sum(profile.categories.values()) == pytest.approx(profile.step_us, rel=0.01)


def test_a_deeply_nested_element_breaks_off_the_reading_and_the_section_says_so(tmp_path: Path) -> None:
    trace = tmp_path / "profile" / "rank-0" / "rank-0.1.pt.trace.json"
    trace.parent.mkdir(parents=True)
    trace.write_text("[" + "[" * 100_000 + "]" * 100_000 + "]")
    reading = Reading()
    assert list(trace_events(trace, 1000, reading)) == []
    assert reading.broken == "an element nested too deep for the JSON decoder"
    assert "could not be read to its end: an element nested too deep" in profile_section(tmp_path, {})


def test_events_whose_pid_or_tid_is_a_list_are_left_out_and_counted(tmp_path: Path) -> None:
    events = step_events(0, 0) + [{**span("aten::odd", 0, 5), "pid": [1]}, {**span("aten::odd", 0, 5), "tid": {}}]
    write_trace(tmp_path / "profile" / "rank-0" / "rank-0.1.pt.trace.json", events)
    profile = read_profile(0, tmp_path / "profile" / "rank-0" / "rank-0.1.pt.trace.json")
    assert (profile.steps, profile.odd_threads) == (1, 2)
    assert "aten::odd" not in profile.operators
    assert "2 events left out: their pid or tid is no number or string" in profile_section(tmp_path, {})


def test_elements_that_are_no_events_and_stray_commas_count_against_the_cap(tmp_path: Path) -> None:
    trace = tmp_path / "profile" / "rank-0" / "rank-0.1.pt.trace.json"
    trace.parent.mkdir(parents=True)
    trace.write_text("[" + "0," * 5_000 + ",,," * 5_000 + "]")
    reading = Reading()
    assert list(trace_events(trace, 1000, reading)) == []
    assert (reading.elements, reading.events, reading.capped) == (1000, 0, True)
    trace.write_text("[" + ",," * 5_000 + "]")  # commas alone: each is an element left out
    reading = Reading()
    assert list(trace_events(trace, 1000, reading)) == []
    assert (reading.elements, reading.capped) == (1000, True)
    html = profile_section(tmp_path, {}, cap=1000)
    assert "capped: only the first 1,000 events of the trace were read (0 of them events)" in html


def test_keys_skipped_before_the_events_count_against_the_cap(tmp_path: Path) -> None:
    trace = tmp_path / "t.json"
    trace.write_text("{" + ",".join(f'"k{n}": 0' for n in range(5_000)) + ', "traceEvents": []}')
    reading = Reading()
    assert list(trace_events(trace, 1000, reading)) == []
    assert reading.broken == "more than 1,000 keys before traceEvents"


def test_a_fifo_in_place_of_a_trace_does_not_block_the_report(tmp_path: Path) -> None:
    (tmp_path / "events").mkdir()
    trace = tmp_path / "profile" / "rank-0" / "rank-0.1.pt.trace.json"
    trace.parent.mkdir(parents=True)
    os.mkfifo(trace)
    done = subprocess.run(
        [sys.executable, "-m", "wizard", "report", str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    html = (tmp_path / "report.html").read_text()
    assert f"could not be read to its end: {trace} is a FIFO, not a regular file" in html


def test_a_link_in_place_of_a_trace_is_not_followed(tmp_path: Path) -> None:
    private = write_trace(tmp_path / "private.json", step_events(0, 0))
    trace = tmp_path / "profile" / "rank-0" / "rank-0.1.pt.trace.json"
    trace.parent.mkdir(parents=True)
    trace.symlink_to(private)
    profile = read_profile(0, trace)
    assert profile.steps == 0
    assert profile.reading.broken == f"{trace} is a symbolic link, not a regular file: " + (
        "npu-wizard reads only regular files in a run folder (move it away)"
    )


def test_a_median_ranks_long_wait_leads_the_differences_over_small_excesses_of_the_straggler(tmp_path: Path) -> None:
    """The median rank waits 40 ms a step in all_reduce for the straggler: the largest difference, either way."""
    folder = tmp_path / "profile"
    small = [span(f"aten::op_{n}", 1_000 + n * 200, 100) for n in range(12)]  # the straggler's 0.1 ms excesses
    slow = [span("ProfilerStep#0", 0, 50_000, cat="user_annotation"), *small]
    median = [span("ProfilerStep#0", 0, 50_000, cat="user_annotation"), span("c10d::allreduce_", 5_000, 40_000)]
    write_trace(folder / "rank-3" / "rank-3.5.pt.trace.json", slow)
    write_trace(folder / "rank-1" / "rank-1.5.pt.trace.json", median)
    summary = {"profile": {"asked": [{"straggler": 3, "median": 1, "steps": 1, "at": 1.0}], "windows": []}}
    html = profile_section(tmp_path, summary)
    comparison = html[html.index("Straggler rank 3 beside median rank 1") :]
    first_row = comparison[comparison.index("<th>difference</th></tr>") :]
    assert first_row.startswith("<th>difference</th></tr><tr><td>c10d::allreduce_</td><td>0.00</td><td>40.00</td>")


NPU_TRACE = Path(__file__).parent / "data" / "torch_npu_trace_view.json"


def test_torch_npus_trace_view_with_times_as_strings_is_read(tmp_path: Path) -> None:
    """torch_npu writes ts and dur as strings ("1700000000123.456"): two 10 ms steps, a collective on the device."""
    trace = tmp_path / "profile" / "ascend" / "rank-0_1_20261127_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    trace.mkdir(parents=True)
    (trace / "trace_view.json").write_bytes(NPU_TRACE.read_bytes())

    profile = read_profile(0, trace / "trace_view.json")

    assert (profile.steps, profile.per_step_ms(profile.step_us)) == (2, pytest.approx(10.0))
    per_step = {name: profile.per_step_ms(us) for name, us in profile.categories.items()}
    assert per_step == pytest.approx({"compute": 3.0, "communication": 5.2, "idle": 1.8})
    assert profile.top(3) == [("hcom_allReduce__123_0_1", 5.0, 2), ("aten::mm", 3.0, 2), ("HcclAllreduce", 1.5, 2)]
    assert profile.odd_times == 0


@pytest.mark.parametrize("ts", ["nan", "inf", "-Infinity", "1e400", "twelve", "", "0x10", "1_000", True, None, [1]])
def test_times_that_are_no_finite_number_are_left_out_and_counted(tmp_path: Path, ts: object) -> None:
    events = [{**span("ProfilerStep#0", 0, 10_000), "ts": "0.5", "dur": "10000"}, {**span("aten::odd", 1, 5), "ts": ts}]
    write_trace(tmp_path / "profile" / "rank-0" / "rank-0.1.pt.trace.json", events)
    profile = read_profile(0, tmp_path / "profile" / "rank-0" / "rank-0.1.pt.trace.json")
    assert (profile.steps, profile.odd_times) == (1, 1)
    assert "aten::odd" not in profile.operators
    assert "1 events left out: their ts or dur is no finite number" in profile_section(tmp_path, {})


def test_the_newest_npu_trace_is_chosen_by_its_stamp_not_its_name(tmp_path: Path) -> None:
    """From the 7.0.0 branches the folder is <worker>_<pid>_<stamp>_ascend_pt: after a restart pid 999 sorts last."""
    ascend = tmp_path / "profile" / "ascend"
    older = write_trace(
        ascend / "rank-0_999_20261127100000123_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "trace_view.json", []
    )
    newer = write_trace(
        ascend / "rank-0_12345_20261127110000456_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "trace_view.json", []
    )
    six = write_trace(ascend / "rank-1_20261127110000456_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "trace_view.json", [])
    write_trace(ascend / "rank-1_20261127100000123_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "trace_view.json", [])
    os.utime(older, (2e9, 2e9))  # the stamp counts, not when the file was last written (parsed later, copied)
    assert find_traces(tmp_path) == {0: newer, 1: six}


def test_an_npu_trace_folder_without_a_stamp_is_ordered_by_its_time(tmp_path: Path) -> None:
    ascend = tmp_path / "profile" / "ascend"
    old = write_trace(ascend / "rank-0_b_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "trace_view.json", [])
    new = write_trace(ascend / "rank-0_a_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "trace_view.json", [])
    os.utime(old, (1e9, 1e9))
    os.utime(new, (2e9, 2e9))
    assert find_traces(tmp_path) == {0: new}


def test_each_straggler_ask_compares_the_traces_of_that_ask(tmp_path: Path) -> None:
    """Rank 1 was the median of two asks: the first ask's comparison reads rank 1's first trace, not its newest."""
    folder = tmp_path / "profile"
    steady = [e for s in range(4) for e in step_events(s, s * 20_000)]
    slowed = [e for s in range(4) for e in step_events(s, s * 20_000, slow_ms=6.0)]
    write_trace(folder / "rank-1" / "rank-1.5.pt.trace.json", steady)
    write_trace(folder / "rank-3" / "rank-3.5.pt.trace.json", slowed)
    write_trace(folder / "rank-1" / "rank-1.9.pt.trace.json", slowed)  # later, rank 1 slowed down too
    write_trace(folder / "rank-5" / "rank-5.9.pt.trace.json", steady)
    asked = [{"straggler": 3, "median": 1, "steps": 4, "at": 1.0}, {"straggler": 5, "median": 1, "steps": 4, "at": 2.0}]
    html = profile_section(tmp_path, {"profile": {"asked": asked, "windows": []}})
    first = html[html.index("Straggler rank 3 beside median rank 1") : html.index("Straggler rank 5")]
    rows = first[first.index("<th>difference</th></tr>") :]
    assert rows.startswith("<th>difference</th></tr><tr><td>test_slow_op</td><td>6.00</td><td>0.00</td>"), rows[:200]
    assert "rank-1.5.pt.trace.json" in first and "rank-1.9.pt.trace.json" not in first


def test_an_element_over_a_mib_breaks_off_the_reading(tmp_path: Path) -> None:
    trace = write_trace(
        tmp_path / "t.json", [span("aten::mm", 0, 1), span("x" * (3 << 20), 1, 1), span("aten::add", 2, 1)]
    )
    reading = Reading()
    names = [event["name"] for event in trace_events(trace, 100, reading)]
    assert names == ["aten::mm"]
    assert reading.broken == "an element longer than 1 MiB"


@pytest.mark.usefixtures("python_gc_defaults")  # a tracemalloc peak of this process
def test_long_and_endless_distinct_operator_names_are_bounded(tmp_path: Path) -> None:
    """A crafted trace: thousands of distinct operators with 20,000-character names, in one step."""
    count = 3_000
    events = [span("ProfilerStep#1", 0, 10 * count, cat="user_annotation")]
    events += [span(f"{index:06d}" + "y" * 20_000, index * 10.0, 5.0) for index in range(count)]
    trace = write_trace(tmp_path / "t.json", events)
    tracemalloc.start()
    try:
        profile = read_profile(0, trace)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(profile.operators) <= 1_001
    assert all(len(name) <= 201 for name in profile.operators)
    assert "(other operators)" in profile.operators
    assert peak < 16e6  # not the 60 MB of names


def test_the_section_says_how_many_events_were_folded_into_other_operators(tmp_path: Path) -> None:
    events = [span("ProfilerStep#1", 0, 20_000, cat="user_annotation")]
    events += [span(f"op_{index}", index * 10.0, 5.0) for index in range(1_005)]
    write_trace(tmp_path / "profile" / "rank-0" / "rank-0.1.pt.trace.json", events)
    html = profile_section(tmp_path, {})
    assert "5 events of operators past the first 1,000 names are counted as (other operators)" in html
