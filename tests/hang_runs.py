"""One real 2 x 2 CPU run that hangs four times on purpose, and the hang/ folder the runner wrote each time.

NPU_WIZARD_REHEARSE (runtime/rehearsal.py, docs/rehearse.md; the user's script
below reads it too) plans the hangs, and its release=FOLDER lets a sleeping
rank go on, so that one run (one start-up of four torch processes) serves
every case of issue 28's proof:

1. "data": every rank stuck in the same data-loading line (step DATA_STEP);
   the runner flags the hang and collects; the test then SIGSTOPs rank
   STOPPED_RANK and lets the others go on, into the next all_reduce;
2. "stopped": asked for on demand by `npu-wizard monitor RUN --stacks` (from
   another process, as a user would): the stopped rank does not answer; the
   test SIGCONTs it;
3. "late": rank LATE_RANK sleeps before the backward of step LATE_STEP:
   it never enters that step's all_reduce, the three others wait in it;
4. "barrier": rank BARRIER_RANK calls a barrier where the others all_reduce
   (step BARRIER_STEP); the test then interrupts the runner.

Each collection's folder is copied aside (hang-data/, hang-stopped/, ...).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.runs import clean_up, events_of, kinds, node_env, run_dirs, start_runner, wait_for

DATA_STEP, LATE_STEP, BARRIER_STEP = 4, 10, 16
LATE_RANK, STOPPED_RANK, BARRIER_RANK = 3, 2, 1
PLAN = f"hang:*:{DATA_STEP}:data,hang:{LATE_RANK}:{LATE_STEP}:sleep,hang:{BARRIER_RANK}:{BARRIER_STEP}:barrier"
HANG_AFTER_S = "6"
START_S = 300  # four torch processes on a loaded two-core machine
PHASE_S = 180
CASES = ("data", "stopped", "late", "barrier")
START_UP_GRACE_S = 3.0
"""A collection asked this soon after the test saw every rank's first step is still a start-up one: the runner
hears of a rank's prints through its heartbeat (each second here) and looks each --interval (1 s). The data hang
is asked HANG_AFTER_S after step 3, well after."""

# A user's own env:// script: plain torch, the same plan read from the same variables
OWN_SCRIPT = '''\
"""A user's own DDP script (env://): a tiny model, a batch loader, a loop that prints its steps."""

import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

RANK = int(os.environ["RANK"])
RELEASE = Path("/nonexistent")
PLAN = {}
for item in os.environ.get("NPU_WIZARD_REHEARSE", "").split(","):
    if item.startswith("release="):
        RELEASE = Path(item.removeprefix("release="))
    _, rank, step, how = (item.split(":") + ["", "", "", ""])[:4]
    if rank in ("*", str(RANK)) and step.isdigit():
        PLAN[int(step)] = how


def wait_for_release(step):
    while not (RELEASE / f"step-{step}").exists():
        time.sleep(0.2)


def load_batch(step):
    if PLAN.get(step) == "data":
        wait_for_release(step)
    return torch.randn(16, 32), torch.randn(16, 1)


def main():
    dist.init_process_group("gloo")
    model = DDP(nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, 1000000):
        inputs, targets = load_batch(step)
        loss = nn.functional.mse_loss(model(inputs), targets)
        if PLAN.get(step) == "sleep":
            wait_for_release(step)
        elif PLAN.get(step) == "barrier":
            dist.barrier()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step} loss {loss.item():.4f}", flush=True)
        time.sleep(0.05)


if __name__ == "__main__":
    main()
