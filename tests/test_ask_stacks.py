"""Asking for every rank's stack on demand, and what the runner learns of a rank that cannot answer (issue 28).

The real runs are tests/test_hang_stacks.py; these pin the edges: the live
view's key, `monitor --stacks` with no runner to ask, an ask file that is a
link, and the probe of a process that is stopped or has no SIGUSR2 handler.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from textual.widgets import Static

from runtime.events import ENV_RUN_DIR
from tests.runs import wait_for
from wizard.monitor import ask_stacks as ask_stacks_module
from wizard.monitor.app import MonitorApp
from wizard.monitor.attach import RunFolder
from wizard.monitor.state import JobState
from wizard.run.engines.ssh import SshEngine
from wizard.run.hang_stacks import Unanswered, catches, collect, probe_local, process_state, read_probe, take_ask
from wizard.run.intake import Intake


def of_run(run_dir: Path) -> dict[str, str]:
    """This environment, naming `run_dir` as a rank's does (probes signal only the run's own processes)."""
    return {**os.environ, ENV_RUN_DIR: str(run_dir)}


class CollectingJob:
    """A running job whose collect_stacks records each call (stands in for wizard.run.job.Job)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir, self.state, self.summary = run_dir, JobState(2, clock=self.clock), None
        self.started_at, self.outcome, self.hang_verdict = 1000.0, None, None
        self.collected: list[str] = []

    def clock(self) -> float:
        return 1010.0

    def tick(self) -> str | None:
        return self.outcome

    def stop(self, outcome: str = "interrupted", signum: int = 2) -> str:
        self.outcome = outcome
        return outcome

    def collect_stacks(self, reason: str) -> Path:
        self.collected.append(reason)
        self.hang_verdict = SimpleNamespace(text="hang at 10:00:00 UTC: rank 1 never entered #7")
        return self.run_dir / "hang"


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_live_views_key_collects_the_stacks_and_shows_the_verdict(tmp_path: Path) -> None:
    job = CollectingJob(tmp_path)
    app = MonitorApp(job, title="job", owns_job=True, tick_s=0)  # type: ignore[arg-type]
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("w")
        await app.workers.wait_for_complete()
        await pilot.pause()
        alert = str(app.query_one("#alert", Static).render())
    assert job.collected == ["asked"]
    assert "rank 1 never entered #7" in alert


def test_monitor_stacks_without_a_running_runner_says_so_in_one_line(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "20260101-000000"
    (run_dir / "events").mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"runner_pid": 4194000, "world_size": 2}))
    done = subprocess.run(
        [sys.executable, "-m", "wizard", "monitor", str(run_dir), "--stacks"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "no `npu-wizard run` of this run is running on this host" in done.stderr
    assert not (run_dir / "hang").exists()


def test_an_ask_file_that_is_a_link_is_taken_away_and_never_followed(tmp_path: Path) -> None:
    (tmp_path / "hang").mkdir()
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"id": "abc123"}))
    (tmp_path / "hang" / "ask").symlink_to(secret)
    assert take_ask(tmp_path) == ""  # collected, for no ask id: the link's target was not read
    assert not (tmp_path / "hang" / "ask").is_symlink() and secret.exists()
    assert take_ask(tmp_path) is None


def test_a_stopped_process_is_named_stopped_and_its_signal_waits(tmp_path: Path) -> None:
    code = (
        "import faulthandler, signal, sys, time\n"
        f"faulthandler.register(signal.SIGUSR2, file=open({str(tmp_path / 'logs' / 'rank-0.stacks.txt')!r}, 'a'),"
        " all_threads=True)\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"
    )
    (tmp_path / "logs").mkdir()
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=of_run(tmp_path))
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        assert catches(child.pid, signal.SIGUSR2)
        os.kill(child.pid, signal.SIGSTOP)
        wait_for(lambda: process_state(child.pid) == "T (stopped)", 30, "the child to stop")
        probe = probe_local(tmp_path, 0, child.pid)
        assert (probe.state, probe.faulthandler) == ("T (stopped)", None)
        assert "waits until the process is continued (SIGCONT); it was not resumed" in str(probe.note)
        assert process_state(child.pid) == "T (stopped)"
        os.kill(child.pid, signal.SIGCONT)  # the signal that waited is delivered: faulthandler writes
        stacks = tmp_path / "logs" / "rank-0.stacks.txt"
        wait_for(lambda: "most recent call first" in stacks.read_text(), 30, "faulthandler's dump")
        probe = probe_local(tmp_path, 0, child.pid)  # a running one: the stacks come back at once
        assert probe.state is not None and probe.state[0] in "RS"
        assert probe.faulthandler is not None and 'File "<string>", line 4' in probe.faulthandler
    finally:
        child.kill()
        child.wait()


