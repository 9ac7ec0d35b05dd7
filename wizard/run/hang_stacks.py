"""At a hang, before anything is stopped: where every rank is, written to RUN/hang/.

The runner asks every rank "stacks" on the status stream (runtime/stacks.py
answers from a thread of the rank: its threads' stacks and its last
collectives) and waits ANSWER_WAIT_S for the answers. Each rank that answered
gets hang/rank-N.json (its record and "answered": true), hang/rank-N.txt (the
record as text) and hang/rank-N.fr.json (the flight recorder's own dump). A
rank that did not answer (a thread holds the GIL, the process is stopped or in
uninterruptible sleep) gets hang/rank-N.json with "answered": false, its host
and pid, its process state where the runner can read it, and the C-level
stacks its faulthandler writes on SIGUSR2 where the signal can be sent: the
runner sends it to this host's ranks, and to a rank on another host where the
engine can run a command there (`Engine.probe_rank`). hang/collected.json
says when, why, and which ranks answered. Every file is bounded in size, and
written relative to hang/ opened once (wizard/monitor/safe_folder.py): a link or a
file planted in its place is refused, never written through.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.events import ENV_RUN_DIR
from runtime.stacks import ASK, FAULT_SIGNAL, as_text, ask_hccl_dump, fault_path
from wizard.monitor.run_files import RunFileError, read_tail
from wizard.monitor.safe_folder import Folder
from wizard.run.hang_record_size import bounded_record
from wizard.run.intake import Intake

HANG_DIR = "hang"
COLLECTED = "collected.json"
ASK_FILE = "ask"  # RUN/hang/ask: `npu-wizard monitor RUN --stacks` asks the runner for a collection
MAX_ASK_FILE_BYTES = 4096
ANSWER_WAIT_S = 10.0  # a rank waiting in a collective answers at once; a loaded host may take seconds
FAULT_WAIT_S = 2.0  # for faulthandler to write after SIGUSR2
PROBE_BUDGET_S = 30.0  # for probing every silent rank of one collection
HCCL_PIPE_ENV = "TORCH_HCCL_DEBUG_INFO_PIPE_FILE"
MAX_ENVIRON_BYTES = 1 << 20
NOT_THIS_RUN = "not-this-run"  # what Engine.probe_rank's command says for a pid that is another process now
MAX_TEXT_BYTES = 1 << 20
MAX_DUMP_BYTES = 1 << 20
MAX_FAULT_BYTES = 64 * 1024
PROC = Path("/proc")
# /proc/PID/stat's state letters, as ps(1) names them
STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "disk sleep",
    "T": "stopped",
    "t": "tracing stop",
    "Z": "zombie",
    "X": "dead",
    "I": "idle",
}


@dataclass
class Unanswered:
    """What the runner could still learn of a rank that did not answer."""

    state: str | None = None  # "T (stopped)", ...
    faulthandler: str | None = None
    note: str | None = None


def process_state(pid: int) -> str | None:
    """The state of `pid` as /proc/PID/stat says it, e.g. "T (stopped)"; None where there is no such process."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    letter = text.rpartition(")")[2].split()[:1]
    if not letter:
        return None
    return f"{letter[0]} ({STATES.get(letter[0], 'unknown')})"


