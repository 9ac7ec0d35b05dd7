"""How long from a rank's death to the first step after the resume: `run --restarts` against a restart by hand.

Renders a CPU torchrun project (2 nodes x 2 processes, --devices), kills the last rank
with SIGKILL once node 0 and the last node wrote a checkpoint, and times from
the kill to the first step event of the resumed job, on two engines:

- manual: both nodes on this host (127.0.0.1);
- ssh: one node on each of the two network-namespace hosts of the tests, each
  with its own sshd (tests/ssh_hosts.py); the rank killed runs on the second.

Against, on each engine:

- `npu-wizard run --restarts 1`: the runner notices, stops every node, waits its
  backoff, checks the node(s) and starts the job again by itself;
- by hand with torchrun: the launch scripts started bare (manual: here; ssh:
  each on its host over ssh); on the kill, a script as quick as a person never
  is waits for the launchers to end (stopping what is left after 10 s: here by
  process group; over ssh, every process of the run on every host), finds the
  newest checkpoint in checkpoints/ (over ssh: on node 0's host) and starts
  every node's launch script again (train.py resumes from it). No reaction time
  is counted for the person: the figure is the floor of a restart by hand.

Both resume from the newest checkpoint every rank can load; each job is its own
project (its own checkpoints). Prints the median of --rounds of each. The ssh
engine needs root and sshd, ssh, rsync and ip (as tests/test_ssh_engine.py);
without them its lines say skipped and why.

    python benchmarks/restart_time.py [--rounds 3] [--engine manual|ssh]   # both engines by default
    python benchmarks/restart_time.py --smoke   # manual, 1 round, 1 node x 1 process (test_benchmarks_smoke)
    python benchmarks/restart_time.py --smoke --engine ssh   # one round, 2 hosts x 1 process, a short job
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.runs import (  # noqa: E402
    BIN,
    events_of,
    kill_groups,
    kinds,
    node_env,
    render_cpu,
    run_dirs,
    start_nodes,
    start_runner,
    wait_for,
)
from tests.ssh_hosts import SshHosts, have_ssh_hosts, ssh_hosts  # noqa: E402

START_S = 300
STOP_S = 10  # how long the person waits for the launchers to end by themselves before stopping them


def ready_victim(run_dir: Path, nodes: int, world: int) -> int | None:
    """The last rank's pid once node 0 and the last node wrote a checkpoint (every rank can load it), else None."""
    found = events_of(run_dir)
    savers = (0, world - world // nodes)  # each node's local rank 0 saves
    if not all(kinds(found.get(rank, []), "checkpoint") for rank in savers):
        return None
    started = kinds(found.get(world - 1, []), "started")
    return started[-1]["pid"] if started else None


def first_step_after(run_dir: Path, moment: float) -> float | None:
    """The first step event of a rank started after `moment` (the resumed job's first step), else None.

    A surviving rank may still log a step of the dead job after the kill: only a rank's steps after its
    `started` event of the resumed job count.
    """
    times = []
    for events in events_of(run_dir).values():
        starts = [i for i, e in enumerate(events) if e.get("event") == "started" and e["time"] > moment]
        if starts:
            times += [e["time"] for e in kinds(events[starts[0] :], "step")]
    return min(times) if times else None


def wait_ended(processes: list[subprocess.Popen[bytes]], seconds: float) -> None:
    """Wait up to `seconds` for every process to end by itself."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(p.poll() is None for p in processes):
        time.sleep(0.05)


class Engine:
    """The manual engine: every node here; by hand, the launch scripts started and stopped by process group."""

    name = "manual"

    def answers(self) -> dict[str, object]:
        return {}

    def runner_env(self, project: Path) -> dict[str, str]:
        return node_env(project / "runs" / "unused")

    def start(self, project: Path, run_dir: Path) -> list[subprocess.Popen[bytes]]:
        return start_nodes(project, node_env(run_dir))

    def stop(self, project: Path, run_dir: Path, processes: list[subprocess.Popen[bytes]]) -> None:
        wait_ended(processes, STOP_S)  # the launchers end by themselves, else they are made to
        kill_groups(processes)

    def newest_checkpoint(self, project: Path) -> str:
        return max((project / "checkpoints").glob("step-*.pt")).name


class SshEngine(Engine):
    """The ssh engine on the namespace hosts; by hand, each node's launch script run on its host over ssh."""

    name = "ssh"

    def __init__(self, hosts: SshHosts) -> None:
        self.hosts = hosts

    def answers(self) -> dict[str, object]:
        addresses = self.hosts.addresses
        return {"cluster.engine": "ssh", "network.host_ips": addresses, "network.master_addr": addresses[0]}

    def runner_env(self, project: Path) -> dict[str, str]:
        return node_env(project / "runs" / "unused", NPU_WIZARD_SSH_COMMAND=self.hosts.ssh_command)

    def ssh(self, host: str, command: str, **popen: object) -> subprocess.Popen[bytes]:
        return subprocess.Popen([*shlex.split(self.hosts.ssh_command), host, command], **popen)  # type: ignore[call-overload]

    def start(self, project: Path, run_dir: Path) -> list[subprocess.Popen[bytes]]:
        """`ssh HOST 'cd PROJECT && bash launch/nodeK.sh'` for every node (the project is where it is here)."""
        env = {"NPU_WIZARD_RUN_DIR": str(run_dir), "NPU_WIZARD_HEARTBEAT_S": "1", "PYTHON": sys.executable}
        assignments = " ".join(f"{key}={shlex.quote(value)}" for key, value in env.items())
        return [
            self.ssh(
                host,
                f'cd {shlex.quote(str(project))} && exec env {assignments} PATH={shlex.quote(BIN)}:"$PATH" '
                f"bash launch/node{node}.sh",
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            for node, host in enumerate(self.hosts.addresses)
        ]

    def stop(self, project: Path, run_dir: Path, processes: list[subprocess.Popen[bytes]]) -> None:
        """Wait for the sessions to end, then kill every process of the run left on every host, over ssh."""
        wait_ended(processes, STOP_S)
        needle = shlex.quote(f"NPU_WIZARD_RUN_DIR={run_dir}")
        sweep = (
            f"for f in $(grep -lzxF {needle} /proc/[0-9]*/environ 2>/dev/null); do "
            'p="${f#/proc/}"; kill -KILL "${p%/*}" 2>/dev/null; done; true'
        )
        sweeps = [self.ssh(host, sweep, stdin=subprocess.DEVNULL) for host in self.hosts.addresses]
        for process in sweeps:
            process.wait(timeout=60)
        kill_groups(processes)  # the ssh clients, which end with their remote command

    def newest_checkpoint(self, project: Path) -> str:
        """`ls` of checkpoints/ on node 0's host."""
        folder = shlex.quote(str(project / "checkpoints"))
        listed = self.ssh(self.hosts.addresses[0], f"ls -1 {folder}", stdout=subprocess.PIPE, text=True)
        names, _ = listed.communicate(timeout=60)
        return max((name for name in names.split() if name.startswith("step-")), key=lambda n: int(n[5:-3]))


def with_restarts(engine: Engine, project: Path, nodes: int, world: int) -> float:
    """`npu-wizard run --restarts 1`; seconds from the kill to the first step after the resume."""
    runner = start_runner(project, "--interval", "5", "--restarts", "1", env=engine.runner_env(project))
    try:
        run_dir = wait_for(lambda: run_dirs(project), 60, "the run folder")[0]
        victim = wait_for(lambda: ready_victim(run_dir, nodes, world), START_S, "a checkpoint on every node")
        killed = time.time()
        os.kill(victim, signal.SIGKILL)
        output, _ = runner.communicate(timeout=2 * START_S)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.communicate()
    if runner.returncode != 0:
        raise SystemExit(f"npu-wizard run --restarts 1 ({engine.name}) exited {runner.returncode}:\n{output[-3000:]}")
    resumed = first_step_after(run_dir, killed)
    if resumed is None:
        raise SystemExit("the restarted job wrote no step event")
    return resumed - killed


def by_hand(engine: Engine, project: Path, nodes: int, world: int) -> float:
    """The launch scripts bare, restarted by a script on the kill; seconds from the kill to the first step after."""
    first = project / "runs" / "by-hand-1"
    second = project / "runs" / "by-hand-2"
    current, processes = first, engine.start(project, first)
    try:
        victim = wait_for(lambda: ready_victim(first, nodes, world), START_S, "a checkpoint on every node")
        killed = time.time()
        os.kill(victim, signal.SIGKILL)
        engine.stop(project, first, processes)  # stop what is left
        newest = engine.newest_checkpoint(project)  # find the checkpoint: train.py loads it
        current, processes = second, engine.start(project, second)  # relaunch every node
        resumed = wait_for(lambda: first_step_after(second, killed), START_S, f"a step after resuming from {newest}")
        for process in processes:
            process.communicate(timeout=2 * START_S)
    finally:
        engine.stop(project, current, processes)
    return resumed - killed


def time_engine(
    engine: Engine, folder: Path, rounds: int, nodes: int, samples: int, devices: int = 2
) -> tuple[float, float]:
    """Both restarts on `engine`, `rounds` times; the medians (--restarts, by hand), each round printed."""
    timed: dict[str, list[float]] = {"restarts": [], "by hand": []}
    restarts: dict[str, Callable[[Engine, Path, int, int], float]] = {"restarts": with_restarts, "by hand": by_hand}
    for round_number in range(rounds):
        for name, restart in restarts.items():
            base = folder / f"{engine.name}-{name.replace(' ', '-')}-{round_number}"
            project = render_cpu(
                base,
                "torchrun",
                nodes=nodes,
                devices_per_node=devices,
                answers=engine.answers(),
                samples=samples,
                epochs=1,
                checkpoint_every=8,
            )
            seconds = restart(engine, project, nodes, nodes * devices)
            timed[name].append(seconds)
            print(f"{engine.name} engine, round {round_number + 1}: {name}: {seconds:.1f} s", flush=True)
    return statistics.median(timed["restarts"]), statistics.median(timed["by hand"])


def report(engine: str, nodes: int, rounds: int, ours: float, hand: float, devices: int = 2) -> None:
    """The engine's medians and their ratio."""
    where = "on this host" if engine == "manual" else "one node on each of 2 hosts over ssh"
    processes = f"{devices} process{'es' if devices > 1 else ''}"
    print(f"{engine} engine: {nodes} node(s) x {processes} ({where}), torchrun on the CPU, {rounds} round(s), median:")
    print(
        f"npu-wizard run --restarts 1 ({engine} engine): {ours:.1f} s from the kill to the first step after the resume"
    )
    if engine == "manual":
        print(f"by hand with torchrun (stop, find the checkpoint, relaunch; no reaction time): {hand:.1f} s")
    else:
        print(
            "by hand with torchrun over ssh (stop what is left on every host, find the checkpoint, relaunch every "
            f"node's launch script over ssh; no reaction time): {hand:.1f} s"
        )
    print(f"--restarts / by hand ({engine} engine): {ours / hand:.2f}", flush=True)


def main() -> None:
    """Time both restarts on each engine over a few rounds and print them side by side."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--engine", choices=("manual", "ssh"), help="one engine (default: both; --smoke: manual)")
    parser.add_argument("--nodes", type=int, default=2, help="nodes of the manual engine's job (ssh: 2, one a host)")
    parser.add_argument("--samples", type=int, default=65536)
    parser.add_argument("--devices", type=int, default=2, help="processes per node (--smoke: 1)")
    parser.add_argument("--smoke", action="store_true", help="one round, a short job, 1 process a node; manual: 1 node")
    args = parser.parse_args()
    if args.smoke:
        # one rank a node: the killed rank is the node's only one, and the restart (stop every node, find the
        # checkpoint, start again) runs the same steps; 4 torch processes to start and kill in place of 8. The
        # rank's 256 steps are as many as each of 2 ranks had of 8192 samples
        args.rounds, args.samples, args.devices = 1, 4096, 1
        args.nodes = 1 if args.engine != "ssh" else 2
        # torchrun gives each of 2+ ranks a node OMP_NUM_THREADS=1: a lone rank would take a thread per core, and on
        # a busy machine its tiny steps would spin, not train (16 CPU s for the resumed job's steps)
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    engines = [args.engine] if args.engine else (["manual"] if args.smoke else ["manual", "ssh"])
    figures: list[tuple[str, int, float, float]] = []
    with tempfile.TemporaryDirectory(prefix="restart-time-") as scratch, ExitStack() as stack:
        folder = Path(scratch)
        for name in engines:
            if name == "manual":
                timed = time_engine(Engine(), folder, args.rounds, args.nodes, args.samples, args.devices)
                figures.append((name, args.nodes, *timed))
            elif not have_ssh_hosts():
                figures.append((name, 2, 0.0, 0.0))
            else:
                (folder / "hosts").mkdir()
                hosts = stack.enter_context(ssh_hosts(folder / "hosts"))  # the sshd stopped by PID, namespaces removed
                timed = time_engine(SshEngine(hosts), folder, args.rounds, 2, args.samples, args.devices)
                figures.append((name, 2, *timed))
    for name, nodes, ours, hand in figures:
        if hand:
            report(name, nodes, args.rounds, ours, hand, args.devices)
        else:
            print(f"{name} engine: skipped: needs root, sshd, ssh, rsync and ip (the hosts of tests/ssh_hosts.py)")


if __name__ == "__main__":
    main()
