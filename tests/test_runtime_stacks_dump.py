"""The flight recorder's dump that a rank hands over stays JSON when it is bounded."""

from __future__ import annotations

import json

from runtime import stacks


def test_a_dump_over_the_bound_keeps_its_newest_entries_as_json() -> None:
    entries = [
        {"collective_seq_id": seq, "profiling_name": "gloo:all_reduce", "frames": "f" * 500} for seq in range(5000)
    ]
    dump = {"version": "2.10", "pg_status": {"0": {}}, "entries": entries}

    text = stacks.bounded_dump(dump, json.dumps(dump))

    assert len(text.encode()) <= stacks.MAX_DUMP_BYTES
    kept = json.loads(text)  # cutting the text would have left no JSON
    seqs = [entry["collective_seq_id"] for entry in kept["entries"]]
    assert seqs[-1] == 4999 and seqs == list(range(seqs[0], 5000)) and len(seqs) > 500
    assert kept["npu_wizard_oldest_entries_left_out"] is True


def test_a_dump_within_the_bound_is_handed_over_as_it_came() -> None:
    dump = {"version": "2.10", "entries": [{"collective_seq_id": 1}]}
    text = json.dumps(dump)
    assert stacks.bounded_dump(dump, text) == text
