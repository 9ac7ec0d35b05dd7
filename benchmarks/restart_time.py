"""How long from a rank's death to the first step after the resume: `run --restarts` against a restart by hand.

Renders a CPU torchrun project (2 nodes x 2 processes on this host: the manual
engine), kills the last rank with SIGKILL once node 0 and the last node wrote a
checkpoint, and times from the kill to the first step event of the resumed job:

- `npu-wizard run --restarts 1`: the runner notices, stops every node, waits its
  backoff, checks the node and starts the job again by itself;
- by hand with torchrun: the launch scripts started bare; on the kill, a script
  as quick as a person never is waits for the launchers to end (stopping what is
  left after 10 s), finds the newest checkpoint in checkpoints/ and starts every
  node's launch script again (train.py resumes from it). No reaction time is
  counted for the person: the figure is the floor of a restart by hand.

Both resume from the newest checkpoint every rank can load; each job is its own
project (its own checkpoints). Prints the median of --rounds of each.

    python benchmarks/restart_time.py [--rounds 3]
    python benchmarks/restart_time.py --smoke   # one round, 1 node x 2 processes (tests/test_benchmarks_smoke.py)
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.runs import (  # noqa: E402
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

START_S = 300


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


def with_restarts(project: Path, nodes: int, world: int) -> float:
    """`npu-wizard run --restarts 1`; seconds from the kill to the first step after the resume."""
    runner = start_runner(project, "--interval", "5", "--restarts", "1")
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
        raise SystemExit(f"npu-wizard run --restarts 1 exited {runner.returncode}:\n{output[-3000:]}")
    resumed = first_step_after(run_dir, killed)
    if resumed is None:
        raise SystemExit("the restarted job wrote no step event")
    return resumed - killed


def by_hand(project: Path, nodes: int, world: int) -> float:
    """The launch scripts bare, restarted by a script on the kill; seconds from the kill to the first step after."""
    first = project / "runs" / "by-hand-1"
    second = project / "runs" / "by-hand-2"
    processes = start_nodes(project, node_env(first))
    try:
        victim = wait_for(lambda: ready_victim(first, nodes, world), START_S, "a checkpoint on every node")
        killed = time.time()
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 10  # stop: the launchers end by themselves, else they are made to
        while time.monotonic() < deadline and any(p.poll() is None for p in processes):
            time.sleep(0.05)
        kill_groups(processes)
        newest = max((project / "checkpoints").glob("step-*.pt"))  # find the checkpoint: train.py loads it
        processes = start_nodes(project, node_env(second))  # relaunch every node
        resumed = wait_for(lambda: first_step_after(second, killed), START_S, f"a step after resuming from {newest}")
        for process in processes:
            process.communicate(timeout=2 * START_S)
    finally:
        kill_groups(processes)
    return resumed - killed


def main() -> None:
    """Time both restarts over a few rounds and print them side by side."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--samples", type=int, default=65536)
    parser.add_argument("--smoke", action="store_true", help="one round, 1 node x 2 processes, a short job")
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.nodes, args.samples = 1, 1, 8192
    world = args.nodes * 2
    timed: dict[str, list[float]] = {"restarts": [], "by hand": []}
    with tempfile.TemporaryDirectory(prefix="restart-time-") as folder:
        for round_number in range(args.rounds):
            for name, restart in (("restarts", with_restarts), ("by hand", by_hand)):
                base = Path(folder) / f"{name.replace(' ', '-')}-{round_number}"
                project = render_cpu(
                    base, "torchrun", nodes=args.nodes, samples=args.samples, epochs=1, checkpoint_every=8
                )
                seconds = restart(project, args.nodes, world)
                timed[name].append(seconds)
                print(f"round {round_number + 1}: {name}: {seconds:.1f} s", flush=True)
    ours, hand = statistics.median(timed["restarts"]), statistics.median(timed["by hand"])
    print(f"{args.nodes} node(s) x 2 processes, torchrun on the CPU, {args.rounds} round(s), median:")
    print(f"npu-wizard run --restarts 1 (manual engine): {ours:.1f} s from the kill to the first step after the resume")
    print(f"by hand with torchrun (stop, find the checkpoint, relaunch; no reaction time): {hand:.1f} s")
    print(f"--restarts / by hand: {ours / hand:.2f}")


if __name__ == "__main__":
    main()
