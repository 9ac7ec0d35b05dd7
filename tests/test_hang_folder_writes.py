"""What the runner writes into RUN/hang/ (wizard/run/hang_stacks.py): bounded records that stay JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from wizard.monitor.hang_records import read_hang_folder
from wizard.monitor.safe_folder import Folder
from wizard.monitor.state import JobState
from wizard.run.attempts import keep_logs
from wizard.run.hang_record_size import MAX_RECORD_BYTES
from wizard.run.hang_stacks import Unanswered, collect, take_ask, write_rank
from wizard.run.intake import Intake

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
    with Folder.open(tmp_path) as folder:
        write_rank(folder, 3, answer())
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
    with Folder.open(tmp_path / "hang", make=True) as folder:
        write_rank(folder, 3, answer(**big))
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


# ---- a link or a file planted where the runner keeps hang/ (a run folder is anyone's to write into) ------------


def someone_elses(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """A folder of another user's files, named like the runner's, and what it holds."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    for name in ("rank-0.json", "rank-7.txt", "collected.json", "ask"):
        (theirs / name).write_text(f"their {name}\n" if name != "ask" else '{"id": "abc123"}')
    return theirs, contents(theirs)


def contents(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in folder.iterdir()}


def silent_job(run_dir: Path) -> Intake:
    """A job of two ranks that never answer (no status stream), known by their pids."""
    state = JobState(2)
    for rank in range(2):
        state.ingest({"event": "hello", "time": 1.0, "rank": rank, "pid": 4000 + rank, "host": "h1"})
    return Intake(state, run_dir)


def not_probed(rank: int, host: str | None, pid: int) -> Unanswered:
    return Unanswered(note="not probed here")


def test_a_hang_link_is_refused_and_nothing_is_removed_or_written_in_its_target(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    theirs, before = someone_elses(tmp_path)
    (run_dir / "hang").symlink_to(theirs)
    with pytest.raises(OSError, match="hang is a symbolic link, not a folder"):
        collect(run_dir, silent_job(run_dir), range(2), "hang", not_probed, wait_s=0)
    assert contents(theirs) == before


def test_a_file_in_place_of_hang_is_refused_and_left_as_it_is(tmp_path: Path) -> None:
    (tmp_path / "hang").write_text("a user's notes\n")
    with pytest.raises(OSError, match="hang is no folder"):
        collect(tmp_path, silent_job(tmp_path), range(2), "hang", not_probed, wait_s=0)
    assert (tmp_path / "hang").read_text() == "a user's notes\n"


def test_the_runner_takes_no_ask_through_a_hang_link(tmp_path: Path) -> None:
    theirs, before = someone_elses(tmp_path)
    (tmp_path / "hang").symlink_to(theirs)
    assert take_ask(tmp_path) is None
    assert contents(theirs) == before


def test_an_attempts_files_are_never_moved_through_a_link(tmp_path: Path) -> None:
    theirs, before = someone_elses(tmp_path)
    (tmp_path / "hang").symlink_to(theirs)
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rank-0.log").write_text("attempt 1\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "logs" / "attempt-1").symlink_to(elsewhere)
    keep_logs(tmp_path, 1)
    assert contents(theirs) == before and not (theirs / "attempt-1").exists()
    assert list(elsewhere.iterdir()) == [] and (tmp_path / "logs" / "rank-0.log").read_text() == "attempt 1\n"
