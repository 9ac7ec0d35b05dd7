"""The verdict at a hang on hand-made recorder dumps: ties between groups, and subgroups' collectives.

Each rank's record is made the way a rank makes it (runtime/stacks.read_dump on a dump in the shape of torch's
flight recorder), then judged; no process runs.
"""

from __future__ import annotations

from typing import Any

from runtime import stacks
from wizard.monitor.hang_verdict import judge

LOAD = {"file": "/job/train.py", "line": 118, "function": "load_batch", "code": "batch = next(loader)"}
REDUCE = {"file": "/job/train.py", "line": 201, "function": "train", "code": "dist.all_reduce(batch)"}


def dump_entry(seq: int, *, group: str = "0", done: bool = True, op: str = "all_reduce") -> dict[str, Any]:
    """One entry of torch's flight recorder (gloo: retired once done)."""
    return {
        "collective_seq_id": seq,
        "pg_id": group,
        "profiling_name": f"gloo:{op}",
        "input_sizes": [[1000]],
        "input_dtypes": ["Float"],
        "state": "scheduled",
        "retired": done,
    }


def record(entries: list[dict[str, Any]], frame: dict[str, Any]) -> dict[str, Any]:
    """A rank's answer at a hang: its main thread at `frame`, its collectives read from `entries`."""
    return {
        "answered": True,
        "threads": [{"main": True, "frames": [frame]}],
        "collectives": stacks.read_dump({"entries": entries}, backend="gloo"),
    }


def stuck_outside(last: int) -> dict[str, Any]:
    """A rank in its data loading whose collectives up to #`last` completed."""
    return record([dump_entry(seq) for seq in range(1, last + 1)], LOAD)


def waiting_in(seq: int) -> dict[str, Any]:
    """A rank waiting in all_reduce #`seq`, every collective before it completed."""
    return record([*(dump_entry(s) for s in range(1, seq)), dump_entry(seq, done=False)], REDUCE)


def test_in_a_two_rank_job_rank_0_stuck_outside_is_the_one_that_never_entered() -> None:
    said = judge({0: stuck_outside(439), 1: waiting_in(440)})
    assert said.text == (
        "hang: rank 1 waits in all_reduce #440 (gloo, 4.0 KB float32) called from train.py:201 "
        "(dist.all_reduce(batch)); rank 0 never entered #440: its last collective is #439 and it is at "
        "train.py:118 in load_batch"
    )
    assert [(g.ranks, g.kind) for g in said.groups] == [([1], "waiting"), ([0], "never_entered")]
    assert said.odd_ones_out == [0]


def test_of_two_equal_nodes_the_one_that_never_entered_is_the_odd_one_out() -> None:
    said = judge({**{r: stuck_outside(439) for r in range(4)}, **{r: waiting_in(440) for r in range(4, 8)}})
    assert [(g.ranks, g.kind) for g in said.groups] == [([4, 5, 6, 7], "waiting"), ([0, 1, 2, 3], "never_entered")]
    assert said.odd_ones_out == [0, 1, 2, 3]


def test_ranks_below_the_newest_collective_never_entered_it_however_many_they_are() -> None:
    said = judge({0: stuck_outside(439), 1: stuck_outside(439), 2: stuck_outside(439), 3: waiting_in(440)})
    assert said.text.endswith(
        "; ranks 0-2 never entered #440: their last collective is #439 and they are at train.py:118 in load_batch"
    )
    assert said.groups[0].ranks == [3] and said.odd_ones_out == [0, 1, 2]


def subgroup_chatter(count: int) -> list[dict[str, Any]]:
    """`count` completed collectives of a subgroup, after the default group's."""
    return [dump_entry(seq, group="1", op="broadcast") for seq in range(1, count + 1)]


def test_a_subgroup_s_collectives_leave_the_default_group_s_newest_in_the_record() -> None:
    entries = [*(dump_entry(s) for s in range(1, 440)), dump_entry(440, done=False), *subgroup_chatter(100)]
    kept = stacks.read_dump({"entries": entries}, backend="gloo")
    default = [(e["seq"], e["state"]) for e in kept["entries"] if e["group"] == "0"]
    assert default[-1] == (440, "scheduled") and len(kept["entries"]) <= stacks.MAX_COLLECTIVES
    assert any(e["group"] == "1" for e in kept["entries"])
    assert (kept["last_entered"], kept["last_completed"]) == (440, 439)


def test_ranks_waiting_in_the_default_group_are_not_said_to_have_completed_it_after_subgroup_chatter() -> None:
    entries = [*(dump_entry(s) for s in range(1, 440)), dump_entry(440, done=False), *subgroup_chatter(100)]
    said = judge({0: record(entries, REDUCE), 1: record(entries, REDUCE)})
    assert said.text.startswith("hang: ranks 0-1 wait in all_reduce #440 (gloo, 4.0 KB float32)"), said.text


def test_an_outside_rank_is_said_to_have_completed_only_the_collective_it_completed() -> None:
    """A record whose entries lack the default group's newest (an older runtime's): not called completed."""
    raw = record([dump_entry(s, group="1", op="broadcast") for s in range(1, 33)], LOAD)
    raw["collectives"].update(last_entered=440, last_completed=439)
    said = judge({0: raw, 1: raw})
    assert "#440, completed" not in said.text
    assert said.text.endswith("(their last collective entered is #440, the last completed #439)"), said.text


def not_yet_retired(last: int) -> dict[str, Any]:
    """A rank back in its data loading whose recorder has not yet marked #`last` done (gloo retires an entry a
    moment after the call returns: a hang collected in that moment finds it so)."""
    return record([*(dump_entry(s) for s in range(1, last)), dump_entry(last, done=False)], LOAD)


def test_a_collective_another_rank_saw_complete_is_no_collective_this_rank_waits_in() -> None:
    said = judge({0: stuck_outside(3), 1: not_yet_retired(3)})
    assert said.text == (
        "hang: no rank is in a collective: ranks 0-1 are at train.py:118 in load_batch "
        "(their last collective, #3, completed)"
    )
    assert said.odd_ones_out == []


def test_a_collective_no_rank_saw_complete_is_still_one_they_wait_in() -> None:
    said = judge({0: waiting_in(3), 1: waiting_in(3)})
    assert [(g.ranks, g.kind) for g in said.groups] == [([0, 1], "waiting")]