def test_a_process_without_a_handler_is_not_sent_the_signal_that_would_end_it(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(600)"],
                             stdout=subprocess.PIPE, text=True, env=of_run(tmp_path))  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        probe = probe_local(tmp_path, 0, child.pid)
        assert "no handler for SIGUSR2: not sent" in str(probe.note)
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()


def test_the_ssh_engine_probes_a_rank_on_its_host_for_its_state_and_stacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command runs through NPU_WIZARD_SSH_COMMAND: here a stand-in that runs it on this host."""
    fake_ssh = tmp_path / "ssh"
    fake_ssh.write_text('#!/bin/bash\nshift\nexec bash -c "$1"\n')
    fake_ssh.chmod(0o755)
    monkeypatch.setenv("NPU_WIZARD_SSH_COMMAND", str(fake_ssh))
    run_dir = tmp_path / "runs" / "20260101-000000"
    (run_dir / "logs").mkdir(parents=True)
    launch = SimpleNamespace(
        answers={"devices_per_node": 2, "network.host_ips": ["127.0.0.1", "127.0.0.1"]},
        project=tmp_path,
        run_dir=run_dir,
        spares={},  # no spare host took a node's place
    )
    code = (
        "import faulthandler, signal, time\n"
        f"faulthandler.register(signal.SIGUSR2, file=open({str(run_dir / 'logs' / 'rank-3.stacks.txt')!r}, 'a'),"
        " all_threads=True)\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"
    )
    remote_run_dir = Path(SshEngine().remote_run_dir(launch))  # type: ignore[arg-type]
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=of_run(remote_run_dir)
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        probed = SshEngine().probe_rank(launch, 3, "h1", child.pid)  # type: ignore[arg-type]
        assert probed is not None
        probe = read_probe(*probed)
        assert probe.state is not None and probe.state[0] in "RS"
        assert probe.faulthandler is not None and 'File "<string>", line 4' in probe.faulthandler
        os.kill(child.pid, signal.SIGSTOP)
        wait_for(lambda: process_state(child.pid) == "T (stopped)", 30, "the child to stop")
        probe = read_probe(*SshEngine().probe_rank(launch, 3, "h1", child.pid))  # type: ignore[arg-type, misc]
        assert (probe.state, probe.faulthandler) == ("T (stopped)", None)
        assert "not resumed" in str(probe.note)
    finally:
        child.kill()
        child.wait()
    probe = read_probe(*SshEngine().probe_rank(launch, 3, "h1", child.pid))  # type: ignore[arg-type, misc]
    assert probe.note == "its process is gone from its host"


def test_a_rank_with_torch_npus_dump_pipe_is_asked_for_its_hccl_dump_through_it(tmp_path: Path) -> None:
    # The child stands in for an HCCL rank: TORCH_HCCL_DEBUG_INFO_PIPE_FILE in its environment (as run-node.sh
    # sets it), a thread reading its pipe as torch_npu's monitor thread does, faulthandler on SIGUSR2.
    hccl = tmp_path / "hccl"
    hccl.mkdir()
    os.mkfifo(hccl / "pipe_rank_3.pipe")
    code = (
        "import faulthandler, os, select, signal, threading, time\n"
        f"faulthandler.register(signal.SIGUSR2, file=open({str(tmp_path / 'logs' / 'rank-3.stacks.txt')!r}, 'a'),"
        " all_threads=True)\n"
        # opened for reading without blocking before the rank is ready, as torch_npu's DumpPipe does
        f"pipe = os.open({str(hccl / 'pipe_rank_3.pipe')!r}, os.O_RDONLY | os.O_NONBLOCK)\n"
        "def monitor():\n"
        "    while True:\n"
        "        select.select([pipe], [], [])\n"
        "        got = os.read(pipe, 2)\n"
        "        if got:\n"
        f"            open({str(hccl / 'asked')!r}, 'wb').write(got)\n"
        "            return\n"
        "        time.sleep(0.05)\n"
        "threading.Thread(target=monitor, daemon=True).start()\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"
    )
    (tmp_path / "logs").mkdir()
    env = {
        **of_run(tmp_path),
        "TORCH_HCCL_DEBUG_INFO_PIPE_FILE": "hccl/pipe_rank_",
        "TORCH_HCCL_DEBUG_INFO_TEMP_FILE": "hccl/trace_rank_",
    }
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        probe = probe_local(tmp_path, 3, child.pid)
        assert f"asked through {hccl / 'pipe_rank_3.pipe'}: torch_npu writes hccl/trace_rank_3" in str(probe.note)
        wait_for(lambda: (hccl / "asked").exists() and (hccl / "asked").read_bytes() == b"1\n", 30, "the byte")
        assert probe.faulthandler is not None and "most recent call first" in probe.faulthandler
    finally:
        child.kill()
        child.wait()


def test_a_rank_without_a_dump_pipe_is_not_asked_through_one(tmp_path: Path) -> None:
    code = (
        "import faulthandler, signal, time\nfaulthandler.register(signal.SIGUSR2, all_threads=True)\n"
        "print('ready', flush=True)\ntime.sleep(600)\n"
    )
    env = {key: value for key, value in of_run(tmp_path).items() if not key.startswith("TORCH_HCCL_")}
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        probe = probe_local(tmp_path, 0, child.pid, wait_s=0.5)
        assert probe.note == "SIGUSR2 sent: faulthandler's stacks follow"
    finally:
        child.kill()
        child.wait()


def test_probing_silent_ranks_stops_when_its_time_is_spent(tmp_path: Path) -> None:
    # A partition silences 8 ranks on another host, each probe an ssh that runs into its time limit (here a wait
    # of 0.4 s standing in for it): after the budget the ranks left are said not probed, the runner goes on.
    state = JobState(8)
    for rank in range(8):
        state.ingest({"event": "hello", "time": 1.0, "rank": rank, "pid": 4000 + rank, "host": "h1"})
    intake = Intake(state, tmp_path)  # no status stream: nobody answers
    probed: list[int] = []
    never = threading.Event()

    def slow_probe(rank: int, host: str | None, pid: int) -> Unanswered:
        probed.append(rank)
        never.wait(0.4)
        return Unanswered("S (sleeping)", note="probed over ssh")

    records = collect(tmp_path, intake, range(8), "hang", slow_probe, wait_s=0, probe_budget_s=1.0)

    assert 1 <= len(probed) < 8
    assert records[probed[0]]["note"] == "probed over ssh"
    assert records[7]["note"] == "not probed: the 1 s for probing silent ranks were spent"
    assert sorted(records) == list(range(8)) and (tmp_path / "hang" / "rank-7.json").is_file()


def test_monitor_stacks_prints_the_verdict_and_problems_escaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank's stack is anyone's text: `monitor --stacks` prints its verdict escaped, as every other path does."""
    hostile = "\x1b[2J\x1b]0;owned\x07"
    run_dir = tmp_path / "run"
    (run_dir / "events").mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"runner_pid": os.getpid(), "world_size": 2}))
    (run_dir / "hang").mkdir()
    (run_dir / "hang" / "collected.json").write_text(json.dumps({"asked_id": "feedfacefeedface"}))
    monkeypatch.setattr(ask_stacks_module.procs, "is_runner", lambda pid: True)
    monkeypatch.setattr(ask_stacks_module.secrets, "token_hex", lambda size: "feedfacefeedface")
    verdict = {"text": f"rank 1 in {hostile}", "problems": [f"rank 1's stack says {hostile}"]}
    monkeypatch.setattr(ask_stacks_module, "hang_summary", lambda run_dir: verdict)
    out = io.StringIO()

    ask_stacks_module.ask_stacks(RunFolder.open(run_dir), out, wait_s=5)

    printed = out.getvalue()
    assert "\x1b" not in printed and "\x07" not in printed
    assert "WHERE EACH RANK IS: rank 1 in \\x1b[2J\\x1b]0;owned\\x07\n" in printed
    assert "  rank 1's stack says \\x1b[2J" in printed


