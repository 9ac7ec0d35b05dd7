"""The straggler detector on synthetic windows: the threshold, the run of windows, rank against node.

Ranks 0-1 are on node 0 and ranks 2-3 on node 1 unless a test says otherwise;
every window is 10 steps of 1.0 s compute on a normal rank (0.2 s data, 0.8 s forward).
Synthetic ranks do not jitter, so most detectors here judge from their first
window on (learn=1) instead of learning the job's jitter first.
"""

from __future__ import annotations

import pytest

from wizard.monitor.state import JobState
from wizard.monitor.stragglers import StragglerDetector, describe
from wizard.monitor.summary_text import format_summary, straggler_line, summarize

STEPS = 10
STEP_S = 1.0


def detector(ranks_per_node: int = 2, learn: int = 1) -> StragglerDetector:
    """A detector for nodes of `ranks_per_node` ranks each, judging once it has seen `learn` windows."""
    return StragglerDetector(lambda rank: rank // ranks_per_node, learn=learn)


def feed(found: StragglerDetector, windows: int, slower: dict[int, float], *, world: int = 4, first: int = 1) -> None:
    """`windows` windows from every rank; rank R's forward is `slower[R]` times longer (default 1)."""
    if first == 1:  # each rank's first window after its start is its warm-up: never judged
        for rank in range(world):
            found.rank_started(rank)
            found.add(rank, {"step": 0, "time": 1000.0, "data_s": 9.0, "forward_s": 9.0 * (rank + 1)})
    for window in range(first, first + windows):
        step = window * STEPS
        for rank in range(world):
            forward = 0.8 * STEP_S * slower.get(rank, 1.0)
            event = {"event": "step", "step": step, "time": 1000.0 + step * 1.5, "data_s": 0.2, "forward_s": forward}
            found.add(rank, event)


def forward_factor(compute_gap: float) -> float:
    """The forward factor that makes a rank's compute (0.2 + 0.8 f) `compute_gap` above 1.0."""
    return (1.0 + compute_gap - 0.2) / 0.8


def test_a_rank_16_percent_slower_is_flagged_and_14_percent_is_not() -> None:
    above, below = detector(), detector()
    feed(above, 5, {3: forward_factor(0.16)})
    feed(below, 5, {3: forward_factor(0.14)})
    assert [(f.rank, f.node, f.phase) for f in above.findings] == [(3, 1, "forward")]
    assert round(above.findings[0].gap_pct) == 16
    assert below.findings == []


def test_two_slow_windows_raise_no_flag_and_three_do() -> None:
    two, three = detector(), detector()
    feed(two, 1, {})
    feed(two, 2, {1: 1.5}, first=2)
    feed(two, 3, {}, first=4)
    feed(three, 1, {})
    feed(three, 3, {1: 1.5}, first=2)
    assert two.findings == []
    assert [(f.rank, f.node) for f in three.findings] == [(1, 0)]
    assert three.fresh()[0][0] == "start"


def test_slow_windows_must_come_in_a_row() -> None:
    found = detector()
    for window in range(1, 9):
        feed(found, 1, {2: 1.5} if window % 3 else {}, first=window)  # two slow, one normal, ...
    assert found.findings == []


def test_a_whole_slow_node_is_named_as_the_node_not_its_ranks() -> None:
    found = detector()
    feed(found, 4, {2: 1.4, 3: 1.5})
    assert [(f.rank, f.node) for f in found.findings] == [(None, 1)]
    assert "node 1 was" in describe(found.as_dicts(wall_s=100.0)[0])


def test_one_slow_rank_on_a_node_is_the_rank() -> None:
    found = detector()
    feed(found, 4, {2: 1.5})
    assert [(f.rank, f.node) for f in found.findings] == [(2, 1)]


def test_a_slow_loader_is_named_as_data() -> None:
    found = detector()
    for rank in range(4):
        found.rank_started(rank)
    for window in range(1, 20):  # 1 s apart: 18 s of them judged, past the 15 s a straggler must last
        for rank in range(4):
            data = 0.5 if rank == 0 else 0.2
            found.add(rank, {"step": window * STEPS, "time": 1000.0 + window, "data_s": data, "forward_s": 0.8})
    assert [(f.rank, f.phase) for f in found.findings] == [(0, "data")]


def test_the_flag_ends_after_three_normal_windows_at_the_end_of_the_last_slow_one() -> None:
    found = detector()
    feed(found, 4, {1: 1.5})
    feed(found, 2, {}, first=5)
    assert found.active()
    feed(found, 1, {}, first=7)
    assert not found.active()
    (flag,) = found.findings
    assert flag.end == 1000.0 + 4 * STEPS * 1.5  # window 4 ended at step 40
    assert [kind for kind, _ in found.fresh()] == ["start", "end"]


def test_lost_is_the_share_of_each_slow_window_a_slower_forward_stands_for() -> None:
    found = detector()
    feed(found, 1, {})
    # forward 0.8 -> 1.2 s, 50% slower: the rest of its step is taken as 50% slower too, so of each
    # 15 s window the job waited 15 x 0.5 / 1.5 = 5 s; 4 windows: 20 s of 160
    feed(found, 4, {3: 1.5}, first=2)
    (entry,) = found.as_dicts(wall_s=160.0)
    assert entry["lost_pct"] == 12.5
    assert entry["gap_pct"] == 40.0
    assert entry["end"] is None
    assert describe(entry, until=entry["start"] + 240) == (
        "rank 3 (node 1) was 40% slower in forward for 4m00s (still slow at the end): the job lost about 12%"
    )


def test_a_node_38_percent_slower_for_the_whole_job_costs_it_27_percent() -> None:
    found = detector()
    feed(found, 1, {})
    feed(found, 8, {2: 1.38, 3: 1.38}, first=2)  # node 1's forward 38% slower from window 2 to the end
    (entry,) = found.as_dicts(wall_s=8 * 15.0)  # the job: the 8 windows of 15 s
    assert (entry["rank"], entry["node"]) == (None, 1)
    assert entry["lost_pct"] == pytest.approx(100 * 0.38 / 1.38, abs=0.1)  # 27.5
    assert "the job lost about 28%" in describe(entry)


def test_a_slow_loader_costs_what_the_other_ranks_waited_for_it() -> None:
    found = detector()
    for rank in range(4):
        found.rank_started(rank)
    for window in range(0, 6):
        for rank in range(4):
            data = 0.5 if rank == 0 and window >= 2 else 0.2  # 0.3 s more per step, forward as fast as the others
            found.add(rank, {"step": window * STEPS, "time": 1000.0 + 15 * window, "data_s": data, "forward_s": 0.8})
    (entry,) = found.as_dicts(wall_s=100.0)
    assert (entry["rank"], entry["phase"]) == (0, "data")
    assert entry["lost_pct"] == 12.0  # 0.3 s x 10 steps x 4 windows


def test_a_window_waits_for_every_rank_and_not_for_one_that_ended() -> None:
    found = detector()
    found.rank_started(3)
    feed(found, 4, {0: 1.5}, world=3)  # rank 3 started but logged no step yet: every window waits for it
    assert found.findings == []
    found.rank_ended(3)
    assert [(f.rank, f.node) for f in found.findings] == [(0, 0)]


def test_step_events_without_the_times_are_ignored_and_waited_for_by_no_window() -> None:
    found = detector()
    found.rank_started(4)
    for window in range(1, 6):
        found.add(4, {"step": window * STEPS, "time": 1000.0 + window, "loss": 1.0})  # timing off there
    feed(found, 5, {1: 1.5})
    assert [(f.rank, f.windows) for f in found.findings] == [(1, 5)]


def test_thousands_of_ranks_on_hundreds_of_nodes_name_the_one_slow_node() -> None:
    found = detector(ranks_per_node=8)
    slow_node = {rank: 1.3 for rank in range(8 * 77, 8 * 78)}
    feed(found, 3, slow_node, world=4096)
    assert [(f.rank, f.node) for f in found.findings] == [(None, 77)]


def test_the_summary_lists_each_straggler_with_the_contract_keys_and_says_it() -> None:
    state = JobState(4, nodes=2, clock=lambda: 2000.0)
    for rank in range(4):
        state.ingest({"event": "started", "time": 900.0, "rank": rank, "node": rank // 2, "world_size": 4})
    for window in range(1, 12):  # 1: the warm-up; 2-6: the job's jitter is learnt; node 1 slow from 7 on
        for rank in range(4):
            forward = 1.2 if rank >= 2 and window >= 7 else 0.8
            fields = {"step": window * STEPS, "epoch": 0, "loss": 1.0, "samples_per_s": 40.0, "lr": 0.1}
            state.ingest(
                {
                    "event": "step",
                    "time": 1000.0 + 15 * window,
                    "rank": rank,
                    "data_s": 0.2,
                    **fields,
                    "forward_s": forward,
                }
            )
    (flag,) = state.stragglers.fresh()
    assert flag[0] == "start" and "STRAGGLER: node 1 is 40% slower in forward" in straggler_line(*flag, 100.0)
    summary = summarize(state, started_at=1000.0, ended_at=1200.0, outcome="finished")
    (entry,) = summary["stragglers"]
    assert entry == {
        "rank": None,
        "node": 1,
        "phase": "forward",
        "start": 1090.0,
        "end": None,
        "gap_pct": 40.0,
        "lost_pct": 12.5,
    }  # forward 50% slower: 15 s x 0.5 / 1.5 = 5 s of each of 5 windows, 25 s of 200
    assert "  node 1 was 40% slower in forward for 1m50s (still slow at the end): the job lost about 12%" in (
        format_summary(summary).splitlines()
    )


def short_windows(found: StragglerDetector, slow: dict[int, float], windows: int = 130, every_s: float = 0.3) -> None:
    """`windows` windows of 10 steps, `every_s` apart, from 4 ranks; rank 3's forward `slow[W]` times longer in W."""
    for rank in range(4):
        found.rank_started(rank)
    for window in range(windows + 1):  # window 0 is each rank's warm-up
        for rank in range(4):
            forward = 0.0008 * (slow.get(window, 1.0) if rank == 3 else 1.0)  # 1 ms compute of a 30 ms step
            event = {"step": window * STEPS, "time": 1000.0 + window * every_s, "data_s": 0.0002, "forward_s": forward}
            found.add(rank, event)


def test_a_slowdown_of_a_second_or_of_ten_is_the_host_and_one_of_24_s_is_a_straggler() -> None:
    """Windows 0.3 s apart, as the CPU demo logs them: a rank put off its core for 0.9 s, or slowed by a busy
    neighbour for 10 s, is no straggler; 20% slower for 24 s is, from its first slow window."""
    burst, neighbour, lasting = detector(), detector(), detector()
    short_windows(burst, dict.fromkeys(range(20, 23), 1.5))  # 40% slower compute, three windows in a row
    short_windows(neighbour, dict.fromkeys(range(20, 53), 1.6))  # 48% slower for 33 windows, 10 s
    short_windows(lasting, dict.fromkeys(range(20, 100), 1.25))  # 20% slower compute for 80 windows, 24 s
    assert burst.findings == []
    assert neighbour.findings == []
    (flag,) = lasting.findings
    assert (flag.rank, flag.node, flag.phase) == (3, 1, "forward")
    # the middle of 5 s of windows passes 15% some windows into the slowdown; the flag reaches back to its
    # first window (which starts where window 19 ended) and counts what every window of it cost
    assert flag.start == pytest.approx(1000.0 + 19 * 0.3)
    assert flag.end == pytest.approx(1000.0 + 99 * 0.3)  # the last window slow by itself, not the middle's lag
    assert flag.gap_pct == pytest.approx(20)
    # each of the 80 windows of 0.3 s: a forward 25% slower stands for 0.3 x 0.25 / 1.25 = 0.06 s
    assert flag.lost_s == pytest.approx(80 * 0.06)


def test_a_script_counting_steps_per_epoch_is_judged_in_every_epoch() -> None:
    """Step numbers start again at 1 each epoch (enumerate(loader, start=1) in an epoch loop); rank 3's forward is
    twice as long from the second epoch on. Before, every window after the first epoch came in 'late' and was lost."""
    found = detector()
    for rank in range(4):
        found.rank_started(rank)
    clock = 1000.0
    for epoch in range(3):
        for step in range(10, 130, 10):
            clock += 1.5
            for rank in range(4):
                forward = 1.6 if rank == 3 and epoch >= 1 else 0.8
                found.add(rank, {"step": step, "time": clock, "data_s": 0.2, "forward_s": forward})
    (flag,) = found.findings
    assert (flag.rank, flag.node) == (3, 1)
    assert flag.gap_pct == pytest.approx(80)  # compute 0.2 + 1.6 against 0.2 + 0.8
    assert flag.start == pytest.approx(1000.0 + 13 * 1.5)  # the second epoch's first judged window


def test_after_a_restart_from_a_checkpoint_the_steps_run_again_are_judged() -> None:
    """Every rank restarts at step 100 (the last checkpoint) after reaching 200; rank 3 is slow from then on."""
    found = detector()
    feed(found, 20, {})  # steps 10..200, 15 s apart
    for rank in range(4):
        found.rank_started(rank, 100)
    for window in range(11, 21):  # steps 110..200 again
        for rank in range(4):
            forward = 1.2 if rank == 3 else 0.8
            found.add(rank, {"step": window * STEPS, "time": 1400.0 + 15 * window, "data_s": 0.2, "forward_s": forward})
    (flag,) = found.findings
    assert (flag.rank, flag.node) == (3, 1)
