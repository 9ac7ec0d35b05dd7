"""Train a2-fsdp2 with FSDP2 (fully_shard), one process per device.

Rendered by npu-wizard; start it with launch/node<N>.sh on each node. The
device, the process group, events and checkpoints come from runtime/.
"""

import argparse
import contextlib
import faulthandler
import itertools
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.multiprocessing as mp
from torch import nn

from model import GPT, GPTConfig, next_token_loss
from runtime import (
    amp,
    checkpoint,
    data,
    device,
    distributed,
    events,
    memory,
    preemption,
    profile_window,
    schedule,
    sharded_checkpoint,
    sharding,
    smoke,
    stacks,
    timing,
    tokens,
)
from runtime.errors import SetupError

PROJECT_DIR = Path(__file__).resolve().parent
DEVICE = "npu"
LAUNCHER = "torchrun"
NODES = 2
DEVICES_PER_NODE = 8
AMP = "bf16"
PROJECT = "a2-fsdp2"  # kept in each checkpoint: a shared folder is refused
# training.parallelism: parameters, gradients and optimizer state split across the ranks
PARALLELISM = "fsdp2"
# no checkpoint folder every rank reaches (each host keeps its own): each node's local rank 0
# gathers the whole state at every save and writes it as one file
SHARDED_CHECKPOINTS = False
BATCH_SIZE = 32  # per device; the global batch is this x world size
BASE_BATCH_SIZE = 32  # the single-card batch ...
BASE_LR = 0.001  # ... and learning rate to scale from
WARMUP_EPOCHS = 0  # from BASE_LR up to the scaled rate
EPOCHS = 3
MAX_STEPS = 1000  # optimizer steps, or the epochs: whichever ends first
GRAD_ACCUM = 2  # micro-batches per optimizer step
GRAD_CLIP = 1.0  # the gradients' largest global norm (0.0: no clipping)
SEED = 1234
CHECKPOINT_EVERY = 100  # steps; 0: at epoch ends only
LOG_EVERY = 10  # steps; the loss is read only this often
DATA_DIR = PROJECT_DIR / "data"
EVAL_EVERY = 100  # optimizer steps between validation losses (0: never)
EVAL_BATCHES = 8  # batches of val.bin per rank at each validation
# the model's shape: training.gpt_size small with the overrides of the answers
N_LAYER = 6
N_HEAD = 6
N_EMBD = 384
BLOCK_SIZE = 256  # tokens of context; a window is one more
DROPOUT = 0.1
PEAK_TFLOPS = None  # training.peak_tflops: set it to report the model FLOPs utilisation
# HCCL_EXEC_TIMEOUT (the launch scripts export it): how long a collective waits for
# a slow rank; the process group's own timeout is set beyond it
HCCL_EXEC_TIMEOUT_S = 1836


def ddp_setup(rank: distributed.RankInfo, requested: str) -> torch.device:
    """Bind this rank to its device and join the process group."""
    choice = device.select_device(requested)
    target = device.bind_device(choice, rank.local_rank, rank.local_world_size)
    exec_timeout_s = distributed.env_int("HCCL_EXEC_TIMEOUT", HCCL_EXEC_TIMEOUT_S)
    timeout_s = distributed.process_group_timeout_s(exec_timeout_s)
    distributed.init_process_group(rank, choice.backend, timeout_s)
    where = f"rank {rank.rank}/{rank.world_size}: {target} with {choice.backend}"
    print(f"{where} ({choice.reason})", flush=True)
    if rank.is_main:
        print(f"collectives time out after {timeout_s} s", flush=True)
        note = amp.simulation_note(target.type, AMP)
        if note:
            events.warn(note, "amp")
    return target


