"""Training samples/s of a generated project against Huawei's DDP sample and a bare loop, in one run.

All on this machine's CPU with gloo, with the same MLP (64 -> 256 -> 256 ->
10), number of samples, per-process batch (32) and step count:

- generated: a project rendered with the default model and synthetic data
  (AMP off; mid-epoch checkpoints off, as the sample has none), 1 node x 2
  processes and 1 node x 1 process, started with `launch/node0.sh` (torchrun,
  the default launcher) as a user starts it. Rank 0's `step` events (every
  LOG_EVERY=10 steps) give the timestamps.
- sample: benchmarks/baseline_huawei_ddp_sample.py, the single-node DDP sample
  of Ascend's migration guide (mp.spawn; DistributedSampler and a DataLoader
  with one worker), adapted to gloo and in-memory data. Rank 0 notes the time
  at each of its every-100-steps prints.
- bare: one process, no DDP, no events, `index_select` batches from the same
  tensors (the per-process ceiling); and the same loop with the model in DDP,
  in this process (a gloo group of one) and in 2 spawned processes: what DDP
  itself costs, whoever writes the loop (the ceiling for DDP at 2 processes).

Steady state: the first WARMUP_STEPS steps of each run and its start-up are
left out. "within epoch" adds up the spans between two timestamps of the same
epoch; "whole run" goes from the first timestamp after warm-up to the last,
so it also pays each epoch's turnover (the generated project's epoch-end
checkpoint; the sample's DataLoader starting a new worker, which inside an
mp.spawn worker is a spawned interpreter that imports torch again). Every
contender runs --repeat times, interleaved in a rotating order (the bare
loops in this process, between the launched runs); the median and the range
are printed. An untimed run of the generated project warms the page cache
first; the in-process loops warm up on an untimed epoch. Left in, both in the
sample's favour: its plain SGD (the project's has momentum 0.9) and its loss
read every 100 steps (the project's every 10).

Threads: every process gets OMP_NUM_THREADS=--threads (default 1). On a small
shared machine more OpenMP threads than free cores make the timings measure
the scheduler, not the loop (mp.spawn would give each of the sample's
processes all cores). `--threads launcher` leaves the variable unset: each
contender then gets its launcher's own policy.

Event stream cost: a launched run has no switch for its events, so the
rendered train.py's own Trainer is timed in this process (a gloo group of
one, epochs of EVENT_TRIAL_SAMPLES) alternately with the real EventWriter
(heartbeat thread on, `progress()` every step, a `step` line written and
flushed every LOG_EVERY steps) and with a stub recorder whose methods do
nothing; all else (the loss read and print every LOG_EVERY steps, the
epoch-end checkpoint, here on tmpfs) is the same. The A/B cost is the median
over adjacent pairs of (time with events / time with the stub - 1), in this
process's CPU time and in wall time. A shared machine's load swings are about
as large as the effect, so the time spent inside the recorder's calls is also
summed in the loop itself, as a share of the epoch. World size 1 has the
shortest steps: both bound the cost at 2 processes from above.

    python benchmarks/training_throughput.py [--repeat 3] [--threads 1]
    python benchmarks/training_throughput.py --smoke   # tiny sizes: does it run? (tests/test_benchmarks_smoke.py)
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch.multiprocessing import ProcessExitedException, ProcessRaisedException
from torch.nn.parallel import DistributedDataParallel as DDP

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "benchmarks" / "baseline_huawei_ddp_sample.py"
BATCH_SIZE = 32  # the answers' default per-device batch
WARMUP_STEPS = 100
LOG_EVERY = 10  # the generated project's step events
# --smoke: one epoch of 64 steps in one process, 32 in two: timestamps at steps 10, 20 and 30 (the sample's at 11,
# 21 and 31) after the warm-up of LOG_EVERY steps. One epoch, not two: the sample's DataLoader starts a worker each
# epoch, an interpreter that imports torch again (2 CPU s, three of them in a smoke run of two epochs)
SMOKE_SAMPLES = 2048
SMOKE_TRIAL_SAMPLES = 1024  # --smoke: an A/B trial of 32 steps
EVENT_TRIAL_SAMPLES = 8192  # one A/B trial: an epoch of 256 steps, short so that load swings hit both modes
RUN_TIMEOUT_S = 900  # one run; a loaded two-core machine has taken over 300 s to start and finish the smoke baseline
TARGET_VS_SAMPLE_2 = 1.0
TARGET_VS_SAMPLE_1 = 2.0
TARGET_EVENT_COST = 0.02

Point = tuple[int, int, float]  # step (steps done), epoch, seconds
Contender = tuple[str, int]  # (generated, sample, bare or bare+ddp; processes)


@dataclass(frozen=True)
class Rate:
    """Steady-state samples/s of one run: within epochs, and over the whole run."""

    within_epoch: float
    whole_run: float


def free_port() -> int:
    """A TCP port that was free a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def steady_rate(points: list[Point], samples_per_step: int, warmup: int = WARMUP_STEPS) -> Rate:
    """Samples/s between the timestamps taken after `warmup` steps."""
    kept = [point for point in points if point[0] >= warmup]
    if len(kept) < 2:
        raise RuntimeError(f"too few timestamps after {warmup} steps: {points}")
    steps = seconds = 0.0
    for (step, epoch, start), (next_step, next_epoch, end) in itertools.pairwise(kept):
        if epoch == next_epoch:
            steps += next_step - step
            seconds += end - start
    whole = (kept[-1][0] - kept[0][0]) / (kept[-1][2] - kept[0][2])
    return Rate(steps * samples_per_step / seconds, whole * samples_per_step)


