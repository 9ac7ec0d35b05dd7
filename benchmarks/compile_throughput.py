"""Samples/s of the generated training loop compiled (training.compile) and eager, against a bare eager loop.

All in this process, on one device, with the same model, batch and data:

- bare: a plain loop (no Trainer, no events): index_select batches from
  tensors on the device, forward and loss under the project's autocast,
  backward, SGD with momentum; the baseline.
- generated: the rendered train.py's own Trainer (its events, step timer,
  learning-rate schedule and loss read every LOG_EVERY steps), with
  training.compile off, default and (on CUDA) reduce-overhead. The CPU has no
  CUDA graphs, so reduce-overhead there is default again and is left out.

The generated train.py is the snapshot the test suite keeps equal to what the
templates render (tests/snapshots/, re-recorded with every template change):
the CPU demo's MLP from `cpu-1x2-torchrun-off-compile`, ResNet-18 on 3x32x32
synthetic images from `a2-1x8-torchrun-bf16-reduce-overhead`; its COMPILE,
AMP and BATCH_SIZE are set per contender. So the benchmark needs torch (and
torchvision for ResNet-18) and this repository's files only, no wizard
dependencies: it runs on a bare CUDA machine. Checkpoints are left out of the
timed epochs (the bare loop writes none).

Each contender warms up on one untimed epoch (the compiled ones compile
there: that epoch's time is printed), then runs --rounds timed epochs of
--steps steps, interleaved with the others in a rotating order; the median and
the range are printed.

    python benchmarks/compile_throughput.py                    # CPU: the demo's MLP, batch 32
    python benchmarks/compile_throughput.py --device cuda      # ResNet-18, 32x32, batch 256, bf16
    python benchmarks/compile_throughput.py --smoke            # tiny: does it run? (tests/test_benchmarks_smoke.py)
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOTS = ROOT / "tests" / "snapshots"
GENERATED = {
    "mlp": SNAPSHOTS / "cpu-1x2-torchrun-off-compile" / "train.py",
    "resnet18": SNAPSHOTS / "a2-1x8-torchrun-bf16-reduce-overhead" / "train.py",
}


def load_generated(model: str) -> ModuleType:
    """The generated train.py for `model`, importing this repository's runtime/."""
    sys.path.insert(0, str(ROOT))
    spec = importlib.util.spec_from_file_location(f"generated_train_{model}", GENERATED[model])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Contender:
    """One loop: `warm_up()` runs its untimed epoch, `epoch()` one timed epoch; both return seconds."""

    name: str
    fallback: str | None = None

    def warm_up(self) -> float:
        """The untimed first epoch (compiling, where the loop compiles)."""
        return self.epoch()

    def epoch(self) -> float:
        """One timed epoch."""
        raise NotImplementedError


class Generated(Contender):
    """The rendered Trainer with training.compile `mode`."""

    def __init__(self, train: ModuleType, mode: str, args: argparse.Namespace, scratch: Path) -> None:
        self.name = f"generated loop, compile {mode}"
        target = torch.device(args.device)
        train.COMPILE, train.AMP, train.BATCH_SIZE = mode, args.amp, args.batch
        train.LOG_EVERY, train.CHECKPOINT_EVERY = args.steps, 0  # one loss read an epoch, as the bare loop
        features, labels = train.data.synthetic_tensors(args.steps * args.batch, train.INPUT_SHAPE, 10, train.SEED)
        batches = train.data.TensorBatches(features, labels, args.batch, rank=0, world_size=1, seed=train.SEED)
        torch.manual_seed(train.SEED)
        model = train.build_model(train.data.DataSpec(train.INPUT_SHAPE, 10)).to(target)
        lr_schedule = train.learning_rate(1, len(batches), len(batches) * train.EPOCHS)
        optimizer = torch.optim.SGD(model.parameters(), lr=lr_schedule.lr_at(0), momentum=0.9)
        folder = Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=scratch))
        recorder = train.events.EventWriter(folder / "run", 0)
        rank = train.distributed.RankInfo(0, 0, 1, 1, 0, "torchrun")
        self.trainer = train.Trainer(
            model, batches.to(target), None, optimizer, lr_schedule, rank, target, recorder, folder / "checkpoints"
        )
        self.trainer._save_checkpoint = lambda: None  # timed epochs write no checkpoint
        self.sync = _sync(args.device)

    def epoch(self) -> float:
        """One more epoch of the Trainer."""
        start = time.perf_counter()
        with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
            self.trainer.train(self.trainer.epoch + 1, 0)
        self.sync()
        step = getattr(self.trainer, "forward_loss", None)
        self.fallback = getattr(step, "fallback", None)
        return time.perf_counter() - start