class Trainer:
    """Trains on this rank's batches and shards; every rank saves its shard of each checkpoint."""

    def __init__(
        self,
        model: nn.Module,
        train_data: tokens.TokenBatches,
        val_data: tokens.TokenBatches | None,
        optimizer: torch.optim.Optimizer,
        lr_schedule: schedule.LinearWarmup,
        rank: distributed.RankInfo,
        target: torch.device,
        recorder: events.EventWriter,
        checkpoint_dir: Path,
    ) -> None:
        self.rank = rank
        self.device = target
        self.model = model
        self.train_data = train_data
        self.val_data = val_data
        self.optimizer = optimizer
        self.lr_schedule = lr_schedule
        self.loss_fn = next_token_loss
        self.flops_per_token = model.flops_per_token()  # for the MFU
        self.recorder = recorder
        # waiting for data and the forward pass, per logged window: the monitor names stragglers from them
        self.timer = timing.StepTimer(
            target.type, enabled=timing.timing_enabled(), micro_batches=GRAD_ACCUM
        )
        self.checkpoint_dir = checkpoint_dir
        self.epoch = 0
        self.step = 0  # optimizer steps
        # micro-batches done in this epoch: where a resumed epoch starts
        self.batches_done = 0
        self.max_steps = 0
        self.saved_step = -1
        self.resumed_from_ranks = rank.world_size  # the checkpoint's, once resumed
        # local rank 0 of each node writes the whole checkpoint: no shared storage needed
        self.writers = sharding.writers(
            rank.world_size, rank.local_world_size, shared=False
        )
        # the newest checkpoint every rank can load (a damaged one is set aside): a
        # sharded step folder or a whole step-N.pt, whichever mode wrote it
        resumed = sharded_checkpoint.resume_point(checkpoint_dir, project=PROJECT)
        if resumed is not None:
            self._load_checkpoint(*resumed)

    def _load_checkpoint(self, path: Path, state: dict) -> None:
        try:
            if path.is_dir():  # one shard per rank, from fsdp2 on any world size
                sharding.load_sharded_state(
                    self.model, self.optimizer, path, PARALLELISM
                )
            else:  # whole, from any mode: each rank takes its part
                sharding.load_whole_state(self.model, self.optimizer, state)
        except sharding.load_errors() as error:
            raise SetupError(
                f"checkpoint {path} does not fit this model ({type(error).__name__}: "
                f"{str(error)[:300]}): was it written by another project? give each "
                "project its own checkpoint folder, or run with --fresh"
            ) from error
        self.epoch = state["epoch"]
        self.step = self.saved_step = state["step"]
        self.batches_done = state["batches_done"]
        if self.rank.is_main:
            events.warn(
                f"resuming from {path}: epoch {self.epoch + 1}, step {self.step}",
                "resume",
            )
        self.resumed_from_ranks = state.get("world_size", self.rank.world_size)
        if self.resumed_from_ranks != self.rank.world_size:
            self._go_on_after_the_same_samples(self.resumed_from_ranks)

    def _go_on_after_the_same_samples(self, saved_world: int) -> None:
        """Resumed on another number of ranks: this epoch goes on after the samples done."""
        self.batches_done = self.batches_done * saved_world // self.rank.world_size
        # each rank reads windows of its own part of the tokens, a part that changes with
        # the number of ranks: the same share of the epoch is done, not the same windows
        where = (
            f"the same share of epoch {self.epoch + 1} "
            "(other windows: each rank reads its own part)"
        )
        if self.rank.is_main:
            events.warn(
                f"the checkpoint was written by {saved_world} ranks and resumes on "
                f"{self.rank.world_size}: the model and optimizer state load onto them, "
                f"training goes on after {where}, and the learning-rate schedule is laid "
                "out again over the steps left, scaled to the global batch of "
                f"{self.rank.world_size} ranks",
                "resume",
            )

    def steps_left(self, steps_per_epoch: int, epochs: int) -> int:
        """Optimizer steps from where the run stands to the end of its last epoch."""
        this_epoch = (len(self.train_data) - self.batches_done) // GRAD_ACCUM
        return max(0, this_epoch) + steps_per_epoch * max(0, epochs - self.epoch - 1)

    def _run_step(self, micro_batches: list[data.Batch]) -> torch.Tensor:
        """One optimizer step over `micro_batches`; their mean loss."""
        self.optimizer.zero_grad(set_to_none=True)
        losses = []
        for index, (inputs, targets) in enumerate(micro_batches):
            inputs = inputs.to(self.device, non_blocking=True)
            targets = targets.to(self.device, non_blocking=True)
            with self._sync_gradients(index == len(micro_batches) - 1):
                with self.timer.forward(), amp.autocast(self.device.type, AMP):
                    loss = self.loss_fn(self.model(inputs), targets)
                self._backward(loss / len(micro_batches))
            losses.append(loss.detach())
        self._optimizer_step()
        return torch.stack(losses).mean()

    def _sync_gradients(self, sync: bool) -> contextlib.AbstractContextManager[None]:
        # FSDP2 reduce-scatters the gradients in every backward: the inner micro-batches
        # keep this rank's own, the last one reduces the sum once
        self.model.set_requires_gradient_sync(sync)
        return contextlib.nullcontext()

    def _backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def _optimizer_step(self) -> None:
        if GRAD_CLIP:
            nn.utils.clip_grad_norm_(self.model.parameters(), GRAD_CLIP)
        self.optimizer.step()

    def _run_epoch(self, epoch: int) -> bool:
        """Train one epoch from where it stands, or up to max_steps; False when a stop signal ended it early (saved)."""
        self.epoch = epoch
        self.train_data.set_epoch(epoch)
        window_start, window_steps = time.perf_counter(), 0
        batches = self.timer.batches(self.train_data.batches(start=self.batches_done))
        for micro_batches in optimizer_steps(batches, GRAD_ACCUM):
            self.lr_schedule.apply(self.optimizer, self.step)
            loss = self._run_step(micro_batches)
            self.step += 1
            self.batches_done += len(micro_batches)
            window_steps += 1
            self.recorder.progress(self.step, epoch)
            profile_window.step(self.step)  # a window of npu-wizard run --profile
            if self.step % LOG_EVERY == 0:
                self._log(loss, window_steps, time.perf_counter() - window_start)
                window_start, window_steps = time.perf_counter(), 0
            if EVAL_EVERY and self.step % EVAL_EVERY == 0:
                self._evaluate()
            if CHECKPOINT_EVERY and self.step % CHECKPOINT_EVERY == 0:
                self._save_checkpoint()
            if self.step % LOG_EVERY == 0 and self._stop_agreed():
                return False
            if self.step == self.max_steps:
                self._save_checkpoint()  # mid-epoch: a run with more steps resumes here
                return True
        self.epoch, self.batches_done = epoch + 1, 0
        self._save_checkpoint()
        return not self._stop_agreed()

    def _stop_agreed(self) -> bool:
        # SIGUSR1 or SIGTERM reached some rank: one small all_reduce per logged window tells
        # every rank, so all stop at this step; the checkpoint is written before any exits
        if preemption.agree(self.device) is None:
            return False
        self._save_checkpoint()
        preemption.barrier()
        return True

    def _log(self, loss: torch.Tensor, steps: int, seconds: float) -> None:
        # the one host-device synchronisation, every LOG_EVERY steps
        value = loss.item()
        samples = steps * BATCH_SIZE * GRAD_ACCUM * self.rank.world_size
        samples_per_s = samples / max(seconds, 1e-9)
        lr = self.optimizer.param_groups[0]["lr"]
        throughput = {"tokens_per_s": samples_per_s * BLOCK_SIZE}
        if PEAK_TFLOPS and self.device.type != "cpu":
            # model FLOPs utilisation: the FLOPs one device does per second against its peak
            tokens_per_device = throughput["tokens_per_s"] / self.rank.world_size
            device_flops = self.flops_per_token * tokens_per_device
            throughput["mfu"] = device_flops / (PEAK_TFLOPS * 1e12)
        self.recorder.step_done(
            step=self.step,
            epoch=self.epoch,
            loss=value,
            samples_per_s=samples_per_s,
            lr=lr,
            **self.timer.window(),  # data_s and forward_s, read after the loss read synchronised
            **memory.window(  # this window's peak memory and the training state's bytes
                self.device, self.model, self.optimizer, self.rank.rank, self.step
            ),
            **throughput,
        )
        if self.rank.is_main:
            mfu = f", MFU {throughput['mfu']:.1%}" if "mfu" in throughput else ""
            print(
                f"step {self.step}: loss {value:.4f}, {throughput['tokens_per_s']:,.0f} tokens/s{mfu}, lr {lr:.4g}",
                flush=True,
            )

    def _evaluate(self) -> float:
        """The validation loss: the same EVAL_BATCHES batches of val.bin on every rank, averaged over all."""
        self.model.eval()
        total = torch.zeros((), device=self.device)
        batches = list(itertools.islice(self.val_data.batches(), EVAL_BATCHES))
        with torch.no_grad():
            for inputs, targets in batches:
                inputs = inputs.to(self.device, non_blocking=True)
                targets = targets.to(self.device, non_blocking=True)
                with amp.autocast(self.device.type, AMP):
                    total += self.loss_fn(self.model(inputs), targets).float()
        self.model.train()
        torch.distributed.all_reduce(total)  # every rank reads as many batches
        val_loss = total.item() / (len(batches) * self.rank.world_size)
        self.recorder.evaluated(step=self.step, val_loss=val_loss)
        if self.rank.is_main:
            print(f"step {self.step}: validation loss {val_loss:.4f}", flush=True)
        return val_loss

    def _save_checkpoint(self) -> None:
        # every rank comes here at the same steps
        if self.step == self.saved_step:
            return
        self.saved_step = self.step
        training = {
            "epoch": self.epoch,
            "step": self.step,
            "batches_done": self.batches_done,
            "world_size": self.rank.world_size,  # a resume on another number of ranks
        }
        if SHARDED_CHECKPOINTS:
            # a step folder with one shard per rank, complete or ignored (renamed into place)
            path = sharded_checkpoint.save_sharded(
                self.checkpoint_dir,
                self.step,
                self.model,
                self.optimizer,
                training,
                project=PROJECT,
            )
            if self.rank.local_rank == 0:
                self.recorder.checkpoint(step=self.step, path=path)
                print(f"step {self.step}: checkpoint {path}", flush=True)
            return
        # the whole state, gathered tensor by tensor onto each node's local rank 0
        state = sharding.whole_state(
            self.model, self.optimizer, PARALLELISM, self.writers
        )
        if state is None:
            return
        path = checkpoint.save_checkpoint(
            self.checkpoint_dir, self.step, {**state, **training}, project=PROJECT
        )
        self.recorder.checkpoint(step=self.step, path=path)
        print(f"step {self.step}: checkpoint {path}", flush=True)

    def train(self, max_epochs: int, max_steps: int) -> bool:
        """Run the epochs left, up to max_steps optimizer steps (0: no limit); False when a stop signal ended them."""
        self.max_steps = max_steps
        return self._run_epochs(max_epochs)

    def _run_epochs(self, max_epochs: int) -> bool:
        for epoch in range(self.epoch, max_epochs):
            if self.finished_steps():
                break
            if not self._run_epoch(epoch):
                return False
        return True

    def finished_steps(self) -> bool:
        """Whether max_steps optimizer steps are done (never, without a limit)."""
        return bool(self.max_steps) and self.step >= self.max_steps