def base_env() -> dict[str, str]:
    """The environment of every launched run: this one (thread policy included), this venv first."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHON"] = sys.executable
    return env


def run_checked(command: list[str], env: dict[str, str], cwd: Path | None = None) -> None:
    """Run `command` to the end; raise with its output's tail if it fails."""
    done = subprocess.run(
        command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT_S
    )
    if done.returncode != 0:
        tail = done.stdout.decode(errors="replace")[-3000:]
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n{tail}")


def render_project(folder: Path, nprocs: int, samples: int, epochs: int) -> Path:
    """Render the default-model, synthetic-data CPU project for 1 node x `nprocs`."""
    from wizard.answers.model import resolve
    from wizard.render.render import render

    answers = {
        "project_name": f"bench-1x{nprocs}",
        "device": "cpu",
        "amp": "off",
        "nodes": 1,
        "devices_per_node": nprocs,
        "network.host_ips": ["127.0.0.1"],
        "training.samples": samples,
        "training.epochs": epochs,
        "training.checkpoint_every": 0,
    }
    return render(resolve(answers), folder).project_dir


def run_generated(project: Path, scratch: Path, env: dict[str, str], epochs: int, warmup: int) -> Rate:
    """Run the project's launch script once; its rank 0 step events give the rate."""
    from runtime.events import read_events

    run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=scratch))
    env = {
        **env,
        "NPU_WIZARD_RUN_DIR": str(run_dir),
        "NPU_WIZARD_CHECKPOINT_DIR": str(run_dir / "checkpoints"),
        "MASTER_PORT": str(free_port()),
    }
    run_checked(["bash", str(project / "launch" / "node0.sh"), "--epochs", str(epochs)], env)
    events = read_events(run_dir)
    started = [event for event in events[0] if event["event"] == "started"][0]
    steps = [(e["step"], e["epoch"], e["time"]) for e in events[0] if e["event"] == "step"]
    return steady_rate(steps, BATCH_SIZE * started["world_size"], warmup)


def run_sample(nprocs: int, samples: int, scratch: Path, env: dict[str, str], epochs: int, warmup: int) -> Rate:
    """Run the Huawei-style sample once with the generated project's sizes."""
    timings = Path(tempfile.mkstemp(prefix="sample-", suffix=".json", dir=scratch)[1])
    command = [sys.executable, str(SAMPLE), "--nprocs", str(nprocs), "--batch_size", str(BATCH_SIZE * nprocs)]
    command += ["--samples", str(samples), "--epochs", str(epochs), "--input-shape", "64", "--hidden", "256"]
    if warmup < WARMUP_STEPS:  # tiny runs (--smoke): its every-100-steps prints would give no timestamp
        command += ["--print-every", str(LOG_EVERY)]
    run_checked(command + ["--port", str(free_port()), "--timings", str(timings)], env, cwd=scratch)
    recorded = json.loads(timings.read_text())
    points = [tuple(point) for point in recorded["points"]]
    return steady_rate(points, recorded["batch_size"] * recorded["world_size"], warmup)