'''


@dataclass
class HangRun:
    """The four collections of one run: case -> the copy of its hang/ folder; and how the runner ended."""

    project: Path
    run_dir: Path
    folders: dict[str, Path] = field(default_factory=dict)
    output: str = ""
    code: int | None = None
    training_at: float = math.inf  # when the test saw every rank's first step, plus START_UP_GRACE_S (time.time())
    start_up: set[float] = field(default_factory=set)  # asked_at of each hang collection asked before training_at
    stacks_asked: subprocess.CompletedProcess[str] | None = None  # `npu-wizard monitor RUN --stacks`

    def record(self, case: str, rank: int) -> dict:
        """hang/rank-N.json of `case`."""
        return json.loads((self.folders[case] / f"rank-{rank}.json").read_text())

    def text(self, case: str, rank: int) -> str:
        """hang/rank-N.txt of `case`."""
        return (self.folders[case] / f"rank-{rank}.txt").read_text()

    def collected(self, case: str) -> dict:
        """hang/collected.json of `case`."""
        return json.loads((self.folders[case] / "collected.json").read_text())


def _collected(run_dir: Path) -> dict | None:
    try:
        return json.loads((run_dir / "hang" / "collected.json").read_text())
    except (OSError, ValueError):
        return None


def _training(run_dir: Path) -> bool:
    """Whether every rank made a step: a step event (the generated script), or a printed step (the user's)."""
    events = events_of(run_dir)
    for rank in range(4):
        if kinds(events.get(rank, []), "step"):
            continue
        try:
            if "step 1 " not in (run_dir / "logs" / f"rank-{rank}.log").read_text():
                return False
        except OSError:
            return False
    return True


def _verdicts(said: Path) -> list[str]:
    """The runner's verdict lines so far (WHERE EACH RANK IS: ...)."""
    return [line for line in said.read_text().splitlines() if line.startswith("WHERE EACH RANK IS: ")] or [""]


def _pid(run_dir: Path, rank: int) -> int | None:
    started = kinds(events_of(run_dir).get(rank, []), "started")
    return started[0]["pid"] if started else None


def run_hangs(project: Path, release: Path, *args: str, env: dict[str, str] | None = None) -> HangRun:
    """Run `project` through the four planned hangs (see the module's text) and interrupt it after the last."""
    release.mkdir(parents=True, exist_ok=True)
    base = env or node_env(project / "runs" / "unused")
    env = {**base, "NPU_WIZARD_REHEARSE": f"{PLAN},release={release}"}
    said = project / "runner-output.txt"  # read while it runs: the last verdict is printed before the interrupt
    with said.open("w") as output:
        runner = start_runner(project, "--interval", "1", "--hang-after", HANG_AFTER_S, *args, env=env, output=output)
    stopped: int | None = None
    try:
        run_dir = wait_for(lambda: (run_dirs(project) or [None])[-1], START_S, "the run folder")
        result = HangRun(project, run_dir)
        seen = 0.0

        def observed() -> dict | None:
            """hang/collected.json now; a hang collection asked before training began is noted as a start-up one
            (a later collection replaces the file: it is read every 0.1 s, and collections are seconds apart)."""
            collected = _collected(run_dir)
            if collected is not None and collected["reason"] == "hang" and collected["asked_at"] < result.training_at:
                result.start_up.add(collected["asked_at"])
            return collected

        def training() -> bool:
            observed()
            return _training(run_dir)

        def next_collection(what: str, timeout: float, asked: str | None = None) -> dict:
            def new() -> dict | None:
                if runner.poll() is not None:
                    raise AssertionError(f"the runner ended (code {runner.returncode}) before {what}")
                collected = observed()
                if collected is None or collected["asked_at"] <= seen:
                    return None
                return collected if asked is None or collected.get("asked_id") == asked else None

            return wait_for(new, timeout, what)

        def keep(case: str, collected: dict) -> None:
            nonlocal seen
            seen = collected["asked_at"]
            result.folders[case] = shutil.copytree(run_dir / "hang", run_dir / f"hang-{case}")

        # a user's script is silent while it imports torch: a loaded machine takes longer than HANG_AFTER_S,
        # and the runner rightly collects then; the data hang's collection is the first after training began
        wait_for(training, START_S, "every rank's first step")
        seen = result.training_at = time.time() + START_UP_GRACE_S
        keep("data", next_collection("every rank stuck in loading a batch", PHASE_S))
        stopped = wait_for(lambda: _pid(run_dir, STOPPED_RANK), 10, f"rank {STOPPED_RANK}'s pid")
        os.kill(stopped, signal.SIGSTOP)
        (release / f"step-{DATA_STEP}").touch()
        asking = subprocess.run(
            [sys.executable, "-m", "wizard", "monitor", str(run_dir), "--stacks"],
            env=base,
            capture_output=True,
            text=True,
            timeout=PHASE_S,
        )
        result.stacks_asked = asking
        collected = observed()
        assert collected is not None and collected["reason"] == "asked", asking
        keep("stopped", collected)
        os.kill(stopped, signal.SIGCONT)
        stopped = None
        keep("late", next_collection(f"rank {LATE_RANK} late", PHASE_S))
        (release / f"step-{LATE_STEP}").touch()
        keep("barrier", next_collection(f"rank {BARRIER_RANK} in a barrier", PHASE_S))
        # the runner judges a collection after writing it: interrupt once its verdict is printed, not before
        wait_for(lambda: "waits in barrier" in _verdicts(said)[-1], PHASE_S, "the barrier's verdict in the output")
        runner.send_signal(signal.SIGINT)
        runner.wait(timeout=PHASE_S)
        result.output, result.code = said.read_text(), runner.returncode
        return result
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)
        clean_up(project, runner)


def own_script_project(tmp: Path, render: object, launcher: str = "torchrun") -> Path:
    """The 2 x 2 CPU project (torchrun, or `launcher`) running OWN_SCRIPT as the user's script."""
    project = render(tmp, launcher, nodes=2, answers={"training.script": "own_train.py"})  # type: ignore[operator]
    (project / "own_train.py").write_text(OWN_SCRIPT)
    return project


def run_late(project: Path, env: dict[str, str], *args: str, timeout: float = START_S + PHASE_S) -> HangRun:
    """Run `project` with rank LATE_RANK asleep before the backward of step LATE_STEP, to --abort-on-hang's end."""
    env = {**env, "NPU_WIZARD_REHEARSE": f"hang:{LATE_RANK}:{LATE_STEP}:sleep"}
    runner = start_runner(project, "--interval", "1", "--hang-after", HANG_AFTER_S, "--abort-on-hang", *args, env=env)
    try:
        output, _ = runner.communicate(timeout=timeout)
    finally:
        clean_up(project, runner)
    (run_dir,) = run_dirs(project)
    return HangRun(project, run_dir, {"late": run_dir / "hang"}, output, runner.returncode)


def check_late(run: HangRun, script: Path, ranks: range) -> None:
    """Case (a) in RUN/hang/: rank LATE_RANK last completed #N-1, before its backward; the others wait in #N."""
    records = {rank: run.record("late", rank) for rank in ranks}
    assert all(record["answered"] for record in records.values()), run.output[-3000:]
    waiting = [rank for rank in ranks if rank != LATE_RANK]
    without = {rank: r["collectives"] for rank, r in records.items() if "last_entered" not in r["collectives"]}
    assert not without, f"{without}\n{run.output[-3000:]}"
    (seq,) = {records[rank]["collectives"]["last_entered"] for rank in waiting}
    late = records[LATE_RANK]["collectives"]
    assert (late["last_entered"], late["last_completed"]) == (seq - 1, seq - 1)
    backward = [n for n, line in enumerate(script.read_text().splitlines(), 1) if "loss.backward()" in line]
    for rank in waiting:
        pending = [(e["seq"], e["op"]) for e in records[rank]["collectives"]["entries"] if e["state"] != "completed"]
        assert pending == [(seq, "all_reduce")]
        (main,) = [thread for thread in records[rank]["threads"] if thread["main"]]
        assert [f["line"] for f in main["frames"] if f["file"].endswith(script.name)][-1] in backward
    verdicts = [line for line in run.output.splitlines() if line.startswith("WHERE EACH RANK IS: ")]
    assert verdicts and f"rank {LATE_RANK} never entered #{seq}" in verdicts[-1], run.output[-3000:]