def optimizer_steps(
    batches: Iterator[data.Batch], micro_batches: int
) -> Iterator[list[data.Batch]]:
    """The batches in groups of `micro_batches`, one group per optimizer step; a short last group is left out."""
    while group := list(itertools.islice(batches, micro_batches)):
        if len(group) < micro_batches:
            return
        yield group


def learning_rate(
    world_size: int, steps_per_epoch: int, total_steps: int
) -> schedule.LinearWarmup:
    """The job's learning rate per step: scaled linearly with the global batch.

    When that raises it above BASE_LR, it climbs there from BASE_LR over
    WARMUP_EPOCHS epochs (Goyal et al. 2017).
    """
    global_batch = BATCH_SIZE * GRAD_ACCUM * world_size
    scaled_lr = BASE_LR * global_batch / BASE_BATCH_SIZE
    warmup = schedule.LinearWarmup.scaled(
        BASE_LR, scaled_lr, WARMUP_EPOCHS, steps_per_epoch
    )
    return warmup


# ---- yours: the data and the model ------------------------------------------------
# Replace load_train_data and build_model (and anything between these two markers)
# with your own. npu-wizard renders this part from training.dataset and
# training.model only, so `npu-wizard update` keeps your version through every
# other change of the answers: nodes, launcher, precision, versions.