class Bare(Contender):
    """The plain eager loop over the same model, data and batch."""

    name = "bare eager loop (the baseline)"

    def __init__(self, train: ModuleType, args: argparse.Namespace) -> None:
        self.device, self.amp, self.batch, self.steps = torch.device(args.device), train.amp, args.batch, args.steps
        self.mode = args.amp
        features, labels = train.data.synthetic_tensors(args.steps * args.batch, train.INPUT_SHAPE, 10, train.SEED)
        self.features, self.labels = features.to(self.device), labels.to(self.device)
        torch.manual_seed(train.SEED)
        self.model = train.build_model(train.data.DataSpec(train.INPUT_SHAPE, 10)).to(self.device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.loss_fn = torch.nn.CrossEntropyLoss()
        self.sync = _sync(args.device)

    def epoch(self) -> float:
        """One epoch of --steps steps in a new random order."""
        order = torch.randperm(self.steps * self.batch, device=self.device).view(self.steps, self.batch)
        start = time.perf_counter()
        for index in order:
            self.optimizer.zero_grad(set_to_none=True)
            with self.amp.autocast(self.device.type, self.mode):
                loss = self.loss_fn(
                    self.model(self.features.index_select(0, index)), self.labels.index_select(0, index)
                )
            loss.backward()
            self.optimizer.step()
        loss.item()
        self.sync()
        return time.perf_counter() - start


def _sync(device: str) -> Callable[[], Any]:
    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with the defaults of the chosen device."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--model", choices=tuple(GENERATED), help="default: mlp on cpu, resnet18 on cuda")
    parser.add_argument("--batch", type=int, help="default: 32 on cpu, 256 on cuda")
    parser.add_argument("--amp", choices=("off", "bf16"), help="default: off on cpu, bf16 on cuda")
    parser.add_argument("--steps", type=int, help="steps an epoch (default: 300 on cpu, 200 on cuda)")
    parser.add_argument("--rounds", type=int, default=3, help="timed epochs per contender")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (cpu only; a small shared machine)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: does it run?")
    args = parser.parse_args(argv)
    cuda = args.device == "cuda"
    args.model = args.model or ("resnet18" if cuda else "mlp")
    args.batch = args.batch or (256 if cuda else 32)
    args.amp = args.amp or ("bf16" if cuda else "off")
    args.steps = args.steps or (200 if cuda else 300)
    if args.smoke:
        args.steps, args.rounds = 8, 1
    return args


def main(argv: list[str] | None = None) -> int:
    """Build the contenders, time them interleaved, print samples/s against the bare loop."""
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no CUDA device here", file=sys.stderr)
        return 2
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    else:
        torch.backends.cudnn.benchmark = True
    if args.smoke:
        # compile in this process: on a small machine inductor otherwise starts a pool of compile workers, each an
        # interpreter importing torch, for the two small graphs of a smoke run (a cold compile took 184 s of wall
        # time with them, 83 s without, on a loaded two-core machine)
        from torch._inductor import config as inductor_config

        inductor_config.compile_threads = 1
    where = torch.cuda.get_device_name() if args.device == "cuda" else f"{os.cpu_count()} cores, {args.threads} thread"
    print(
        f"{args.device} ({where}), torch {torch.__version__}, model {args.model}, batch {args.batch}, "
        f"amp {args.amp}, {args.steps} steps an epoch, {args.rounds} timed epochs each",
        flush=True,
    )
    modes = ["off", "default"] + (["reduce-overhead"] if args.device == "cuda" else [])
    train = load_generated(args.model)
    with tempfile.TemporaryDirectory(prefix="compile-bench-") as scratch:
        contenders: list[Contender] = [Bare(train, args)]
        contenders += [Generated(train, mode, args, Path(scratch)) for mode in modes]
        for contender in contenders:
            seconds = contender.warm_up()
            print(f"  first epoch of {contender.name}: {seconds:.1f} s", flush=True)
        times: dict[str, list[float]] = {contender.name: [] for contender in contenders}
        for round_ in range(args.rounds):
            for contender in contenders[round_ % len(contenders) :] + contenders[: round_ % len(contenders)]:
                times[contender.name].append(contender.epoch())
    if args.device == "cpu":
        print("  reduce-overhead: left out on the CPU (no CUDA graphs: it compiles as default does)")
    samples = args.steps * args.batch
    rates = {name: [samples / seconds for seconds in values] for name, values in times.items()}
    baseline = statistics.median(rates[contenders[0].name])
    print(f"\nsamples/s, median of {args.rounds} epochs (range), {samples} samples an epoch")
    for contender in contenders:
        values = rates[contender.name]
        median = statistics.median(values)
        fell = f"  FELL BACK to eager: {contender.fallback}" if contender.fallback else ""
        print(
            f"{contender.name + ':':<42} {median:>10,.0f} ({min(values):,.0f}-{max(values):,.0f})"
            f"  {median / baseline:.2f} x bare eager{fell}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