def catches(pid: int, signum: int) -> bool:
    """Whether `pid` has a handler for `signum` (its SigCgt mask): else the signal would end it."""
    try:
        for line in (PROC / str(pid) / "status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        return False
    return False


def probe_local(run_dir: Path, rank: int, pid: int, wait_s: float = FAULT_WAIT_S) -> Unanswered:
    """This host's rank `pid`: its state, and its faulthandler's stacks after SIGUSR2 where it can take it."""
    state = process_state(pid)
    if state is None:
        return Unanswered(note=f"process {pid} is gone")
    if not of_run(run_dir, pid):
        return Unanswered(
            state,
            note=f"process {pid} is not this run's (its environment names no {ENV_RUN_DIR}={run_dir}): not signalled",
        )
    if not catches(pid, FAULT_SIGNAL):
        return Unanswered(state, note=f"process {pid} has no handler for SIGUSR2: not sent (it would end it)")
    path = fault_path(run_dir, rank)
    before = _size(path)
    try:
        os.kill(pid, FAULT_SIGNAL)
    except OSError as error:
        return Unanswered(state, note=f"cannot signal process {pid} ({error.strerror})")
    if state.startswith(("T", "t")):
        return Unanswered(
            state,
            note="stopped: SIGUSR2 was sent and waits until the process is continued (SIGCONT); it was not resumed",
        )
    pipe = hccl_dump_asked(rank, pid)  # an HCCL rank's recorder, dumped by torch_npu's own thread
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and _size(path) <= before:
        time.sleep(0.1)
    time.sleep(0.2)  # faulthandler writes thread after thread
    note = "SIGUSR2 sent: faulthandler's stacks follow" + (f"; {pipe}" if pipe else "")
    return Unanswered(state, faulthandler=_new_text(path, before), note=note)


def of_run(run_dir: Path, pid: int) -> bool:
    """Whether `pid`'s environment names `run_dir` (a rank's does): a pid once reported may be another process now."""
    named = process_environment(pid).get(ENV_RUN_DIR)
    return bool(named) and (named == str(run_dir) or os.path.realpath(named) == os.path.realpath(run_dir))


def hccl_dump_asked(rank: int, pid: int) -> str | None:
    """Where the rank runs torch_npu's recorder with a dump pipe (its environment says so), ask it for a dump.

    torch_npu's monitor thread reads the pipe and dumps the HCCL collectives to TORCH_HCCL_DEBUG_INFO_TEMP_FILE
    + rank, but symbolizing the stacks takes the GIL: a rank whose thread holds the GIL may dump late or not
    at all. None where the rank has no such pipe.
    """
    env = process_environment(pid)
    prefix = env.get(HCCL_PIPE_ENV)
    if not prefix:
        return None
    if not os.path.isabs(prefix):  # relative to the rank's own folder
        try:
            cwd = os.readlink(PROC / str(pid) / "cwd")
        except OSError:
            return None
        env = {**env, HCCL_PIPE_ENV: os.path.join(cwd, prefix)}
    return ask_hccl_dump(rank, env)


def process_environment(pid: int) -> dict[str, str]:
    """The environment `pid` started with (bounded), or {} where it cannot be read."""
    try:
        with (PROC / str(pid) / "environ").open("rb") as handle:
            raw = handle.read(MAX_ENVIRON_BYTES)
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {key.decode(errors="replace"): value.decode(errors="replace") for key, value in pairs}


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _new_text(path: Path, before: int) -> str | None:
    grown = _size(path) - before
    if grown <= 0:
        return None
    try:
        data = read_tail(path, min(grown, MAX_FAULT_BYTES))
    except RunFileError:
        return None
    return data.decode("utf-8", "replace") if data else None


def wait_for_answers(
    received: Callable[[], dict[int, dict[str, Any]]],
    ranks: Iterable[int],
    wait_s: float = ANSWER_WAIT_S,
    on_progress: Callable[[int, int], None] | None = None,
) -> dict[int, dict[str, Any]]:
    """Poll `received` until every rank of `ranks` answered or `wait_s` passed; return the answers."""
    wanted = set(ranks)
    deadline = time.monotonic() + wait_s
    answers = received()
    while not wanted <= set(answers) and time.monotonic() < deadline:
        time.sleep(0.1)
        answers = received()
        if on_progress is not None:
            on_progress(len(wanted & set(answers)), len(wanted))
    return answers


def write_rank(folder: Folder, rank: int, record: dict[str, Any]) -> None:
    """hang/rank-N.json, and for an answer hang/rank-N.txt and hang/rank-N.fr.json, each bounded."""
    dump = record.pop("recorder_dump", None)
    folder.write(f"rank-{rank}.json", (bounded_record(record) + "\n").encode())
    if record.get("answered"):
        folder.write(f"rank-{rank}.txt", as_text(record).encode()[:MAX_TEXT_BYTES])
    if isinstance(dump, str):
        folder.write(f"rank-{rank}.fr.json", dump.encode()[-MAX_DUMP_BYTES:])


def answered_record(rank: int, answer: dict[str, Any]) -> dict[str, Any]:
    """A rank's answer as its hang/rank-N.json record."""
    record = {key: value for key, value in answer.items() if key not in ("event", "id", "received")}
    record.update(rank=rank, answered="error" not in answer)
    return record


def unanswered_record(rank: int, host: str | None, pid: int | None, probe: Unanswered) -> dict[str, Any]:
    """The hang/rank-N.json record of a rank that did not answer."""
    return {
        "rank": rank,
        "answered": False,
        "host": host,
        "pid": pid,
        "state": probe.state,
        "faulthandler": probe.faulthandler,
        "note": probe.note,
    }


def write_collected(
    folder: Folder, reason: str, records: dict[int, dict[str, Any]], asked_at: float, asked_id: str | None = None
) -> None:
    """hang/collected.json: when, why (and for which ask), and which ranks answered."""
    collected = {
        "time": time.time(),
        "asked_at": asked_at,
        "reason": reason,
        "asked_id": asked_id,
        "ask": ASK,
        "ranks": sorted(records),
        "answered": sorted(rank for rank, record in records.items() if record.get("answered")),
        "not_answered": sorted(rank for rank, record in records.items() if not record.get("answered")),
    }
    folder.write(COLLECTED, (json.dumps(collected, indent=2, default=str) + "\n").encode())


Probe = Callable[[int, "str | None", int], "Unanswered | None"]  # (rank, host, pid): another host's rank


def collect(
    run_dir: Path,
    intake: Intake,
    ranks: Iterable[int],
    reason: str,
    probe_remote: Probe,
    wait_s: float = ANSWER_WAIT_S,
    on_progress: Callable[[int, int], None] | None = None,
    asked_id: str | None = None,
    probe_budget_s: float = PROBE_BUDGET_S,
) -> dict[int, dict[str, Any]]:
    """Ask every rank of `ranks` where it is, probe those that do not answer, write RUN/hang/; return the records.

    Probing the silent ranks stops after `probe_budget_s`: the ranks left are said not probed, so a partition
    that silences a whole cluster holds the runner (and the restart, the stop) for seconds, not for minutes.
    """
    ranks = sorted(ranks)
    asked_at = time.time()
    ask_id = intake.ask(ASK)
    answers: dict[int, dict[str, Any]] = {}
    if ask_id is not None:

        def received() -> dict[int, dict[str, Any]]:
            intake.ingest()
            return intake.answers.received(ask_id)

        answers = wait_for_answers(received, ranks, wait_s, on_progress)
        intake.answers.close(ask_id)
    records: dict[int, dict[str, Any]] = {}
    probes_end = time.monotonic() + probe_budget_s  # probes run one after another: many silent ranks share this
    for rank in ranks:
        answer = answers.get(rank)
        if answer is not None and "error" not in answer:
            records[rank] = answered_record(rank, answer)
            continue
        view = intake.state.ranks.get(rank)
        host, pid = (view.host, view.pid) if view is not None else (None, None)
        if pid is None:
            probe = Unanswered(note="it never said its pid to this runner")
        elif time.monotonic() >= probes_end:
            probe = Unanswered(note=f"not probed: the {probe_budget_s:g} s for probing silent ranks were spent")
        elif rank in intake.local_ranks:
            probe = probe_local(run_dir, rank, pid)
        else:
            probe = probe_remote(rank, host, pid) or Unanswered(
                note=f"it runs on {host or 'another host'}: its state is not readable from node 0"
            )
        if answer is not None:
            probe.note = f"it answered with an error: {answer['error']}; {probe.note or ''}".rstrip("; ")
        records[rank] = unanswered_record(rank, host, pid, probe)
    with Folder.open(run_dir / HANG_DIR, make=True) as folder:  # a link or a file in its place is refused
        for name in folder.names():  # a new collection replaces an older one's files
            if name.startswith("rank-") and not stat.S_ISDIR(folder.mode(name) or 0):
                folder.remove(name)
        for rank, record in records.items():
            write_rank(folder, rank, dict(record))
        write_collected(folder, reason, records, asked_at, asked_id)
    for record in records.values():
        record.pop("recorder_dump", None)
    return records


def take_ask(run_dir: Path) -> str | None:
    """The id in RUN/hang/ask, removing the file; None when there is none (or RUN/hang is no folder of its own).

    An ask that is no regular file (a link, a FIFO someone put there) is never followed: it is taken away, for
    no ask id ("").
    """
    try:
        folder = Folder.open(run_dir / HANG_DIR)
    except OSError:  # no hang/, or a link or a file in its place: nothing is asked, nothing acted on through it
        return None
    with folder:
        try:
            data = folder.read(ASK_FILE, MAX_ASK_FILE_BYTES)
        except RunFileError:
            data = b"{}"
        if data is None:
            return None
        folder.remove(ASK_FILE)
    try:
        ask = json.loads(data)
    except ValueError:
        ask = {}
    ask_id = ask.get("id") if isinstance(ask, dict) else None
    return ask_id if isinstance(ask_id, str) and ask_id.isalnum() else ""


def read_probe(stat_line: str, faulthandler: str) -> Unanswered:
    """What `Engine.probe_rank` brought back from another host, as an Unanswered."""
    letter = stat_line.rpartition(")")[2].split()[:1]
    state = f"{letter[0]} ({STATES.get(letter[0], 'unknown')})" if letter else None
    if stat_line == NOT_THIS_RUN:
        return Unanswered(
            note=f"its pid is not this run's process on its host (no {ENV_RUN_DIR} of the run): not signalled"
        )
    if state is None:
        return Unanswered(note="its process is gone from its host")
    note = "SIGUSR2 sent on its host: faulthandler's stacks follow" if faulthandler else None
    if state.startswith(("T", "t")):
        note = "stopped: SIGUSR2 was sent and waits until the process is continued (SIGCONT); it was not resumed"
    return Unanswered(state, faulthandler[-MAX_FAULT_BYTES:] or None, note)