def load_train_data(
    rank: distributed.RankInfo, target: torch.device
) -> tuple[tokens.TokenBatches, data.DataSpec]:
    """Windows of BLOCK_SIZE + 1 tokens of DATA_DIR/train.bin from this rank's part, in a seeded order."""
    meta = tokens.read_meta(DATA_DIR)
    spec = data.DataSpec(input_shape=(BLOCK_SIZE,), num_classes=meta.vocab_size)
    train_data = tokens.TokenBatches(
        tokens.open_tokens(DATA_DIR, "train", meta),
        BLOCK_SIZE,
        BATCH_SIZE,
        rank=rank.rank,
        world_size=rank.world_size,
        seed=SEED,
        name=str(DATA_DIR / "train.bin"),
    )
    return train_data, spec


def load_val_data(
    rank: distributed.RankInfo, target: torch.device
) -> tokens.TokenBatches | None:
    """The windows of DATA_DIR/val.bin from this rank's part, in file order: the same at every validation.

    None with EVAL_EVERY 0: nothing validates, so val.bin need not hold a batch for every rank.
    """
    if not EVAL_EVERY:
        return None
    meta = tokens.read_meta(DATA_DIR)
    return tokens.TokenBatches(
        tokens.open_tokens(DATA_DIR, "val", meta),
        BLOCK_SIZE,
        BATCH_SIZE,
        rank=rank.rank,
        world_size=rank.world_size,
        seed=SEED,
        shuffle=False,
        name=str(DATA_DIR / "val.bin"),
    )