def test_a_second_monitor_stacks_waits_for_the_ask_in_progress_and_never_replaces_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two `monitor --stacks` at once: the second leaves the first's ask in place and is answered by its collection."""
    run_dir = tmp_path / "run"
    (run_dir / "events").mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"runner_pid": os.getpid(), "world_size": 2}))
    (run_dir / "hang").mkdir()
    (run_dir / "hang" / "ask").write_text(json.dumps({"id": "aaaaaaaaaaaaaaaa", "time": 1.0}))
    monkeypatch.setattr(ask_stacks_module.procs, "is_runner", lambda pid: True)
    monkeypatch.setattr(ask_stacks_module.secrets, "token_hex", lambda size: "bbbbbbbbbbbbbbbb")
    monkeypatch.setattr(ask_stacks_module, "hang_summary", lambda run_dir: None)

    out = io.StringIO()

    def runner_collects() -> None:  # the runner's next tick, once the second has asked: it answers the ask there is
        wait_for(out.getvalue, 30, "the second monitor to ask")
        asked = take_ask(run_dir)
        (run_dir / "hang" / "collected.json").write_text(json.dumps({"asked_id": asked}))

    runner = threading.Thread(target=runner_collects)
    runner.start()
    try:
        ask_stacks_module.ask_stacks(RunFolder.open(run_dir), out, wait_s=10)
    finally:
        runner.join()
    assert json.loads((run_dir / "hang" / "collected.json").read_text())["asked_id"] == "aaaaaaaaaaaaaaaa"
    assert "another ask for the stacks is in progress" in out.getvalue()


