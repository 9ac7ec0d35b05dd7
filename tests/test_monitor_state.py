"""The monitor's model without processes: the HCCL hint table, states, hangs and the root cause."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from wizard.monitor.attach import RunFolder
from wizard.monitor.hints import explain
from wizard.monitor.ranks import Failure
from wizard.monitor.state import FAILED, FINISHED, HUNG, RUNNING, STALLED, STARTING, JobState
from wizard.monitor.summary_text import failure_report, format_summary, progress_line, summarize

# (message as a rank reports it, expected code, caused by another rank)
MESSAGES = [
    ("EI0006: Getting socket times out. Reason: remote rank did not connect", "EI0006", True),
    ("The wait execution of the Notify register times out. Reason: Heartbeat Lost (507048)", "EI0002", True),
    ("The server socket has failed to bind to [::]:29500 (errno: 98 - Address already in use)", "EADDRINUSE", False),
    ("EJ0001: Failed to initialize the HCCP process. the last training process is running", "EJ0001", False),
    ("EI0020: listen on ip[10.0.0.1] and specific port[60000] fail", "EJ0003", False),
    ("EI0019: the device port 16666 is bound", "EI0019", False),
    ("EI0019: socket type[2] fail to listen on ip[10.0.0.1] and specific port[60000] fail", "EI0019", False),
    ("EI0015: Failed to get the root info within the timeout", "EI0015", True),
    ("EI0016: The TLS configurations of the cards in the communicator are inconsistent", "EI0016", False),
    ("HCCL Recv unmatched ack from 10.0.0.2", "Recv unmatched ack", False),
    ("EI0004: the rank table is invalid", "EI0004", False),
    ("EI0005: operator arguments differ between ranks", "EI0005", False),
    ("pair.cc:545] Read error [127.0.0.1]:3477: Connection reset by peer.", "peer lost", True),
    ("pair.cc:561] Connection closed by peer [127.0.0.1]:3477", "peer lost", True),
    ("Watchdog caught collective operation timeout", "collective timeout", True),
    ("EE1002: Stream synchronize timeout, stream_id=3", "EE1002", True),
    (
        "torch.distributed.DistNetworkError: The client socket has timed out after 1800000ms while trying to "
        "connect to (10.0.0.1, 29500).",
        "c10d client timeout",
        False,
    ),
]


@pytest.mark.parametrize(("message", "code", "peer"), MESSAGES, ids=[m[1] for m in MESSAGES])
def test_known_failures_are_decoded_with_their_fix(message: str, code: str, peer: bool) -> None:
    hint = explain(message)
    assert hint is not None and hint.code == code
    assert hint.caused_by_peer is peer
    assert hint.fix


def test_the_socket_timeout_is_the_parameter_plane_link_not_the_host_nic() -> None:
    hint = explain("EI0006: Getting socket times out")
    assert hint is not None
    assert "parameter-plane" in hint.meaning and "16666" in hint.meaning
    for check in ("hccn_tool -i N -link -g", "(-ip -g)", "(-tls -g)", "HCCL_CONNECT_TIMEOUT"):
        assert check in hint.fix
    # the host NIC (HCCL_IF_IP) only reaches the root: EI0015 is its timeout, not EI0006
    assert "HCCL_IF_IP" not in hint.fix


def test_the_host_nic_negotiation_timeout_points_at_hccl_if_ip_and_the_master() -> None:
    hint = explain("EI0015: Failed to get the root info within the timeout")
    assert hint is not None and hint.code == "EI0015"
    assert "HCCL_IF_IP" in hint.fix and "HCCL_SOCKET_IFNAME" in hint.fix and "master" in hint.fix


def test_tls_that_differs_across_cards_points_at_hccn_tool_tls() -> None:
    hint = explain("EI0016: TLS configurations differ")
    assert hint is not None and "hccn_tool -i N -tls -g" in hint.fix


def test_a_host_port_bind_failure_names_the_hccl_port_range_not_one_process_per_device() -> None:
    hint = explain("EI0019: socket type[2] fail to listen on ip[10.0.0.1] and specific port[60000] fail")
    assert hint is not None and hint.code == "EI0019"
    assert "host port" in hint.meaning and "HCCL_IF_BASE_PORT" in hint.meaning
    assert "HCCL_HOST_SOCKET_PORT_RANGE" in hint.meaning
    assert "sysctl/reserve-ports.sh" in hint.fix


def test_a_device_port_bind_failure_names_one_process_per_device() -> None:
    hint = explain("EI0019: socket type[1] fail to listen on ip[192.168.1.8] and specific port[16666] fail")
    assert hint is not None and hint.code == "EI0019"
    assert "device port 16666" in hint.meaning and "one training process per device" in hint.fix


def test_ee1002_says_how_to_rerun_with_more_cann_logging() -> None:
    hint = explain("EE1002: Stream synchronize timeout")
    assert hint is not None and "ASCEND_GLOBAL_LOG_LEVEL=1 ASCEND_GLOBAL_EVENT_ENABLE=1" in hint.fix


def failed_rank(device: str) -> Failure:
    """The root cause of a job whose rank 3 (node 1, pid 4242) failed on `device`."""
    state = JobState(4, hang_after=10, clock=lambda: 50.0)
    for rank in range(4):
        state.ingest(event(rank, "started", 10.0, node=rank // 2, pid=4240 + rank, device=device, world_size=4))
    state.ingest(event(3, "error", 30.0, type="RuntimeError", message="EE1002: Stream synchronize timeout"))
    failure = state.root_cause()
    assert failure is not None
    return failure


def test_the_report_of_a_failed_npu_rank_points_at_its_cann_logs(tmp_path: Path) -> None:
    lines = failure_report(failed_rank("npu:1"), tmp_path).splitlines()
    assert lines[-2] == (
        "CANN logs of rank 3: on node 1, plog-4243_*.log in the CANN log folder ($ASCEND_PROCESS_LOG_PATH "
        "if set, else ~/ascend/log) under debug/plog/ (plog/ on older CANN); device logs in device-<id>/ beside it"
    )
    assert lines[-1].startswith("more detail: run again with ASCEND_GLOBAL_LOG_LEVEL=1 ASCEND_GLOBAL_EVENT_ENABLE=1")


def test_the_report_of_a_cpu_rank_has_no_cann_lines(tmp_path: Path) -> None:
    assert "CANN logs" not in failure_report(failed_rank("cpu"), tmp_path)


def test_an_unknown_error_has_no_hint() -> None:
    assert explain("ValueError: bad learning rate at step 16666") is None


def event(rank: int, kind: str, at: float, **fields: object) -> dict:
    """One runtime event."""
    return {"schema": 1, "event": kind, "time": at, "rank": rank, **fields}


def job(world_size: int = 2, now: float = 100.0) -> JobState:
    """A job whose ranks all started at t=10 and logged a step at t=20."""
    state = JobState(world_size, hang_after=10, clock=lambda: now)
    for rank in range(world_size):
        state.ingest(event(rank, "started", 10.0, node=0, pid=1000 + rank, world_size=world_size))
        state.ingest(event(rank, "step", 20.0, step=4, epoch=0, loss=1.0, samples_per_s=400.0))
    return state


def test_states_follow_the_events() -> None:
    state = JobState(3, hang_after=10, clock=lambda: 25.0)
    assert state.state(0) == STARTING
    for rank in range(3):
        state.ingest(event(rank, "started", 10.0, world_size=3))
        state.ingest(event(rank, "step", 20.0, step=4, samples_per_s=300.0, loss=1.0))
    state.ingest(event(1, "finished", 24.0, step=4))
    state.ingest(event(2, "error", 24.0, type="ValueError", message="boom", traceback=""))
    assert [state.state(rank) for rank in range(3)] == [RUNNING, FINISHED, FAILED]
    assert state.throughput() == pytest.approx(100.0)  # rank 0's own share of the job's 300 samples/s


def test_a_silent_rank_is_hung_and_a_waiting_one_stalled() -> None:
    state = job(now=35.0)
    state.ingest(event(0, "heartbeat", 34.0, step=4))
    assert state.state(0) == STALLED  # alive, but no step since t=20
    assert state.state(1) == HUNG  # nothing since t=20
    assert state.hung() == [1]
    assert "rank 1 (node 0) is hung: no heartbeat or step for 15s" in state.hang_report()


def test_duplicates_from_the_file_and_the_stream_count_once() -> None:
    state = job()
    state.ingest({**event(0, "step", 20.0, step=4, loss=1.0, samples_per_s=400.0), "received": 20.1})
    assert len(state.ranks[0].losses) == 1


def test_a_vanished_rank_beats_the_peers_that_lost_it() -> None:
    state = job()
    state.ingest(event(1, "lost", 30.0))
    state.ingest(event(0, "error", 30.01, type="RuntimeError", message="Connection reset by peer", traceback=""))
    cause = state.root_cause()
    assert cause is not None and cause.rank == 1 and cause.kind == "vanished"


def test_a_vanished_rank_is_placed_at_its_step_only_where_its_script_reports_steps() -> None:
    stepping = job()
    stepping.ingest(event(1, "lost", 30.0))
    cause = stepping.root_cause()
    assert cause is not None and "vanished without an error at step 4 (killed: " in cause.summary
    silent = JobState(2, hang_after=10, clock=lambda: 100.0)  # a script of the user's without report calls
    for rank in range(2):
        silent.ingest(event(rank, "started", 10.0, node=0, pid=1000 + rank, world_size=2))
    silent.ingest(event(1, "lost", 30.0))
    cause = silent.root_cause()
    assert cause is not None and cause.summary == (
        "its process 1001 vanished without an error (killed: kill -9, the OOM killer, or a crash in native code?)"
    )


def test_a_real_error_is_the_root_cause_even_after_a_peer_error() -> None:
    state = job()
    state.ingest(event(0, "error", 29.0, type="RuntimeError", message="Connection closed by peer", traceback=""))
    state.ingest(event(1, "error", 30.0, type="ValueError", message="bad batch", traceback=""))
    cause = state.root_cause()
    assert cause is not None and cause.rank == 1 and cause.summary == "ValueError: bad batch"


def test_ranks_lost_while_the_monitor_stops_the_job_are_not_failures() -> None:
    state = job()
    state.stopping()
    state.ingest(event(0, "lost", 200.0))
    assert state.root_cause() is None


def test_a_restart_clears_the_failure_and_counts() -> None:
    state = job()
    state.ingest(event(1, "lost", 30.0))
    state.ingest(event(1, "started", 40.0, resumed_step=4, world_size=2))
    assert state.root_cause() is None
    assert state.ranks[1].restarts == 1


def test_numbers_past_any_float_or_column_are_passed_over_not_raised() -> None:
    """An events file or the status stream may say anything: a 400-digit time, step or loss is no value."""
    state = job()
    huge = 10**400
    for hostile in (
        event(0, "step", huge, step=5),  # r1: int too large to convert to float
        event(0, "step", 1e300, step=5),  # no date
        event(0, "step", 21.0, step=10**20, loss=huge, samples_per_s=huge),  # r2: past a 64-bit column
        event(0, "step", 22.0, step=5, forward_s=huge, data_s=0.1),
        event(0, "heartbeat", 23.0, step=huge, silent_s=huge),
        event(huge, "started", 24.0),
        event(1, "started", 25.0, world_size=huge, total_steps=10**20, resumed_step=huge, node=huge),
    ):
        state.ingest(hostile)
    assert sorted(state.ranks) == [0, 1]
    rank_0, rank_1 = state.ranks[0], state.ranks[1]
    assert (rank_0.step, rank_0.loss, rank_0.samples_per_s, rank_0.printed_at) == (5, 1.0, 200.0, None)
    assert rank_0.newest == {"started": 10.0, "step": 22.0, "heartbeat": 23.0}
    assert (rank_1.starts, rank_1.world_size, rank_1.total_steps, rank_1.resumed_step) == (2, 2, None, 0)
    assert rank_1.node == 0
    assert "step 5" in progress_line(state, 30.0)


@pytest.mark.parametrize("started_at", [10**400, 1e300, "yesterday"])
def test_a_run_json_start_that_is_no_time_gives_way_to_the_first_event(tmp_path: Path, started_at: object) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "events").mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"started_at": started_at, "world_size": 1}))
    lines = [event(0, "started", 10.0, world_size=1), event(0, "step", 20.0, step=4, loss=1.0)]
    (run_dir / "events" / "rank-0.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    folder = RunFolder(run_dir, clock=lambda: 50.0)
    assert folder.started_at == 10.0
    assert "step 4" in progress_line(folder.state, 50.0 - folder.started_at, 50.0)


@pytest.mark.parametrize("summary", [{}, {"outcome": 3, "ended_at": "later"}, [1, 2], "finished"])
def test_a_summary_json_without_its_fields_ends_the_watch_without_a_traceback(tmp_path: Path, summary: object) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "events").mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"world_size": 1, "runner_pid": 1}))
    lines = [event(0, "started", 10.0, world_size=1), event(0, "step", 20.0, step=4, loss=1.0)]
    (run_dir / "events" / "rank-0.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (run_dir / "summary.json").write_text(json.dumps(summary))
    folder = RunFolder(run_dir, clock=lambda: 50.0)
    outcome = folder.tick()
    if isinstance(summary, dict):
        assert (outcome, folder.ended_at) == ("unknown", 20.0)
    else:  # no object: as if there were none; pid 1 is no runner of this run
        assert folder.runner_pid is None


BLOCK_SIGINT_AND_WAIT = (
    "import signal, sys, time\n"
    "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})\n"
    "print('ready', flush=True)\n"
    "time.sleep(120)\n"
)


def sigint_pending(pid: int) -> bool:
    """Whether SIGINT waits, blocked, for process `pid` (/proc/PID/status ShdPnd): sent, at once, no race."""
    status = Path(f"/proc/{pid}/status").read_text()
    pending = next(line.split()[1] for line in status.splitlines() if line.startswith("ShdPnd:"))
    return bool(int(pending, 16) & (1 << (signal.SIGINT - 1)))


@pytest.mark.parametrize(("words", "signalled"), [([], False), (["npu-wizard", "run"], True)])
def test_stopping_a_watched_run_signals_its_runner_only_never_another_process_run_json_names(
    tmp_path: Path, words: list[str], signalled: bool
) -> None:
    """run.json is anyone's to write: Ctrl-C in `npu-wizard monitor` must not send SIGINT to a process of yours
    that is no `npu-wizard run`. The process named blocks SIGINT so that a signal sent shows as pending; with the
    words `npu-wizard run` on its command line it stands in for a runner (a test double)."""
    named = subprocess.Popen([sys.executable, "-c", BLOCK_SIGINT_AND_WAIT, *words], stdout=subprocess.PIPE, text=True)
    try:
        assert named.stdout is not None and named.stdout.readline().strip() == "ready"
        run_dir = tmp_path / "run"
        (run_dir / "events").mkdir(parents=True)
        (run_dir / "run.json").write_text(json.dumps({"world_size": 1, "runner_pid": named.pid}))
        RunFolder(run_dir, clock=lambda: 50.0).stop()
        assert sigint_pending(named.pid) is signalled
    finally:
        named.kill()
        named.wait()


# ---- the straggler verdict: judged, or not judged and why -----------------------------------------------------


def stepped(world_size: int, steps: int, **timing: float) -> JobState:
    """Ranks that started and logged `steps` step events a second apart, each with `timing` (forward_s, data_s)."""
    state = JobState(world_size, hang_after=math.inf)
    for rank in range(world_size):
        state.ingest(event(rank, "started", 10.0, node=rank // 2, world_size=world_size))
    for step in range(1, steps + 1):
        for rank in range(world_size):
            state.ingest(event(rank, "step", 10.0 + step + rank / 100, step=10 * step, loss=1.0, **timing))
    for rank in range(world_size):
        state.ingest(event(rank, "finished", 20.0 + steps))
    return state


TIMED = {"forward_s": 0.01, "data_s": 0.001}


@pytest.mark.parametrize(
    ("state", "why"),
    [
        (stepped(4, 0), "no rank reported a step (the script reports none, or the run ended before its first)"),
        (stepped(4, 30), "no step event carries forward_s and data_s, which are compared"),
        (stepped(4, 30, forward_s=0.01), "no step event carries forward_s and data_s, which are compared"),
        (stepped(1, 30, **TIMED), "the job has one rank: there is no other rank to compare it with"),
        (stepped(4, 5, **TIMED), "the run ended before the ranks had logged enough steps to compare"),
    ],
    ids=["no-steps", "untimed", "forward-only", "one-rank", "too-short"],
)
def test_a_run_in_which_no_window_was_compared_is_not_judged_and_says_why(state: JobState, why: str) -> None:
    """Such a run's summary said nothing of stragglers, and its report "no rank or node was slower"."""
    summary = summarize(state, started_at=10.0, ended_at=60.0, outcome="finished")
    assert summary["stragglers"] == [] and summary["stragglers_not_judged"].startswith(why)
    assert f"stragglers: not judged: {why}" in format_summary(summary)