def build_model(spec: data.DataSpec) -> GPT:
    """The GPT of model.py in the answers' shape, with the token data's vocabulary."""
    config = GPTConfig(
        vocab_size=spec.num_classes,
        block_size=BLOCK_SIZE,
        n_layer=N_LAYER,
        n_head=N_HEAD,
        n_embd=N_EMBD,
        dropout=DROPOUT,
    )
    return GPT(config)


# ---- end of yours -------------------------------------------------------------------


def main(local_rank: int | None, args: argparse.Namespace) -> None:
    """One rank from start to end; a failure is recorded as an error event, then raised.

    SIGUSR1 or SIGTERM (a scheduler's preemption, npu-wizard run's stop) makes every
    rank save at the same step and exit with preemption.PREEMPTED_EXIT.
    """
    preemption.install()
    rank = distributed.rank_info(
        args.launcher,
        local_rank=local_rank,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        nproc_per_node=args.nproc_per_node,
    )
    run_dir = events.resolve_run_dir(args.run_dir, PROJECT_DIR)
    events.tee_output(run_dir, rank.rank)
    # a native crash (SIGSEGV; SIGABRT, as a library's failed check raises it) leaves every
    # thread's Python stack in the rank's log
    faulthandler.enable(all_threads=True)
    recorder = events.EventWriter(run_dir, rank.rank)
    completed = True
    # at a hang the runner asks where this rank is (a larger recorder when sharded)
    stacks.install(run_dir, rank.rank, sharded=PARALLELISM != "ddp")
    with recorder.recording():
        target = ddp_setup(rank, device.requested_device(args.device, DEVICE))
        try:
            if args.smoke:
                # one all_reduce, one barrier; with --bandwidth, the network check
                smoke.run_smoke(
                    rank,
                    target,
                    recorder,
                    bandwidth=args.bandwidth,
                    max_bytes=args.bandwidth_max_bytes,
                    sharded=PARALLELISM != "ddp",
                )
                return
            torch.manual_seed(SEED)
            train_data, spec = load_train_data(rank, target)
            val_data = load_val_data(rank, target)
            # the model's dtype is set here, before any sharding
            model = build_model(spec).to(target)
            # training.activation_checkpointing: each block recomputes its activations in
            # the backward pass instead of keeping them; wrapped before any sharding
            sharding.checkpoint_activations(sharding.model_blocks(model))
            # fully_shard each block, then the root: bf16 parameters in compute, fp32 reductions
            sharding.shard_model(model, sharding.model_blocks(model), AMP, target.type)
            steps_per_epoch = len(train_data) // GRAD_ACCUM
            if steps_per_epoch == 0:
                raise SetupError(
                    f"an epoch of {len(train_data)} batches per rank makes no optimizer step of "
                    f"{GRAD_ACCUM} micro-batches: lower training.grad_accum or the batch size"
                )
            total_steps = steps_per_epoch * args.epochs
            if args.max_steps:
                total_steps = min(total_steps, args.max_steps)
            lr_schedule = learning_rate(rank.world_size, steps_per_epoch, total_steps)
            optimizer = model.configure_optimizer(lr_schedule.lr_at(0))
            if rank.is_main:
                print(lr_schedule.describe(), flush=True)
            folder = checkpoint.resolve_checkpoint_dir(args.checkpoint_dir, PROJECT_DIR)
            trainer = Trainer(
                model,
                train_data,
                val_data,
                optimizer,
                lr_schedule,
                rank,
                target,
                recorder,
                folder,
            )
            if trainer.resumed_from_ranks != rank.world_size:
                # the steps counted at the old number of ranks were of another size: the
                # schedule is laid out again, to end with the steps left at this number
                left = trainer.steps_left(steps_per_epoch, args.epochs)
                total_steps = trainer.step + left
                if args.max_steps:
                    total_steps = min(total_steps, args.max_steps)
                trainer.lr_schedule = learning_rate(
                    rank.world_size, steps_per_epoch, total_steps
                )
            recorder.started(
                local_rank=rank.local_rank,
                node=rank.node_rank,
                device=str(target),
                world_size=rank.world_size,
                launcher=rank.launcher,
                resumed_step=trainer.step,
                total_steps=total_steps,
            )
            recorder.start_heartbeat(events.heartbeat_interval())
            if trainer.epoch >= args.epochs and rank.is_main:
                print(
                    f"nothing to train: the checkpoint at step {trainer.step} already completes "
                    f"{args.epochs} epoch(s); pass --epochs N for more, or start afresh with npu-wizard run --fresh"
                )
            elif args.max_steps and trainer.step >= args.max_steps and rank.is_main:
                print(
                    f"nothing to train: the checkpoint is at step {trainer.step}, max steps {args.max_steps}; "
                    "pass --max-steps N for more, or start afresh with npu-wizard run --fresh"
                )
            completed = trainer.train(args.epochs, args.max_steps)
            profile_window.close()  # a window still recording is written
            if completed:
                recorder.finished(weights_sha256=checkpoint.parameters_digest(model))
                if rank.is_main:
                    if trainer.finished_steps():
                        print(f"finished {trainer.step} steps (max steps)")
                    else:
                        print(f"finished {args.epochs} epoch(s), {trainer.step} steps")
            else:
                recorder.preempted(step=trainer.step, signal=preemption.requested())
                if rank.is_main:
                    print(
                        f"preempted at step {trainer.step}, checkpoint saved in {folder}: "
                        "run again to resume from it",
                        flush=True,
                    )
        finally:
            distributed.destroy_process_group()
    if not completed:
        sys.exit(preemption.PREEMPTED_EXIT)