def test_a_link_put_in_place_of_hang_after_the_check_is_never_written_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """hang/ is opened once and the ask written relative to it: a link swapped in for it while the monitor asks
    (someone sharing the run folder) gets nothing written through it."""
    run_dir = tmp_path / "run"
    (run_dir / "events").mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"runner_pid": os.getpid(), "world_size": 2}))
    (run_dir / "hang").mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.setattr(ask_stacks_module.procs, "is_runner", lambda pid: True)
    monkeypatch.setattr(ask_stacks_module, "hang_summary", lambda run_dir: None)
    moved = tmp_path / "hang-moved"

    def swapped_then_id(size: int) -> str:  # called as the ask is made: the swap comes after every check
        if not moved.exists():
            (run_dir / "hang").rename(moved)
            (run_dir / "hang").symlink_to(elsewhere)
        return "cccccccccccccccc"

    monkeypatch.setattr(ask_stacks_module.secrets, "token_hex", swapped_then_id)
    out = io.StringIO()

    def runner_collects() -> None:  # the ask is in the folder that was opened, wherever it is now
        wait_for(lambda: (moved / "ask").is_file(), 30, "the ask")
        asked = json.loads((moved / "ask").read_text())["id"]
        (moved / "collected.json").write_text(json.dumps({"asked_id": asked}))

    runner = threading.Thread(target=runner_collects)
    runner.start()
    try:
        ask_stacks_module.ask_stacks(RunFolder.open(run_dir), out, wait_s=60)  # returns once answered
    finally:
        runner.join()
    assert list(elsewhere.iterdir()) == []
