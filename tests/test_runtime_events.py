"""Per-rank JSON-lines events: written cheaply, read back tolerantly, errors recorded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from runtime import events
from runtime.events import EventWriter
from tests.runs import wait_for

REPO = Path(__file__).resolve().parent.parent


def test_events_round_trip_with_schema_time_and_rank(tmp_path: Path) -> None:
    writer = EventWriter(tmp_path, rank=3)
    writer.started(local_rank=1, node=1, device="cpu", world_size=4)
    writer.step_done(step=10, epoch=0, loss=2.5, samples_per_s=100.0, lr=0.1)
    writer.checkpoint(step=10, path=tmp_path / "step-000000010.pt")
    writer.finished(weights_sha256="abc")
    writer.close()
    found = events.read_events(tmp_path)
    assert list(found) == [3]
    kinds = [e["event"] for e in found[3]]
    assert kinds == ["started", "step", "checkpoint", "finished"]
    for event in found[3]:
        assert event["schema"] == events.SCHEMA_VERSION and event["rank"] == 3
        assert isinstance(event["time"], float) and abs(event["time"] - time.time()) < 60
    started, step = found[3][0], found[3][1]
    assert {"local_rank", "node", "host", "device", "pid", "world_size"} <= started.keys()
    assert (step["step"], step["epoch"], step["loss"], step["lr"]) == (10, 0, 2.5, 0.1)
    assert found[3][3]["weights_sha256"] == "abc" and found[3][3]["step"] == 10


def test_every_event_carries_its_process_and_its_number_in_the_order_written(tmp_path: Path) -> None:
    writer = EventWriter(tmp_path, rank=1)
    writer.started(local_rank=1, node=0, device="cpu", world_size=2)
    writer.start_heartbeat(0.01)  # a second thread emitting at the same time
    for step in range(1, 51):
        writer.step_done(step=step, epoch=0, loss=1.0, samples_per_s=10.0, lr=0.1)
    writer.warning("a checkpoint was set aside", "checkpoint")
    writer.close()
    written = events.read_events(tmp_path)[1]
    assert [event["seq"] for event in written] == list(range(1, len(written) + 1))  # the file's order
    assert {event["pid"] for event in written} == {os.getpid()}
    again = EventWriter(tmp_path, rank=1)  # the rank started again (here by the same process): from 1 again
    assert again.finished()["seq"] == 1
    again.close()


def test_each_rank_has_its_own_file(tmp_path: Path) -> None:
    for rank in (0, 1, 10, 2):
        EventWriter(tmp_path, rank).finished()
    assert sorted(p.name for p in (tmp_path / "events").iterdir()) == [
        "rank-0.jsonl",
        "rank-1.jsonl",
        "rank-10.jsonl",
        "rank-2.jsonl",
    ]
    assert list(events.read_events(tmp_path)) == [0, 1, 2, 10]


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    writer = EventWriter(tmp_path, 0)
    writer.finished()
    writer.close()
    with writer.path.open("a") as file:
        file.write('{"schema": 1, "event": "step", "ti')
    assert [e["event"] for e in events.read_events(tmp_path)[0]] == ["finished"]


def test_a_restarted_rank_starts_a_fresh_line_after_a_torn_one(tmp_path: Path) -> None:
    path = events.events_path(tmp_path, 0)
    path.parent.mkdir(parents=True)
    path.write_text('{"schema": 1, "event": "started"}\n{"schema": 1, "ev')
    EventWriter(tmp_path, 0).finished()
    found = events.read_events(tmp_path)[0]
    assert [e["event"] for e in found] == ["started", "finished"]
    with pytest.raises(ValueError, match="rank-0.jsonl:2: not a JSON event line"):
        events.read_events(tmp_path, strict=True)


def test_recording_writes_the_error_and_reraises(tmp_path: Path) -> None:
    writer = EventWriter(tmp_path, 1)
    with pytest.raises(ZeroDivisionError), writer.recording():
        writer.progress(step=42, epoch=1)
        _ = 1 / 0
    (error,) = [e for e in events.read_events(tmp_path)[1] if e["event"] == "error"]
    assert error["type"] == "ZeroDivisionError"
    assert error["message"] == "division by zero"
    assert "1 / 0" in error["traceback"] and error["step"] == 42


def test_a_clean_exit_records_no_error(tmp_path: Path) -> None:
    writer = EventWriter(tmp_path, 0)
    with pytest.raises(SystemExit), writer.recording():
        sys.exit(0)
    assert events.read_events(tmp_path)[0] == []


def test_heartbeats_come_from_a_background_thread(tmp_path: Path) -> None:
    writer = EventWriter(tmp_path, 0)
    writer.progress(step=7, epoch=0)
    writer.start_heartbeat(0.05)

    def beats() -> list[dict]:
        return [e for e in events.read_events(tmp_path)[0] if e["event"] == "heartbeat"]

    try:
        wait_for(lambda: len(beats()) >= 2, 60, "two heartbeats from the thread")  # while this thread only waits
    finally:
        writer.close()
    assert all(b["step"] == 7 for b in beats())


def test_the_heartbeat_interval_is_configurable() -> None:
    assert events.heartbeat_interval({}) == 5.0
    assert events.heartbeat_interval({"NPU_WIZARD_HEARTBEAT_S": "0.5"}) == 0.5


def test_the_follower_returns_only_new_complete_events(tmp_path: Path) -> None:
    follower = events.EventFollower(tmp_path)
    assert follower.poll() == {}
    writer = EventWriter(tmp_path, 0)
    writer.emit("step", step=1)
    assert [e["step"] for e in follower.poll()[0]] == [1]
    with writer.path.open("a") as file:
        file.write('{"schema": 1, "event": "step", "step": 2')
    assert follower.poll() == {}
    with writer.path.open("a") as file:
        file.write("}\n")
    assert [e["step"] for e in follower.poll()[0]] == [2]


def test_the_run_folder_follows_flag_then_environment_then_project(tmp_path: Path) -> None:
    env = {"NPU_WIZARD_RUN_DIR": "/env/run"}
    assert events.resolve_run_dir("/flag", tmp_path, env) == Path("/flag")
    assert events.resolve_run_dir(None, tmp_path, env) == Path("/env/run")
    assert events.resolve_run_dir(None, tmp_path, {}) == tmp_path / "runs" / "latest"


TEE = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from runtime import events
    print(events.tee_output(Path(sys.argv[1]), 5))
    print("from python")
    sys.stderr.write("to stderr\\n")
    os.write(1, b"from the file descriptor\\n")
    """
)