def load_train_module(project: Path) -> ModuleType:
    """Import a rendered train.py, with its own runtime/ copy, as a module."""
    for name in [name for name in sys.modules if name == "runtime" or name.startswith("runtime.")]:
        del sys.modules[name]
    sys.path.insert(0, str(project))
    spec = importlib.util.spec_from_file_location("rendered_train", project / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bare_loop(
    train: ModuleType, epochs: int, warmup: int, ddp: bool = False, rank: int = 0, world_size: int = 1
) -> float:
    """Samples/s (all ranks) of a plain loop over the project's tensors and model: no Trainer, no events."""
    features, labels = train.data.synthetic_tensors(train.SAMPLES, train.INPUT_SHAPE, 10, train.SEED)
    torch.manual_seed(train.SEED)
    model = train.build_model(train.data.DataSpec(train.INPUT_SHAPE, 10))
    steps_per_epoch = train.SAMPLES // (BATCH_SIZE * world_size)
    # the project's learning-rate schedule (warmup included), set before every step as its Trainer does
    lr_schedule = train.learning_rate(world_size, steps_per_epoch, steps_per_epoch * epochs)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr_schedule.lr_at(0), momentum=0.9)
    model = DDP(model) if ddp else model
    loss_fn = torch.nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(train.SEED)
    steps = seconds = 0.0
    for epoch in range(epochs):
        shuffled = torch.randperm(train.SAMPLES, generator=generator)[rank::world_size]
        order = shuffled[: steps_per_epoch * BATCH_SIZE].view(steps_per_epoch, BATCH_SIZE)
        start = time.perf_counter()
        for step, index in enumerate(order):
            if epoch == 0 and step == warmup:
                start = time.perf_counter()
            lr_schedule.apply(optimizer, epoch * steps_per_epoch + step)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(features.index_select(0, index)), labels.index_select(0, index))
            loss.backward()
            optimizer.step()
        loss.item()
        steps += steps_per_epoch - (warmup if epoch == 0 else 0)
        seconds += time.perf_counter() - start
    return steps * BATCH_SIZE * world_size / seconds


def _bare_ddp_worker(rank: int, project: Path, port: int, nprocs: int, epochs: int, warmup: int, result: Path) -> None:
    train = load_train_module(project)
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=nprocs)
    try:
        rate = bare_loop(train, epochs, warmup, ddp=True, rank=rank, world_size=nprocs)
    finally:
        torch.distributed.destroy_process_group()
    if rank == 0:
        result.write_text(str(rate))


def bare_ddp_processes(project: Path, nprocs: int, epochs: int, warmup: int, scratch: Path) -> float:
    """Samples/s of the bare loop in DDP across `nprocs` spawned processes: the ceiling for that many."""
    result = Path(tempfile.mkstemp(prefix="bare-", dir=scratch)[1])
    worker_args = (project, free_port(), nprocs, epochs, warmup, result)
    torch.multiprocessing.spawn(_bare_ddp_worker, args=worker_args, nprocs=nprocs)
    return float(result.read_text())


class StubRecorder:
    """Stands in for EventWriter in the cost measurement: every method does nothing."""

    def progress(self, step: int, epoch: int) -> None:
        """Nothing."""

    def step_done(self, **fields: object) -> None:
        """Nothing."""

    def checkpoint(self, **fields: object) -> None:
        """Nothing."""


class TimedRecorder:
    """A real EventWriter whose calls from the Trainer are timed, in the loop where they happen."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer
        self.seconds = 0.0

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self.writer, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        return timed


def trainer_epoch(train: ModuleType, scratch: Path, recording: str, samples: int) -> tuple[float, float, float]:
    """(wall, CPU, in-recorder) seconds of one Trainer epoch of `samples`; recording: stub, events or timed."""
    features, labels = train.data.synthetic_tensors(samples, train.INPUT_SHAPE, 10, train.SEED)
    batches = train.data.TensorBatches(features, labels, BATCH_SIZE, rank=0, world_size=1, seed=train.SEED)
    torch.manual_seed(train.SEED)
    model = train.build_model(train.data.DataSpec(train.INPUT_SHAPE, 10))
    lr_schedule = train.learning_rate(1, len(batches), len(batches) * train.EPOCHS)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr_schedule.lr_at(0), momentum=0.9)
    writer = train.events.EventWriter(Path(tempfile.mkdtemp(prefix="events-", dir=scratch)), 0)
    recorder = {"stub": StubRecorder(), "events": writer, "timed": TimedRecorder(writer)}[recording]
    if recording != "stub":
        writer.started(local_rank=0, node=0, device="cpu", world_size=1)
        writer.start_heartbeat(train.events.heartbeat_interval())
    # checkpoints on tmpfs: the epoch-end save is the same in every mode, so keep its noise small
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else scratch
    with tempfile.TemporaryDirectory(prefix="npu-wizard-bench-", dir=shm) as checkpoints:
        rank = train.distributed.RankInfo(0, 0, 1, 1, 0, "torchrun")
        trainer = train.Trainer(
            model, batches, None, optimizer, lr_schedule, rank, torch.device("cpu"), recorder, Path(checkpoints)
        )
        with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
            wall, cpu = time.perf_counter(), time.process_time()
            trainer.train(1, 0)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    writer.close()
    return wall, cpu, getattr(recorder, "seconds", 0.0)


@dataclass(frozen=True)
class EventCost:
    """The event stream's share of a Trainer epoch, measured three ways."""

    wall: float  # median over A/B pairs of wall time with events / with the stub, minus 1
    cpu: float  # the same in this process's CPU time (less disturbed by other processes)
    in_loop: float  # median share of an epoch spent inside the recorder's calls
    stub_rate: float  # samples/s of the Trainer with the stub recorder


