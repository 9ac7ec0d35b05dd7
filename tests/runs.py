"""Helpers for tests that render a CPU project and run its launch scripts for real."""

from __future__ import annotations

import fcntl
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.events import read_events
from wizard.answers.model import resolve
from wizard.render.render import render

BIN = str(Path(sys.executable).parent)


PORTS_GIVEN = "NPU_WIZARD_TEST_PORTS"
"""The file of every port free_port has given in this run (tests/conftest.py makes it; xdist's workers inherit it)."""

FIXED_MASTER_PORTS = range(29500, 30500)
"""Master ports no test is given: the examples' 29500, and where a Slurm job's master port falls (29500 + job id %
1000, tests/slurm_cluster.py)."""

_given_here: set[int] = set()  # without the file (a run that is not the suite's), this process's own


def free_port(outside: range = range(0), count: int = 2) -> int:
    """A port P with P to P+count-1 free now (a pair unless told), outside the kernel's ephemeral range and `outside`.

    A port from the ephemeral range may be handed to any outgoing connection
    before the job binds it (the very hazard the HCCL port reservation avoids),
    so jobs started by the tests take theirs from below it. `outside` keeps a
    master port out of an HCCL range picked before it (the answers refuse one inside).

    No port is given twice in one run, by any xdist worker: free now is not free when its job binds it, and a
    port another test was given may be bound a moment later (a master port free at render time was once taken
    by another worker's job before the first run started: EADDRINUSE).
    """
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    candidates = list(range(max(1024, low - 12000), low - count + 1))  # the last port below `low`
    random.shuffle(candidates)
    with _ports_given() as given:
        for port in candidates:
            ports = range(port, port + count)
            if any(p in outside or p in FIXED_MASTER_PORTS or p in given for p in ports):
                continue
            if all(_bindable(p) for p in ports):
                given.update(ports)
                return port
    raise RuntimeError(f"no {count} free ports in a row below the ephemeral range")


@contextmanager
def _ports_given() -> Iterator[set[int]]:
    """The ports given in this run so far, under a lock; what the block adds to the set is recorded."""
    path = os.environ.get(PORTS_GIVEN)
    if not path:
        yield _given_here
        return
    with open(path, "a+") as record:
        fcntl.flock(record, fcntl.LOCK_EX)  # released when the file closes
        record.seek(0)
        given = {int(line) for line in record.read().split()}
        before = set(given)
        yield given
        record.write("".join(f"{port}\n" for port in sorted(given - before)))


def hccl_range_from(base: int) -> range:
    """The ports an HCCL range from `base` may take: 64, more than either port count the answers allow (16, 32)."""
    return range(base, base + 64)


def hccl_base_apart_from(port: int) -> int:
    """A free HCCL base port whose range keeps clear of `port` and `port + 1` (a port the test holds, which the
    answers refuse inside the HCCL range)."""
    return free_port(outside=range(port - 63, port + 2))


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def render_cpu(
    tmp_path: Path,
    launcher: str,
    *,
    nodes: int = 1,
    amp: str = "off",
    devices_per_node: int = 2,
    answers: dict[str, Any] | None = None,
    **training: Any,
) -> Path:
    """Render a small CPU project: `nodes` x 2 processes on loopback, a few hundred steps at most.

    `training` sets training.* answers; `answers` any other (dotted names).
    """
    raw: dict[str, Any] = {
        "project_name": f"{launcher}-{nodes}n-{amp}",
        "device": "cpu",
        "nodes": nodes,
        "devices_per_node": devices_per_node,
        "launcher": launcher,
        "amp": amp,
        "network.host_ips": ["127.0.0.1"] * nodes,
        "network.master_port": free_port(),
        "training.samples": 1024,
        "training.batch_size": 16,
        "training.epochs": 2,
        "training.log_every": 4,
        "training.checkpoint_every": 8,
    }
    raw.update({f"training.{key}": value for key, value in training.items()})
    raw.update(answers or {})
    return render(resolve(raw), tmp_path).project_dir


def render_own_one_rank(tmp_path: Path, name: str, script: str, text: str) -> Path:
    """A one-rank CPU project (shell launcher) whose ranks run the user's own `script`, written with `text`."""
    raw = {
        "project_name": name,
        "device": "cpu",
        "nodes": 1,
        "devices_per_node": 1,
        "launcher": "shell",
        "amp": "off",
        "network.master_port": free_port(),
        "training.script": script,
    }
    project = render(resolve(raw), tmp_path).project_dir
    (project / script).write_text(text)
    return project


