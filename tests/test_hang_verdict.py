"""The verdict at a hang (wizard/monitor/hang_verdict.py), judged on records real gloo ranks answered with.

Three small jobs (tests/hang_ranks.py, four or five ranks each) put their ranks where a hang leaves them: a
rank late for the collective the others wait in, and one SIGSTOPped; a barrier and a larger all_reduce where
the others all_reduce; ranks in a data-loading line, ranks without a flight recorder and one holding the GIL
(tests/conftest.py's session fixtures, shared with test_hang_report.py). Each test judges the records of the
ranks its situation needs.
Hand-written records only for the torn and hostile files.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from tests.hang_ranks import line_of
from wizard.monitor.hang_records import HangFolder, read_hang_folder
from wizard.monitor.hang_verdict import HangVerdict, hang_summary, human_bytes, judge, ranks_text

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("interrupted-2x2-run")]

REDUCE = line_of("# hang: the collective the others wait in")
LOAD = line_of("# hang: the data-loading line")
BARRIER = line_of("# hang: a barrier where the others all_reduce")
BIG = line_of("# hang: twice the others' size")
GIL = line_of("# hang: a regular expression that backtracks for ever, holding the GIL")


def verdict(found: HangFolder, *ranks: int) -> HangVerdict:
    """The verdict on the records of `ranks`."""
    return judge({rank: found.records[rank] for rank in ranks}, found.time)


def clock(found: HangFolder) -> str:
    assert found.time is not None
    return time.strftime("%H:%M:%S", time.gmtime(found.time))


def test_a_rank_that_never_entered_the_collective_is_named_with_its_last_collective_and_its_line(
    late_and_stopped: HangFolder,
) -> None:
    said = verdict(late_and_stopped, 0, 1, 2)
    assert said.text == (
        f"hang at {clock(late_and_stopped)} UTC: ranks 0-1 wait in all_reduce #4 (gloo, 4.0 KB float32) called "
        f"from train.py:{REDUCE} (dist.all_reduce(batch)); rank 2 never entered #4: its last collective is #3 "
        f"and it is at train.py:{LOAD} in load_batch"
    )
    waiting, late = said.groups
    assert (waiting.ranks, waiting.kind, waiting.collective.seq) == ([0, 1], "waiting", 4)
    assert waiting.collective.op == "all_reduce"
    assert (late.ranks, late.kind, late.last_collective, late.place.function) == ([2], "never_entered", 3, "load_batch")
    assert said.odd_ones_out == [2] and said.did_not_answer == [] and said.recorder == "all"


def test_a_rank_that_did_not_answer_is_named_with_its_process_state(late_and_stopped: HangFolder) -> None:
    said = verdict(late_and_stopped, 0, 1, 2, 3)
    stopped = late_and_stopped.records[3]
    assert stopped.pid and stopped.state == "T (stopped)"
    assert said.text.endswith(
        f"; rank 3 did not answer (pid {stopped.pid} on {stopped.host}, state T (stopped)): no answer within 5s"
    )
    assert said.did_not_answer == [3] and said.odd_ones_out == [2, 3]
    assert said.groups[-1].kind == "did_not_answer" and said.groups[-1].state == "T (stopped)"


def test_a_rank_holding_the_gil_is_named_where_its_faulthandler_dump_has_it(loading: HangFolder) -> None:
    stuck = loading.records[4]
    assert not stuck.answered and stuck.faulthandler and stuck.state == "R (running)"
    said = verdict(loading, 0, 1, 4)
    assert said.text.endswith(
        f"; rank 4 did not answer (pid {stuck.pid} on {stuck.host}, state R (running)): no answer within 5s; "
        f"its faulthandler dump has it at train.py:{GIL} in load_batch"
    )
    assert said.did_not_answer == [4] and said.groups[-1].place.line == GIL


def test_a_barrier_where_the_others_all_reduce_is_named_with_both_operations(mismatched: HangFolder) -> None:
    said = verdict(mismatched, 0, 1, 2)
    assert said.text == (
        f"hang at {clock(mismatched)} UTC: ranks 0-1 wait in all_reduce #4 (gloo, 4.0 KB float32) called from "
        f"train.py:{REDUCE} (dist.all_reduce(batch)); rank 2 waits in barrier #4 (gloo) called from "
        f"train.py:{BARRIER} (dist.barrier()), not in all_reduce: the collectives differ at #4"
    )
    assert [g.kind for g in said.groups] == ["waiting", "differs"] and said.odd_ones_out == [2]


def test_the_same_collective_with_other_sizes_is_named_with_both_sizes(mismatched: HangFolder) -> None:
    said = verdict(mismatched, 0, 1, 3)
    assert said.text.endswith(
        f"; rank 3 waits in all_reduce #4 with 8.0 KB float32, not 4.0 KB float32, called from "
        f"train.py:{BIG} (dist.all_reduce(torch.ones(2000))): the collectives differ at #4"
    )
    assert said.groups[1].collective.sizes == [[2000]] and said.groups[0].collective.sizes == [[1000]]
    everyone = verdict(mismatched, 0, 1, 2, 3)
    assert [g.ranks for g in everyone.groups] == [[0, 1], [2], [3]] and everyone.odd_ones_out == [2, 3]


def test_every_rank_in_the_same_data_loading_line_is_said_to_be_outside_any_collective(loading: HangFolder) -> None:
    said = verdict(loading, 0, 1)
    assert said.text == (
        f"hang at {clock(loading)} UTC: no rank is in a collective: ranks 0-1 are at train.py:{LOAD} in load_batch "
        "(their last collective, #3, completed)"
    )
    assert said.groups[0].kind == "outside" and said.odd_ones_out == []


def test_without_a_recorder_the_stacks_alone_are_judged_and_the_verdict_says_so(loading: HangFolder) -> None:
    said = verdict(loading, 2, 3)
    assert said.text == (
        f"hang at {clock(loading)} UTC: ranks 2-3 wait in all_reduce called from train.py:{REDUCE} "
        "(dist.all_reduce(batch)) (no collective recorder: TORCH_FR_BUFFER_SIZE is 0 or unset; "
        "judged from the stacks alone)"
    )
    assert said.recorder == "none" and said.groups[0].collective.seq is None
    mixed = verdict(loading, 0, 1, 2, 3)
    assert mixed.recorder == "some" and "no collective recorder on ranks 2-3:" in mixed.text


def test_the_records_as_json_gives_them_are_judged_the_same(late_and_stopped: HangFolder) -> None:
    raw = {rank: json.loads((late_and_stopped.folder / f"rank-{rank}.json").read_text()) for rank in range(4)}
    assert judge(raw, late_and_stopped.time).text == verdict(late_and_stopped, 0, 1, 2, 3).text


def test_stacks_asked_for_are_not_called_a_hang(late_and_stopped: HangFolder, tmp_path: Path) -> None:
    shutil.copytree(late_and_stopped.folder, tmp_path / "hang")
    (tmp_path / "hang" / "collected.json").write_text(json.dumps({"time": late_and_stopped.time, "reason": "asked"}))
    summary = hang_summary(tmp_path)
    assert summary is not None and summary["reason"] == "asked"
    assert summary["text"] == f"stacks asked{verdict(late_and_stopped, 0, 1, 2, 3).text.removeprefix('hang')}"


def test_ranks_are_written_as_ranges_and_sizes_in_decimal_units() -> None:
    assert ranks_text([7, 0, 1, 2, 4, 5, 6]) == "ranks 0-2, 4-7"
    assert ranks_text([3]) == "rank 3"
    assert [human_bytes(n) for n in (12, 4000, 4_000_000, 25 * 10**12)] == ["12 B", "4.0 KB", "4.0 MB", "25.0 TB"]


# ---- torn and hostile files (hand-written: no rank writes these) ---------------------------------------------


def test_torn_and_hostile_records_are_one_line_each_and_their_ranks_named(tmp_path: Path) -> None:
    hang = tmp_path / "hang"
    hang.mkdir()
    (hang / "rank-0.json").write_text('{"rank": 0, "answered": true, "threads": [{"main": true, "fra')
    os.mkfifo(hang / "rank-1.json")
    (hang / "rank-2.json").mkdir()
    (hang / "rank-3.json").symlink_to("/dev/zero")
    wrong_kinds = {
        "answered": True,
        "threads": [{"main": True, "frames": [{"file": 3, "line": "x"}, "frame", {"file": "/a/t.py", "line": 9}]}],
        "collectives": {"source": "torch", "entries": [{"seq": "4"}, {"seq": 4, "sizes": "big", "dtypes": [1]}]},
        "time": "noon",
        "pid": 1e300,
    }
    (hang / "rank-4.json").write_text(json.dumps(wrong_kinds))
    (hang / "rank-5.json").write_text("[1, 2]")
    (hang / "collected.json").write_text('{"time": "yesterday"')
    found = read_hang_folder(tmp_path)
    assert found is not None
    assert len(found.problems) == 5 and all("\n" not in line for line in found.problems)
    assert "rank-1.json is a FIFO" in found.problems[1] and "a symbolic link" in found.problems[3]
    said = judge(found.records, found.time)
    assert said.did_not_answer == [0, 1, 2, 3, 5]
    assert "rank 0 did not answer: its record hang/rank-0.json could not be read" in said.text
    assert said.text.startswith("hang: rank 4 waits in ? #4 called from t.py:9 in ?")
    summary = hang_summary(tmp_path)
    assert summary is not None and summary["problems"] == found.problems
    json.dumps(summary)  # summary.json takes it as it is