def test_a_run_whose_windows_were_compared_and_found_even_has_a_verdict() -> None:
    summary = summarize(stepped(4, 30, **TIMED), started_at=10.0, ended_at=60.0, outcome="finished")
    assert (summary["stragglers"], summary["stragglers_not_judged"]) == ([], None)
    assert "stragglers" not in format_summary(summary)


def test_ranks_that_all_saved_on_a_stop_signal_end_the_watch_as_preempted_not_failed(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"  # launch scripts run by hand: no runner, only the ranks' events
    (run_dir / "events").mkdir(parents=True)
    for rank in (0, 1):
        lines = [
            event(rank, "started", 10.0, world_size=2),
            event(rank, "step", 20.0, step=8, loss=1.0),
            event(rank, "preempted", 21.0, step=8, signal="SIGUSR1"),
        ]
        (run_dir / "events" / f"rank-{rank}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    folder = RunFolder(run_dir, clock=lambda: 50.0)
    assert folder.tick() == "preempted"
    assert folder.state.state(0) == "preempted"
    assert folder.summary is not None and folder.summary["preempted"] == {"step": 8, "signal": "SIGUSR1"}
    assert "preempted at step 8 (SIGUSR1), checkpoint saved" in format_summary(folder.summary)


def test_ranks_waiting_for_one_still_starting_are_no_hang_until_it_started() -> None:
    now = [40.0]
    state = JobState(3, hang_after=10, clock=lambda: now[0])
    for rank in (0, 1):  # in their first collective, waiting for rank 2 (slow to import, to load its data)
        state.ingest(event(rank, "started", 10.0, world_size=3))
        state.ingest(event(rank, "heartbeat", 39.0, step=0))
    assert not state.stalled()  # the start-up deadline names rank 2 if it never comes
    state.ingest(event(2, "started", 39.5, world_size=3))
    now[0] = 50.0
    for rank in range(3):
        state.ingest(event(rank, "heartbeat", 49.0, step=0))
    assert state.stalled()