def event_cost(train: ModuleType, scratch: Path, pairs: int, samples: int = EVENT_TRIAL_SAMPLES) -> EventCost:
    """Time the rendered Trainer alternately with and without the event stream (epochs of `samples`)."""
    trainer_epoch(train, scratch, "events", samples)  # warm-up
    wall, cpu, stub_wall = [], [], []
    for pair in range(pairs):
        order = ("events", "stub") if pair % 2 == 0 else ("stub", "events")
        timed = {mode: trainer_epoch(train, scratch, mode, samples) for mode in order}
        wall.append(timed["events"][0] / timed["stub"][0] - 1)
        cpu.append(timed["events"][1] / timed["stub"][1] - 1)
        stub_wall.append(timed["stub"][0])
    timed_runs = (trainer_epoch(train, scratch, "timed", samples) for _ in range(3))
    in_loop = [seconds / epoch for epoch, _, seconds in timed_runs]
    stub_rate = samples / statistics.median(stub_wall)
    return EventCost(statistics.median(wall), statistics.median(cpu), statistics.median(in_loop), stub_rate)


@contextlib.contextmanager
def group_of_one() -> Iterator[None]:
    """This process as a gloo process group of one, for DDP and the Trainer."""
    address = f"tcp://127.0.0.1:{free_port()}"
    torch.distributed.init_process_group("gloo", init_method=address, rank=0, world_size=1)
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()


def spread(values: list[float]) -> str:
    """Median and range of `values`."""
    return f"{statistics.median(values):>8,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def verdict(ok: bool) -> str:
    """'meets' or 'MISSES'."""
    return "meets" if ok else "MISSES"


def measure_rates(
    args: argparse.Namespace,
    scratch: Path,
    projects: dict[int, Path],
    train: ModuleType,
) -> dict[Contender, list[Rate]]:
    """Run every contender --repeat times, interleaved in a rotating order, after warm-ups.

    The bare loops run between the launched runs, so that the ceilings are
    sampled under the same swings of load as the rest.
    """
    env = base_env()

    def as_rate(samples_per_s: float) -> Rate:
        return Rate(samples_per_s, samples_per_s)

    runs: dict[Contender, Callable[[], Rate]] = {
        ("generated", 2): lambda: run_generated(projects[2], scratch, env, args.epochs, args.warmup),
        ("sample", 2): lambda: run_sample(2, args.samples, scratch, env, args.epochs, args.warmup),
        ("bare+ddp", 2): lambda: as_rate(bare_ddp_processes(projects[1], 2, args.epochs, args.warmup, scratch)),
        ("generated", 1): lambda: run_generated(projects[1], scratch, env, args.epochs, args.warmup),
        ("sample", 1): lambda: run_sample(1, args.samples, scratch, env, args.epochs, args.warmup),
        ("bare", 1): lambda: as_rate(bare_loop(train, args.epochs, args.warmup)),
        ("bare+ddp", 1): lambda: as_rate(bare_loop(train, args.epochs, args.warmup, ddp=True)),
    }
    if not args.smoke:
        run_generated(projects[1], scratch, env, 1, args.warmup)  # warm-up (page cache, torch import), untimed
    bare_loop(train, 1, 0, ddp=True)
    rates: dict[Contender, list[Rate]] = {key: [] for key in runs}
    keys = list(runs)
    for attempt in range(args.repeat):
        for key in keys[attempt % len(keys) :] + keys[: attempt % len(keys)]:
            try:
                rate = runs[key]()
            except (RuntimeError, ProcessExitedException, ProcessRaisedException) as error:
                # a shared machine: another job's cleanup or a port race can kill one run
                print(f"  round {attempt + 1}: {key[0]} x{key[1]} failed, running it again: {error}", flush=True)
                rate = runs[key]()
            rates[key].append(rate)
            print(
                f"  round {attempt + 1}: {key[0]:<9} x{key[1]}: {rate.within_epoch:>8,.0f} within epoch, "
                f"{rate.whole_run:>8,.0f} whole run",
                flush=True,
            )
    return rates