@pytest.mark.parametrize("enabled", [True, False], ids=["tee", "NPU_WIZARD_TEE_LOGS=0"])
def test_a_rank_tees_its_output_into_its_log(tmp_path: Path, enabled: bool) -> None:
    env = {"PATH": "/usr/bin:/bin", "NPU_WIZARD_TEE_LOGS": "1" if enabled else "0"}
    result = subprocess.run(
        [sys.executable, "-c", TEE, str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    log = tmp_path / "logs" / "rank-5.log"
    console = result.stdout + result.stderr
    for line in ("from python", "to stderr", "from the file descriptor"):
        assert line in console
        if enabled:
            assert line in log.read_text()
    assert log.exists() == enabled


# A rank that crashes at exit after the tee has written its last line: an atexit handler registered before
# tee_output runs after the tee's own (they run last first). Later crashes (in the interpreter's teardown, in C++
# static destructors) write their library's words to descriptor 2 the same way; faulthandler's stacks are off by then.
CRASH_AT_EXIT = textwrap.dedent(
    """
    import atexit, faulthandler, os, sys
    from pathlib import Path
    from runtime import events

    def teardown_crash():
        os.write(2, b"terminate called after throwing an instance of 'std::system_error'\\n")
        os.abort()

    atexit.register(teardown_crash)
    events.tee_output(Path(sys.argv[1]), 2)
    faulthandler.enable(all_threads=True)
    print("finished, step 64")
    """
)


def test_a_crash_in_the_teardown_after_the_rank_finished_is_in_its_log(tmp_path: Path) -> None:
    # rank 3 of a 2 x 2 run once finished all its steps and died by SIGABRT a moment later, its log silent: what
    # it said then went where the tee's pipe had been, /dev/null
    result = subprocess.run(
        [sys.executable, "-c", CRASH_AT_EXIT, str(tmp_path)],
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == -6, result.stderr
    log = (tmp_path / "logs" / "rank-2.log").read_text()
    said = log.split("finished, step 64\n", 1)[1]
    assert said.startswith("terminate called after throwing an instance of 'std::system_error'\n"), log
    # faulthandler's report of the abort, with the Python stack it happened in
    assert "Fatal Python error: Aborted" in said and "teardown_crash" in said, log


def test_events_are_json_per_line(tmp_path: Path) -> None:
    writer = EventWriter(tmp_path, 0)
    writer.emit("step", path=tmp_path)  # a Path becomes its text
    line = writer.path.read_text().splitlines()[0]
    assert json.loads(line)["path"] == str(tmp_path)


def test_a_full_disk_stops_the_events_with_one_warning_and_the_rank_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = events.events_path(tmp_path, 0)
    path.parent.mkdir(parents=True)
    path.symlink_to("/dev/full")  # every write there fails with ENOSPC, as on a disk that filled
    writer = EventWriter(tmp_path, 0)
    try:
        writer.emit("started")
        writer.progress(1, 0)
        events.warn("a warning after the disk filled", "test")
    finally:
        writer.close()
    lines = capsys.readouterr().err.splitlines()
    said = [line for line in lines if "no space left on" in line]
    assert said == [
        f"events: no space left on {path.parent}: this rank's events stop here, training goes on "
        "(free space on that disk for the next run)"
    ]