def npu_wizard_run_plain(project: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`npu-wizard run PROJECT --plain --interval 1 ARGS` to its end, as a user starts it."""
    return subprocess.run(
        [sys.executable, "-m", "wizard", "run", str(project), "--plain", "--interval", "1", *args],
        env=node_env(project / "runs" / "unused"),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def node_env(run_dir: Path, **extra: str) -> dict[str, str]:
    """The environment a user's shell would give the launch scripts, with this venv first on PATH."""
    return {
        **os.environ,
        "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
        "PYTHON": sys.executable,
        "NPU_WIZARD_RUN_DIR": str(run_dir),
        "NPU_WIZARD_HEARTBEAT_S": "1",
        **extra,
    }


def start_nodes(project: Path, env: dict[str, str], output: Any = subprocess.PIPE) -> list[subprocess.Popen[bytes]]:
    """Start every node's launch script at once, each in its own process group.

    Their output goes to a pipe each (wait_nodes reads them), or to `output`, an open file: a test that polls a
    run folder and never reads the pipes must give one, or a node that fills its pipe stops there.
    """
    scripts = sorted((project / "launch").glob("node*.sh"))
    return [
        subprocess.Popen(
            ["bash", str(script)], env=env, start_new_session=True, stdout=output, stderr=subprocess.STDOUT
        )
        for script in scripts
    ]


def wait_nodes(processes: list[subprocess.Popen[bytes]], timeout: float) -> list[tuple[int, str]]:
    """Wait for every node (killing all on timeout); return exit codes and output.

    Every node's pipe is read at once, each by a thread of its own: read one after the other, a node whose output
    outgrew its pipe (64 KiB) while an earlier node was still being waited for would stop at its next write, and
    the job's collectives with it, until the deadline.
    """
    deadline = time.monotonic() + timeout
    chunks: list[list[bytes]] = [[] for _ in processes]

    def drain(process: subprocess.Popen[bytes], into: list[bytes]) -> None:
        if process.stdout is not None:
            while chunk := process.stdout.read1(65536):
                into.append(chunk)

    readers = [
        threading.Thread(target=drain, args=(process, into), daemon=True)
        for process, into in zip(processes, chunks, strict=True)
    ]
    for reader in readers:
        reader.start()
    try:
        for process in processes:
            process.wait(timeout=max(1.0, deadline - time.monotonic()))
        for process, reader, into in zip(processes, readers, chunks, strict=True):
            reader.join(timeout=max(1.0, deadline - time.monotonic()))  # the pipe ends once all its writers have
            if reader.is_alive():  # a process the node started still holds it
                raise subprocess.TimeoutExpired(process.args, timeout, output=b"".join(into))
    except subprocess.TimeoutExpired:
        kill_groups(processes)
        raise
    for process in processes:
        if process.stdout is not None:
            process.stdout.close()
    return [
        (process.returncode, b"".join(into).decode(errors="replace"))
        for process, into in zip(processes, chunks, strict=True)
    ]


def kill_groups(processes: list[subprocess.Popen[bytes]]) -> None:
    """SIGKILL every node's whole process group, as a crash or an OOM killer would."""
    for process in processes:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for process in processes:
        process.wait()
    # the scripts are reaped; wait until the rest of each group is gone too, so that
    # what they held (the master port) is free before a test starts the job again
    deadline = time.monotonic() + 10
    for process in processes:
        while time.monotonic() < deadline:
            try:
                os.killpg(process.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)


def run_project(project: Path, run_dir: Path, timeout: float = 600, **extra: str) -> list[tuple[int, str]]:
    """Run every node of the project to the end; `timeout` is a safety net for a job that never ends.

    A 2 x 2 job that trains in seconds on a quiet host once took 236 s to start its ranks (launchers, torch
    imports, the rendezvous) near the end of a suite run on two cores with stress-ng beside it: 240 s was
    no safety net there.
    """
    return wait_nodes(start_nodes(project, node_env(run_dir, **extra)), timeout)


def events_of(run_dir: Path) -> dict[int, list[dict]]:
    """Every rank's events."""
    return read_events(run_dir)


def kinds(events: list[dict], kind: str) -> list[dict]:
    """The events of one kind."""
    return [event for event in events if event.get("event") == kind]


def start_runner(
    project: Path, *args: str, env: dict[str, str] | None = None, output: Any = subprocess.PIPE
) -> subprocess.Popen[str]:
    """`npu-wizard run PROJECT ARGS` as a user starts it (plain: no terminal), with this venv on PATH.

    Its output (errors with it) goes to a pipe, or to `output` (an open file a test reads while it runs).
    """
    return subprocess.Popen(
        [sys.executable, "-m", "wizard", "run", str(project), "--plain", *args],
        env=env or node_env(project / "runs" / "unused"),
        stdout=output,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_for(predicate: Any, timeout: float, what: str, step: float = 0.1) -> Any:
    """Poll `predicate` until it returns something truthy; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def run_dirs(project: Path) -> list[Path]:
    """The run folders `npu-wizard run` made in the project, oldest first."""
    runs = project / "runs"
    return sorted(p for p in runs.iterdir() if (p / "run.json").is_file()) if runs.is_dir() else []


def started_pid(run_dir: Path, rank: int) -> int | None:
    """The pid of `rank` once it started and logged a step (mid-run), else None."""
    rank_events = events_of(run_dir).get(rank, [])
    if not kinds(rank_events, "step"):
        return None
    return kinds(rank_events, "started")[-1]["pid"]


def leftover_processes(project: Path) -> list[int]:
    """Live processes of any run of the project (their environment names its run folder)."""
    from wizard.monitor.procs import job_processes

    return [pid for run_dir in run_dirs(project) for pid in job_processes(run_dir)]


def processes_in(folder: Path) -> list[int]:
    """Live processes whose working directory lies in `folder` (however they were started)."""
    from wizard.monitor.procs import PROC, is_alive

    found = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = Path(os.readlink(entry / "cwd"))
        except OSError:
            continue
        if cwd.is_relative_to(folder) and is_alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def kill_left_in(folder: Path, timeout: float = 30) -> list[int]:
    """SIGKILL every live process whose working directory lies in `folder`; wait until they are gone.

    A launcher's workers live in sessions of their own (torchrun's do), so killing the launcher's process group
    leaves them running: a test that started a job outside `npu-wizard run` ends what is left of it this way.
    """
    left = processes_in(folder)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while processes_in(folder) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def clean_up(project: Path, *runners: subprocess.Popen[str]) -> None:
    """Kill the runners and whatever of their jobs is left (a failed test must not leak processes)."""
    from wizard.monitor.procs import kill_job

    for runner in runners:
        if runner.poll() is None:
            runner.kill()
        runner.communicate()
    for run_dir in run_dirs(project):
        kill_job(run_dir, grace=0.5)


@dataclass(frozen=True)
class RunEnded:
    """How `npu-wizard run` of a project ended: its exit code, its output, its run folder, and what it left."""

    project: Path
    run_dir: Path
    code: int
    stdout: str
    stderr: str  # empty where the errors were read with the output (interrupt_once_training)
    left: list[int]  # live processes of the job when the runner returned, before any clean-up killed them
    alive_before: list[int] = field(default_factory=list)  # the job's processes when it was interrupted


def run_to_its_end(project: Path, *args: str, timeout: float = 300, **extra: str) -> RunEnded:
    """`npu-wizard run PROJECT --plain ARGS` to its end, its output and errors read apart; `extra`: environment."""
    runner = subprocess.Popen(
        [sys.executable, "-m", "wizard", "run", str(project), "--plain", *args],
        env=node_env(project / "runs" / "unused", **extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = runner.communicate(timeout=timeout)
        left = leftover_processes(project)
    finally:
        clean_up(project, runner)
    (run_dir,) = run_dirs(project)
    return RunEnded(project, run_dir, runner.returncode, stdout, stderr, left)


def interrupt_once_training(project: Path, *args: str, start_s: float = 180) -> RunEnded:
    """`npu-wizard run PROJECT --plain ARGS`, sent SIGINT (Ctrl-C) once rank 0 trains; how it ended."""
    runner = start_runner(project, *args)
    try:
        run_dir = wait_for(lambda: run_dirs(project), start_s, "the run folder")[0]
        wait_for(lambda: started_pid(run_dir, 0), start_s, "rank 0 to train")
        alive_before = leftover_processes(project)
        runner.send_signal(signal.SIGINT)
        # the ranks first get up to the save grace (60 s) to save a checkpoint at their next logged step
        output, _ = runner.communicate(timeout=150)
        left = leftover_processes(project)
    finally:
        clean_up(project, runner)
    return RunEnded(project, run_dir, runner.returncode, output, "", left, alive_before)