def parse_args() -> argparse.Namespace:
    """The command line; its defaults are the answers this project was rendered from."""
    nnodes = distributed.env_int("NNODES", NODES)
    nproc_per_node = distributed.env_int("NPROC_PER_NODE", DEVICES_PER_NODE)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launcher", choices=distributed.LAUNCHERS, default=LAUNCHER)
    parser.add_argument("--device", choices=device.REQUESTS, help="npu, auto or cpu")
    parser.add_argument("--nnodes", type=int, default=nnodes)
    parser.add_argument("--node-rank", type=int, help="default: $NODE_RANK, else 0")
    parser.add_argument("--nproc-per-node", type=int, default=nproc_per_node)
    parser.add_argument("--local-rank", "--local_rank", type=int)
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument(
        "--max-steps",
        type=int,
        default=MAX_STEPS,
        help="optimizer steps at most (0: the epochs decide)",
    )
    parser.add_argument("--run-dir", help="default: $NPU_WIZARD_RUN_DIR")
    parser.add_argument("--checkpoint-dir", help="default: $NPU_WIZARD_CHECKPOINT_DIR")
    parser.add_argument("--smoke", action="store_true", help="test the topology only")
    parser.add_argument(
        "--bandwidth",
        action="store_true",
        help="with --smoke: measure all_reduce, all_gather (and reduce_scatter when sharded) "
        "and the links between nodes",
    )
    parser.add_argument(
        "--bandwidth-max-bytes",
        type=int,
        help="largest message of --bandwidth (default 256 MiB, 16 MiB on the CPU)",
    )
    return parser.parse_args()


if __name__ == "__main__":
    args = parse_args()
    if args.launcher == "mp-spawn":
        # train.py is its own launcher here: each worker gets its local rank first; a stop
        # signal reaching this process is passed on to them
        workers = mp.spawn(main, args=(args,), nprocs=args.nproc_per_node, join=False)
        pids = [process.pid for process in workers.processes]
        preemption.install(forward_to=lambda: pids)
        try:
            while not workers.join():
                pass
        except mp.ProcessExitedException as ended:
            if ended.exit_code != preemption.PREEMPTED_EXIT:
                raise
            sys.exit(preemption.PREEMPTED_EXIT)
    else:
        main(args.local_rank, args)
