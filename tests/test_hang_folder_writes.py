"""What the runner writes into RUN/hang/ (wizard/run/hang_stacks.py): bounded records that stay JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from wizard.monitor.hang_records import read_hang_folder
from wizard.run.hang_record_size import MAX_RECORD_BYTES
from wizard.run.hang_stacks import write_rank

FRAME = {"file": "/job/train.py", "line": 201, "function": "train", "code": "dist.all_reduce(batch)"}


def answer(*, threads: int = 1, frames: list[dict[str, Any]] | None = None, shapes: int = 1) -> dict[str, Any]:
    """A rank's answer: a main thread at FRAME (or at `frames`), `threads` threads in all, 32 collectives of
    `shapes` tensors each, the newest pending."""
    main = {"name": "MainThread", "main": True, "frames": frames or [FRAME]}
    others = [{"name": f"worker-{n}", "main": False, "frames": [FRAME] * 48} for n in range(threads - 1)]
    entries = [
        {
            "seq": seq,
            "op": "all_reduce",
            "group": "0",
            "sizes": [[1000, 1000]] * shapes,
            "dtypes": ["Float"] * shapes,
            "bytes": 4_000_000 * shapes,
            "state": "scheduled" if seq == 440 else "completed",
        }
        for seq in range(409, 441)
    ]
    collectives = {"source": "torch", "backend": "gloo", "entries": entries, "last_entered": 440, "last_completed": 439}
    return {"rank": 3, "answered": True, "pid": 4242, "time": 1.0, "host": "h1", "threads": [main, *others],
            "collectives": collectives}  # fmt: skip


def test_a_rank_record_is_written_as_compact_json(tmp_path: Path) -> None:
    write_rank(tmp_path, 3, answer())
    text = (tmp_path / "rank-3.json").read_text()
    assert text.count("\n") == 1 and json.loads(text) == answer()


@pytest.mark.parametrize(
    "big",
    [
        {"threads": 32, "shapes": 30_000},  # a coalesced collective of many tensors, on many threads
        {"frames": [{**FRAME, "file": "/job/" + "x" * 200_000 + ".py"}] * 48},  # the main thread alone
    ],
    ids=["collectives", "main thread"],
)
def test_a_record_over_its_bound_stays_json_and_its_rank_answered(tmp_path: Path, big: dict[str, Any]) -> None:
    (tmp_path / "hang").mkdir()
    write_rank(tmp_path / "hang", 3, answer(**big))
    data = (tmp_path / "hang" / "rank-3.json").read_bytes()
    assert len(data) <= MAX_RECORD_BYTES + 1
    written = json.loads(data)
    assert written["truncated"] and all(isinstance(what, str) for what in written["truncated"])
    found = read_hang_folder(tmp_path)
    assert found is not None and found.problems == []
    record = found.records[3]
    assert record.answered and record.host == "h1" and (record.last_entered, record.last_completed) == (440, 439)
    if "shapes" in big:  # only the shapes and the other threads had to go
        assert [frame.line for frame in record.main] == [201] and record.entries[-1].seq == 440