def print_report(args: argparse.Namespace, rates: dict[Contender, list[Rate]], events: EventCost) -> None:
    """All figures, the ratios and the targets."""
    within = {key: [rate.within_epoch for rate in values] for key, values in rates.items()}
    whole = {key: [rate.whole_run for rate in values] for key, values in rates.items()}
    med = {key: statistics.median(values) for key, values in within.items()}
    med_whole = {key: statistics.median(values) for key, values in whole.items()}
    print(
        f"\nsamples/s, median of {args.repeat} (range); {args.samples} samples, batch {BATCH_SIZE} per process, "
        f"{args.epochs} epochs, OMP_NUM_THREADS={args.threads}, {os.cpu_count()} cores"
    )
    print(f"{'':46}{'within epoch':>26}{'whole run':>26}")
    names = {
        "generated": "generated project (torchrun)",
        "sample": "Huawei DDP sample (mp.spawn)",
        "bare": "bare loop (the ceiling)",
        "bare+ddp": "bare loop in DDP",
    }
    for key in rates:
        label = f"{names[key[0]]}, {key[1]} proc"
        extra = f"{spread(whole[key]):>26}" if key[0] in ("generated", "sample") else ""
        print(f"{label:<46}{spread(within[key]):>26}{extra}")
    print(f"{'generated Trainer in-process, stub recorder':<46}{events.stub_rate:>17,.0f}")
    print("\nratios, within epoch [whole run]")
    for procs, target in ((2, TARGET_VS_SAMPLE_2), (1, TARGET_VS_SAMPLE_1)):
        ratio = med[("generated", procs)] / med[("sample", procs)]
        ratio_whole = med_whole[("generated", procs)] / med_whole[("sample", procs)]
        label = f"generated / sample, {procs} process{'es' if procs > 1 else ''}"
        print(f"{label:<46}{ratio:6.2f}x [{ratio_whole:5.2f}x]  {verdict(ratio >= target)} the >= {target:g}x target")
    for label, numerator, denominator in (
        ("generated / bare ceiling, 1 process", ("generated", 1), ("bare", 1)),
        ("bare in DDP / bare ceiling, 1 process", ("bare+ddp", 1), ("bare", 1)),
        ("generated / bare in DDP, 2 processes", ("generated", 2), ("bare+ddp", 2)),
    ):
        print(f"{label:<46}{med[numerator] / med[denominator]:6.2f}")
    print(f"\nevent stream cost (Trainer in this process, world size 1, {args.event_pairs} A/B pairs)")
    for label, share in (
        ("A/B, CPU time, median of pairs", events.cpu),
        ("A/B, wall time, median of pairs", events.wall),
        ("time inside the recorder calls, in the loop", events.in_loop),
    ):
        print(f"{label:<46}{share * 100:+6.2f}%  {verdict(share < TARGET_EVENT_COST)} the < 2% target")


def main() -> int:
    """Render, run every contender --repeat times, print the figures and ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--samples", type=int, default=16384, help="synthetic samples (both contenders)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--threads", default="1", help="OMP_NUM_THREADS per process, or 'launcher'")
    parser.add_argument("--event-pairs", type=int, default=16)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes, one round: checks that every part runs and prints (seconds; the figures mean nothing)",
    )
    args = parser.parse_args()
    args.warmup, args.trial_samples = WARMUP_STEPS, EVENT_TRIAL_SAMPLES
    if args.smoke:
        args.repeat, args.samples, args.epochs, args.event_pairs = 1, SMOKE_SAMPLES, 1, 1
        args.warmup, args.trial_samples = LOG_EVERY, SMOKE_TRIAL_SAMPLES
    began = time.perf_counter()
    os.environ.pop("OMP_NUM_THREADS", None)
    if args.threads != "launcher":
        os.environ["OMP_NUM_THREADS"] = args.threads  # for the processes this one spawns
    with tempfile.TemporaryDirectory(prefix="npu-wizard-bench-") as folder:
        scratch = Path(folder)
        projects = {n: render_project(scratch / f"1x{n}", n, args.samples, args.epochs) for n in (2, 1)}
        train = load_train_module(projects[1])
        torch.set_num_threads((os.cpu_count() or 1) if args.threads == "launcher" else int(args.threads))
        with group_of_one():
            rates = measure_rates(args, scratch, projects, train)
            events = event_cost(train, scratch, args.event_pairs, args.trial_samples)
    print_report(args, rates, events)
    print(f"\ntotal {time.perf_counter() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
