"""`npu-wizard run`: start a rendered project's launch scripts and follow its ranks.

This is the plain-text runner: it starts this node's launch script (or every
node's, when all of them are simulated on this host), prints one progress line
per interval from the ranks' event files, stops every process of the job when
one node fails, and names the root cause: the first rank to fail.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from wizard.answers import Answers, load_text
from wizard.errors import TargetError, WizardError
from wizard.spec import is_loopback

GRACE_SECONDS = 5.0


class RunFailed(WizardError):
    """The training job failed; the message names the root cause."""

    exit_code = 3


@dataclass
class NodeProcess:
    """One node's launch script, started in its own process group."""

    node: int
    process: subprocess.Popen[bytes]

    def stop(self, sig: int) -> None:
        """Send `sig` to every process of this node's group."""
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass


@dataclass
class JobView:
    """What the event files say about the job, summed up for one progress line."""

    events: dict[int, list[dict]] = field(default_factory=dict)

    def last(self, rank: int, kind: str) -> dict | None:
        """The newest event of `kind` from `rank`."""
        return next((e for e in reversed(self.events.get(rank, [])) if e.get("event") == kind), None)

    def first_error(self) -> dict | None:
        """The earliest error event of any rank: the root cause."""
        errors = [e for rank_events in self.events.values() for e in rank_events if e.get("event") == "error"]
        return min(errors, key=lambda e: e.get("time", 0.0), default=None)

    def progress_line(self, world_size: int, elapsed: float) -> str:
        """One line: step, epoch, loss, throughput and how many ranks run or finished."""
        steps = [s for s in (self.last(r, "step") for r in self.events) if s]
        finished = sum(1 for r in self.events if self.last(r, "finished"))
        started = len(self.events)
        head = f"[{elapsed:6.1f}s] ranks started {started}/{world_size}, finished {finished}/{world_size}"
        if not steps:
            return head
        newest = max(steps, key=lambda s: s.get("step", 0))
        throughput = sum(s.get("samples_per_s", 0.0) for s in steps)
        return (
            f"{head} | step {newest.get('step')} epoch {newest.get('epoch')} "
            f"loss {newest.get('loss', float('nan')):.4f} | {throughput:,.0f} samples/s"
        )


def read_view(run_dir: Path) -> JobView:
    """Read every rank's events from the run folder."""
    from runtime.events import read_events

    return JobView(read_events(run_dir))


def nodes_to_start(answers: Answers, node: int | None) -> list[int]:
    """This node, or every node when all of them are loopback (simulated here)."""
    if node is not None:
        if not 0 <= node < answers["nodes"]:
            raise TargetError(f"--node {node}: this project has nodes 0 to {answers['nodes'] - 1}")
        return [node]
    if all(is_loopback(ip) for ip in answers["network.host_ips"]):
        return list(range(answers["nodes"]))
    raise TargetError("the nodes are separate hosts: run this on each node with --node N (node 0 on the master)")


def new_run_dir(project: Path) -> Path:
    """A fresh run folder under the project's runs/."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for suffix in range(1000):
        candidate = project / "runs" / (stamp if suffix == 0 else f"{stamp}-{suffix}")
        if not candidate.exists():
            candidate.mkdir(parents=True)
            return candidate
    raise TargetError(f"cannot make a run folder under {project / 'runs'}")


def load_project(project: Path) -> Answers:
    """The answers a rendered project was made from."""
    answers_file = project / "answers.yaml"
    if not answers_file.is_file():
        raise TargetError(f"{project} is not an npu-wizard project (no answers.yaml); render one with --answers")
    return load_text(answers_file.read_text())


def run_project(
    project: Path,
    *,
    node: int | None = None,
    interval: float = 2.0,
    out: TextIO = sys.stdout,
    env: dict[str, str] | None = None,
    train_args: Sequence[str] = (),
    clock: Callable[[], float] = time.monotonic,
) -> Path:
    """Run the project's launch scripts to the end; return the run folder or raise RunFailed."""
    project = project.resolve()
    answers = load_project(project)
    nodes = nodes_to_start(answers, node)
    run_dir = new_run_dir(project)
    child_env = {**os.environ, **(env or {}), "NPU_WIZARD_RUN_DIR": str(run_dir)}
    print(f"run folder: {run_dir}", file=out)
    print(f"starting node{'s' if len(nodes) > 1 else ''} {', '.join(map(str, nodes))} of {answers['nodes']}", file=out)
    start = clock()
    started = [
        NodeProcess(
            n,
            subprocess.Popen(
                ["bash", str(project / "launch" / f"node{n}.sh"), *train_args], env=child_env, start_new_session=True
            ),
        )
        for n in nodes
    ]
    try:
        failed = _follow(started, run_dir, answers.world_size, interval, out, start, clock)
    except KeyboardInterrupt:
        _stop_all(started)
        raise
    if failed is not None:
        _stop_all(started)
        raise RunFailed(_root_cause(read_view(run_dir), failed, run_dir))
    view = read_view(run_dir)
    print(view.progress_line(answers.world_size, clock() - start), file=out)
    print(f"finished in {clock() - start:.1f}s; events and logs in {run_dir}", file=out)
    if "--smoke" in train_args:  # the per-rank smoke report: wizard/smoke.py
        from wizard.smoke import print_smoke_report

        print_smoke_report(run_dir, answers.world_size, out)
    return run_dir


def _follow(
    started: Sequence[NodeProcess],
    run_dir: Path,
    world_size: int,
    interval: float,
    out: TextIO,
    start: float,
    clock: Callable[[], float],
) -> NodeProcess | None:
    next_line = start + interval
    while True:
        failed = next((n for n in started if n.process.poll() not in (None, 0)), None)
        if failed is not None:
            return failed
        if all(n.process.poll() == 0 for n in started):
            return None
        if clock() >= next_line:
            print(read_view(run_dir).progress_line(world_size, clock() - start), file=out, flush=True)
            next_line += interval
        time.sleep(0.1)


def _stop_all(started: Sequence[NodeProcess]) -> None:
    for node in started:
        node.stop(signal.SIGTERM)
    deadline = time.monotonic() + GRACE_SECONDS
    for node in started:
        try:
            node.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        node.stop(signal.SIGKILL)
        node.process.wait()


def _root_cause(view: JobView, failed: NodeProcess, run_dir: Path) -> str:
    code = failed.process.returncode
    error = view.first_error()
    if error is None:
        return (
            f"node {failed.node}'s launch script exited with code {code} before any rank reported an error; "
            f"see {run_dir / 'logs' / f'node-{failed.node}.log'}"
        )
    rank = error.get("rank")
    lines = [f"rank {rank} failed first: {error.get('type')}: {error.get('message')}"]
    log = run_dir / "logs" / f"rank-{rank}.log"
    if log.is_file():
        tail = log.read_text(errors="replace").splitlines()[-10:]
        lines += [f"last lines of {log}:"] + [f"  | {line}" for line in tail]
    return "\n".join(lines)
