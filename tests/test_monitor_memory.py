"""`npu-wizard monitor` of a run folder of any size keeps its memory bounded.

Real run folders written to disk (a finished run of many events, a rank whose
error message is huge), read by a real `npu-wizard monitor --plain` process
whose peak memory is measured.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from runtime.events import FOLLOW_CHUNK, EventFollower, EventWriter

# The process with its imports takes about 42 MB on these events. Measured on them, a monitor that read them
# whole peaked at 10x their size, one that kept each step as a dict at 337 MB, each raw line at 113 MB, and a
# (time, loss, step) tuple per step at 92 MB: each past the limit.
EVENTS_MB = 48
PEAK_LIMIT_MB = 80


def finished_run(folder: Path, ranks: int, megabytes: int) -> Path:
    """A finished 1-node run folder whose ranks logged `megabytes` MB of step events in all."""
    now = time.time()
    (folder / "events").mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"world_size": ranks, "node_count": 1, "started_at": now}))
    per_rank = megabytes * 1024 * 1024 // ranks
    for rank in range(ranks):
        started = {"event": "started", "time": now, "rank": rank, "node": 0, "world_size": ranks, "pid": 1}
        lines = [json.dumps(started)]
        size, step = 0, 0
        while size < per_rank:
            step += 1
            # json.dumps of each event's dict, written out: a million of them took most of the test's time
            line = (
                f'{{"schema": 1, "event": "step", "time": {now + step * 1e-3!r}, "rank": {rank}, "step": {step}, '
                f'"epoch": 0, "loss": {1.0 / step!r}, "samples_per_s": 1000.0, "lr": 0.1}}'
            )
            lines.append(line)
            size += len(line) + 1
        lines.append(json.dumps({"event": "finished", "time": now + step, "rank": rank, "step": step}))
        (folder / "events" / f"rank-{rank}.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def monitor_peak_mb(run_dir: Path) -> tuple[float, str]:
    """Run `npu-wizard monitor RUN --plain` to its end; return its peak resident memory (MB) and output."""
    probe = (
        "import sys\n"
        "from wizard.cli import main\n"
        "code = main(['monitor', sys.argv[1], '--plain'])\n"
        # VmHWM, not ru_maxrss: the latter carries over the forking parent's peak across exec
        "peak = next(line for line in open('/proc/self/status') if line.startswith('VmHWM:'))\n"
        "print('PEAK_KB', peak.split()[1])\n"
        "sys.exit(code)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe, str(run_dir)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    peak_kb = int(done.stdout.rsplit("PEAK_KB", 1)[1].split()[0])
    return peak_kb / 1024, done.stdout


def test_monitor_of_a_finished_run_with_many_events_stays_within_bounded_memory(tmp_path: Path) -> None:
    run_dir = finished_run(tmp_path / "run", ranks=2, megabytes=EVENTS_MB)
    peak, output = monitor_peak_mb(run_dir)
    assert peak < PEAK_LIMIT_MB, f"peak {peak:.0f} MB"
    assert "finished" in output


def test_a_huge_error_message_is_clipped_where_it_is_shown(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    now = time.time()
    (run_dir / "events").mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"world_size": 1, "node_count": 1, "started_at": now}))
    message = "disk on fire " + "x" * (100 * 1024 * 1024)
    lines = [
        json.dumps({"event": "started", "time": now, "rank": 0, "node": 0, "world_size": 1, "pid": 1}),
        json.dumps(
            {
                "schema": 1,
                "event": "error",
                "time": now + 1,
                "rank": 0,
                "type": "OSError",
                "message": message,
                "traceback": "Traceback ...\nOSError: disk on fire\n",
                "step": 3,
            }
        ),
    ]
    (run_dir / "events" / "rank-0.jsonl").write_text("\n".join(lines) + "\n")
    del message, lines
    peak, output = monitor_peak_mb(run_dir)
    assert peak < PEAK_LIMIT_MB, f"peak {peak:.0f} MB"
    assert "OSError: disk on fire xxx" in output  # the failure is still named, with the start of its message
    assert len(output) < 20_000


def test_an_event_line_longer_than_a_chunk_is_salvaged_and_the_next_read(tmp_path: Path) -> None:
    folder = tmp_path / "events"
    folder.mkdir()
    head = {
        "schema": 1,
        "event": "error",
        "time": 5.0,
        "rank": 2,
        "type": "ValueError",
        "message": "bad \\u00e9 " + "y" * 300,
    }
    line = json.dumps(head)
    (folder / "rank-2.jsonl").write_text(
        line + "\n" + json.dumps({"event": "heartbeat", "time": 6.0, "rank": 2}) + "\n"
    )
    follower = EventFollower(tmp_path, chunk=128)
    seen = []
    for _ in range(10):
        seen += follower.poll().get(2, [])
    assert [(e["event"], e["rank"]) for e in seen] == [("error", 2), ("heartbeat", 2)]
    assert seen[0]["type"] == "ValueError" and seen[0]["message"].startswith("bad \\u00e9 y")
    assert follower.skipped == 1


def test_a_rank_writes_a_huge_error_clipped_to_one_readable_line(tmp_path: Path) -> None:
    writer = EventWriter(tmp_path, rank=0)
    writer.error(OSError("z" * (10 * 1024 * 1024)))
    writer.close()
    line = (tmp_path / "events" / "rank-0.jsonl").read_bytes()
    assert len(line) < FOLLOW_CHUNK and len(line) < 64 * 1024
    event = json.loads(line)
    assert event["message"].startswith("zzz") and "characters cut" in event["message"]


def test_a_crafted_overlong_line_or_world_size_is_refused_not_fatal(tmp_path: Path) -> None:
    folder = tmp_path / "events"
    folder.mkdir()
    crafted = '{"event": "error", "time": 1.2.3, "rank": 0, "message": "' + "y" * 300 + '"}\n'
    (folder / "rank-0.jsonl").write_text(crafted + json.dumps({"event": "heartbeat", "time": 6.0, "rank": 0}) + "\n")
    follower = EventFollower(tmp_path, chunk=128)
    seen = []
    for _ in range(10):
        seen += follower.poll().get(0, [])
    assert [event["event"] for event in seen] == ["heartbeat"]

    (folder / "rank-100000000.jsonl").write_text("")
    monitor = [sys.executable, "-m", "wizard", "monitor", str(tmp_path), "--plain"]
    done = subprocess.run(monitor, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "says its world size is 100000001" in done.stderr
