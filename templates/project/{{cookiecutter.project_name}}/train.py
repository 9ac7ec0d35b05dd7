{% if cookiecutter.parallelism == "fsdp2" -%}
"""Train {{ cookiecutter.project_name }} with FSDP2 (fully_shard), one process per device.
{%- elif cookiecutter.parallelism == "zero1" -%}
"""Train {{ cookiecutter.project_name }} with DistributedDataParallel and ZeRO-1, one process per device.
{%- else -%}
"""Train {{ cookiecutter.project_name }} with DistributedDataParallel, one process per device.
{%- endif %}

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
{%- if cookiecutter.parallelism != "fsdp2" %}
from torch.nn.parallel import DistributedDataParallel as DDP
{%- endif %}
{%- if cookiecutter.tensorboard == "true" %}
from torch.utils.tensorboard import SummaryWriter
{%- endif %}

{% if cookiecutter.model == "gpt" -%}
from model import GPT, GPTConfig, next_token_loss
{% elif cookiecutter.model == "hf" -%}
from hf_model import CausalLM, load_causal_lm, next_token_loss
{% endif -%}
from runtime import (
    amp,
    checkpoint,
{%- if cookiecutter.compile != "off" %}
    compiled,
{%- endif %}
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
{%- if cookiecutter.dataset == "tokens" %}
    tokens,
{%- endif %}
)
from runtime.errors import SetupError

PROJECT_DIR = Path(__file__).resolve().parent
DEVICE = {{ cookiecutter.device|tojson }}
LAUNCHER = {{ cookiecutter.launcher|tojson }}
NODES = {{ cookiecutter.nodes|int }}
DEVICES_PER_NODE = {{ cookiecutter.devices_per_node|int }}
AMP = {{ cookiecutter.amp|tojson }}
{%- if cookiecutter.compile != "off" %}
COMPILE = {{ cookiecutter.compile|tojson }}  # the forward and loss, with torch.compile or TorchAir
{%- endif %}
PROJECT = {{ cookiecutter.project_name|tojson }}  # kept in each checkpoint: a shared folder is refused
{%- if cookiecutter.parallelism == "fsdp2" %}
# training.parallelism: parameters, gradients and optimizer state split across the ranks
PARALLELISM = "fsdp2"
{%- if cookiecutter|shared_checkpoints %}
# every rank reaches the checkpoint folder: one shard per rank
SHARDED_CHECKPOINTS = True
{%- else %}
# no checkpoint folder every rank reaches (each host keeps its own): each node's local rank 0
# gathers the whole state at every save and writes it as one file
SHARDED_CHECKPOINTS = False
{%- endif %}
{%- elif cookiecutter.parallelism == "zero1" %}
# training.parallelism: DDP, the optimizer state split across the ranks
# (ZeroRedundancyOptimizer)
PARALLELISM = "zero1"
{%- if cookiecutter|shared_checkpoints %}
# rank 0 gathers the optimizer state and writes the one checkpoint
SHARED_CHECKPOINTS = True
{%- else %}
# each node's local rank 0 gathers the optimizer state and writes a copy
SHARED_CHECKPOINTS = False
{%- endif %}
{%- else %}
PARALLELISM = "ddp"  # training.parallelism: the whole model on every rank
{%- endif %}
BATCH_SIZE = {{ cookiecutter.batch_size|int }}  # per device; the global batch is this x world size
{%- if cookiecutter.lr %}
LR = {{ cookiecutter.lr|float }}
{%- else %}
BASE_BATCH_SIZE = {{ cookiecutter.base_batch_size|int }}  # the single-card batch ...
BASE_LR = {{ cookiecutter.base_lr|float }}  # ... and learning rate to scale from
{%- if cookiecutter.warmup_steps|int == 0 %}
WARMUP_EPOCHS = {{ cookiecutter.warmup_epochs|int }}  # from BASE_LR up to the scaled rate
{%- endif %}
{%- endif %}
{%- if cookiecutter.warmup_steps|int > 0 %}
WARMUP_STEPS = {{ cookiecutter.warmup_steps|int }}  # optimizer steps from 0 up to the peak rate
{%- endif %}
{%- if cookiecutter.lr_schedule == "cosine" %}
MIN_LR = {{ cookiecutter.min_lr|float }}  # the cosine's end, at the last step
{%- endif %}
EPOCHS = {{ cookiecutter.epochs|int }}
MAX_STEPS = {{ cookiecutter.max_steps|int }}  # optimizer steps, or the epochs: whichever ends first
GRAD_ACCUM = {{ cookiecutter.grad_accum|int }}  # micro-batches per optimizer step
GRAD_CLIP = {{ cookiecutter.grad_clip|float }}  # the gradients' largest global norm (0.0: no clipping)
SEED = {{ cookiecutter.seed|int }}
CHECKPOINT_EVERY = {{ cookiecutter.checkpoint_every|int }}  # steps; 0: at epoch ends only
LOG_EVERY = {{ cookiecutter.log_every|int }}  # steps; the loss is read only this often
{%- if cookiecutter.dataset == "synthetic" %}
SAMPLES = {{ cookiecutter.samples|int }}
{%- if cookiecutter.model == "mlp" %}
INPUT_SHAPE = (64,)
{%- elif cookiecutter.model == "convnet" %}
INPUT_SHAPE = (1, 28, 28)
{%- else %}
INPUT_SHAPE = (3, 32, 32)
{%- endif %}
{%- else %}
DATA_DIR = PROJECT_DIR / {{ cookiecutter.data_dir|tojson }}
{%- endif %}
EVAL_EVERY = {{ cookiecutter.eval_every|int }}  # optimizer steps between validation losses (0: never)
{%- if cookiecutter.dataset == "tokens" %}
EVAL_BATCHES = 8  # batches of val.bin per rank at each validation
{%- else %}
EVAL_BATCHES = 8  # batches of the held-out samples per rank at each validation, at most
VAL_FRACTION = 0.1  # of the samples, held out with EVAL_EVERY, never trained on
{%- endif %}
{%- if cookiecutter.model == "gpt" %}
{%- set gpt = cookiecutter|gpt_config %}
# the model's shape: training.gpt_size {{ cookiecutter.gpt_size }} with the overrides of the answers
N_LAYER = {{ gpt.n_layer|int }}
N_HEAD = {{ gpt.n_head|int }}
N_EMBD = {{ gpt.n_embd|int }}
BLOCK_SIZE = {{ gpt.block_size|int }}  # tokens of context; a window is one more
DROPOUT = {{ gpt.dropout|float }}
{%- if cookiecutter.peak_tflops %}
PEAK_TFLOPS = {{ cookiecutter.peak_tflops|float }}  # per device, at the training precision: the MFU's denominator
{%- else %}
PEAK_TFLOPS = None  # training.peak_tflops: set it to report the model FLOPs utilisation
{%- endif %}
{%- elif cookiecutter.model == "hf" %}
# the Hugging Face causal LM saved in this folder (training.hf_model_path), read from disk only
HF_MODEL_PATH = PROJECT_DIR / {{ cookiecutter.hf_model_path|tojson }}
BLOCK_SIZE = {{ (cookiecutter.block_size or 1024)|int }}  # tokens of context; a window is one more
{%- if cookiecutter.peak_tflops %}
PEAK_TFLOPS = {{ cookiecutter.peak_tflops|float }}  # per device, at the training precision: the MFU's denominator
{%- else %}
PEAK_TFLOPS = None  # training.peak_tflops: set it to report the model FLOPs utilisation
{%- endif %}
{%- endif %}
{%- if cookiecutter.dataset == "imagefolder" %}
{%- if cookiecutter.model == "resnet18" %}
IMAGE_SIZE = 224
{%- else %}
IMAGE_SIZE = 64
{%- endif %}
LOADER_WORKERS = 4  # per rank
{%- endif %}
# HCCL_EXEC_TIMEOUT (the launch scripts export it): how long a collective waits for
# a slow rank; the process group's own timeout is set beyond it
HCCL_EXEC_TIMEOUT_S = {{ cookiecutter.exec_timeout|int }}


def ddp_setup(rank: distributed.RankInfo, requested: str) -> torch.device:
    """Bind this rank to its device and join the process group."""
    choice = device.select_device(requested)
    target = device.bind_device(choice, rank.local_rank, rank.local_world_size)
{%- if cookiecutter.hardware == "atlas-training" %}
    # Ascend 910 otherwise compiles each operator online
    device.use_binary_kernels(choice)
{%- endif %}
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
{%- if cookiecutter.parallelism == "fsdp2" %}
    """Trains on this rank's batches and shards; every rank saves its shard of each checkpoint."""
{%- else %}
    """Trains on this rank's batches; local rank 0 of each node saves checkpoints."""
{%- endif %}

    def __init__(
        self,
        model: nn.Module,
{%- if cookiecutter.dataset == "tokens" %}
        train_data: tokens.TokenBatches,
        val_data: tokens.TokenBatches | None,
{%- else %}
        train_data: data.TensorBatches | data.LoaderBatches,
        val_data: data.TensorBatches | data.LoaderBatches | None,
{%- endif %}
        optimizer: torch.optim.Optimizer,
        lr_schedule: schedule.LinearWarmup,
        rank: distributed.RankInfo,
        target: torch.device,
        recorder: events.EventWriter,
        checkpoint_dir: Path,
{%- if cookiecutter.tensorboard == "true" %}
        tensorboard_dir: Path,
{%- endif %}
    ) -> None:
        self.rank = rank
        self.device = target
        self.model = model
        self.train_data = train_data
        self.val_data = val_data
        self.optimizer = optimizer
        self.lr_schedule = lr_schedule
{%- if cookiecutter.amp == "fp16" %}
        self.scaler = amp.grad_scaler(target.type, AMP)  # dynamic loss scaling for fp16
{%- endif %}
{%- if cookiecutter.model in ["gpt", "hf"] %}
        self.loss_fn = next_token_loss
        self.flops_per_token = model.flops_per_token()  # for the MFU
{%- else %}
        self.loss_fn = nn.CrossEntropyLoss()
{%- endif %}
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
{%- if cookiecutter.parallelism == "zero1" %}
        self.writers = sharding.writers(
            rank.world_size, rank.local_world_size, shared=SHARED_CHECKPOINTS
        )
{%- else %}
        # local rank 0 of each node writes the whole checkpoint: no shared storage needed
        self.writers = sharding.writers(
            rank.world_size, rank.local_world_size, shared=False
        )
{%- endif %}
        # the newest checkpoint every rank can load (a damaged one is set aside): a
        # sharded step folder or a whole step-N.pt, whichever mode wrote it
        resumed = sharded_checkpoint.resume_point(checkpoint_dir, project=PROJECT)
        if resumed is not None:
            self._load_checkpoint(*resumed)
{%- if cookiecutter.tensorboard == "true" %}
        # rank 0 writes the logged steps for TensorBoard; a resumed run drops those it repeats
        self.board = None
        if rank.is_main:
            purge_step = self.step + 1 if resumed is not None else None
            self.board = SummaryWriter(tensorboard_dir, purge_step=purge_step)
{%- endif %}
{%- if cookiecutter.parallelism != "fsdp2" %}
        # a single process has no gradients to average: DDP would only cost time
        if rank.world_size > 1:
            device_ids = None if target.type == "cpu" else [target.index]
            # Huawei's DDP settings: no buffer broadcast each step, gradients kept in the buckets;
            # without the broadcast no collective runs in forward, so its time is this rank's own
            self.model = DDP(
                self.model,
                device_ids=device_ids,
                broadcast_buffers=False,
                gradient_as_bucket_view=True,
            )
{%- endif %}
{%- if cookiecutter.compile != "off" %}
        # compiled at the first step, eager if that fails; self.model stays the module
        # itself, so checkpoints hold its own keys and load compiled or not
        self.forward_loss = compiled.CompiledStep(
            self._forward_loss, COMPILE, target.type
        )
{%- endif %}

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
{%- if cookiecutter.amp == "fp16" %}
        amp.restore_scaler(self.scaler, state["scaler"])
{%- endif %}
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
{%- if cookiecutter.dataset == "tokens" %}
        # each rank reads windows of its own part of the tokens, a part that changes with
        # the number of ranks: the same share of the epoch is done, not the same windows
        where = (
            f"the same share of epoch {self.epoch + 1} "
            "(other windows: each rank reads its own part)"
        )
{%- else %}
        # the ranks deal one shuffled order of the epoch's samples between them: b batches on
        # W ranks are its first b * W * BATCH_SIZE samples, whatever W is
        done = self.batches_done * self.rank.world_size * BATCH_SIZE
        where = f"the first {done} samples of epoch {self.epoch + 1}"
{%- endif %}
        if self.rank.is_main:
            events.warn(
                f"the checkpoint was written by {saved_world} ranks and resumes on "
                f"{self.rank.world_size}: the model and optimizer state load onto them, "
                f"training goes on after {where}, and the learning-rate schedule is laid "
{%- if cookiecutter.lr %}
                "out again over the steps left",
{%- else %}
                "out again over the steps left, scaled to the global batch of "
                f"{self.rank.world_size} ranks",
{%- endif %}
                "resume",
            )

    def steps_left(self, steps_per_epoch: int, epochs: int) -> int:
        """Optimizer steps from where the run stands to the end of its last epoch."""
        this_epoch = (len(self.train_data) - self.batches_done) // GRAD_ACCUM
        return max(0, this_epoch) + steps_per_epoch * max(0, epochs - self.epoch - 1)
{%- if cookiecutter.compile != "off" %}

    def _forward_loss(
        self, inputs: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        return self.loss_fn(self.model(inputs), targets)

    def _forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with self.timer.forward(), amp.autocast(self.device.type, AMP):
            return self.forward_loss(inputs, targets)

    def _forward_afresh(
        self, inputs: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        # only ever at the very first backward (the first micro-batch): no earlier gradient is lost
        self.optimizer.zero_grad(set_to_none=True)
        return self._forward(inputs, targets)

    def _run_step(self, micro_batches: list[data.Batch]) -> torch.Tensor:
        """One optimizer step over `micro_batches`; their mean loss."""
        self.optimizer.zero_grad(set_to_none=True)
        losses = []
        for index, (inputs, targets) in enumerate(micro_batches):
            inputs = inputs.to(self.device, non_blocking=True)
            targets = targets.to(self.device, non_blocking=True)
            with self._sync_gradients(index == len(micro_batches) - 1):
                loss = self._micro_step(inputs, targets, len(micro_batches))
            losses.append(loss.detach())
        self._optimizer_step()
        return torch.stack(losses).mean()

    def _micro_step(
        self, inputs: torch.Tensor, targets: torch.Tensor, micro_batches: int
    ) -> torch.Tensor:
        loss = self._forward(inputs, targets)
        # the backward compiles at the first one (TorchAir): where that fails, the
        # micro-batch runs again eagerly
        return self.forward_loss.backward(
            loss,
            lambda loss: self._backward(loss / micro_batches),
            lambda: self._forward_afresh(inputs, targets),
        )
{%- else %}

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
{%- endif %}
{%- if cookiecutter.parallelism == "fsdp2" %}

    def _sync_gradients(self, sync: bool) -> contextlib.AbstractContextManager[None]:
        # FSDP2 reduce-scatters the gradients in every backward: the inner micro-batches
        # keep this rank's own, the last one reduces the sum once
        self.model.set_requires_gradient_sync(sync)
        return contextlib.nullcontext()
{%- else %}

    def _sync_gradients(self, sync: bool) -> contextlib.AbstractContextManager[None]:
        # DDP averages the gradients across ranks in every backward: the inner micro-batches
        # only add to this rank's own (no_sync), the last one averages the sum once
        if sync or not isinstance(self.model, DDP):
            return contextlib.nullcontext()
        return self.model.no_sync()
{%- endif %}

    def _backward(self, loss: torch.Tensor) -> None:
{%- if cookiecutter.amp == "fp16" %}
        self.scaler.scale(loss).backward()
{%- else %}
        loss.backward()
{%- endif %}

    def _optimizer_step(self) -> None:
{%- if cookiecutter.amp == "fp16" %}
        if GRAD_CLIP:
            # clip the true gradients, not the scaled ones
            self.scaler.unscale_(self.optimizer)
            nn.utils.clip_grad_norm_(self.model.parameters(), GRAD_CLIP)
        self.scaler.step(self.optimizer)
        self.scaler.update()
{%- else %}
        if GRAD_CLIP:
            nn.utils.clip_grad_norm_(self.model.parameters(), GRAD_CLIP)
        self.optimizer.step()
{%- endif %}

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
{%- if cookiecutter.model in ["gpt", "hf"] %}
        throughput = {"tokens_per_s": samples_per_s * BLOCK_SIZE}
        if PEAK_TFLOPS and self.device.type != "cpu":
            # model FLOPs utilisation: the FLOPs one device does per second against its peak
            tokens_per_device = throughput["tokens_per_s"] / self.rank.world_size
            device_flops = self.flops_per_token * tokens_per_device
            throughput["mfu"] = device_flops / (PEAK_TFLOPS * 1e12)
{%- endif %}
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
{%- if cookiecutter.model in ["gpt", "hf"] %}
            **throughput,
{%- endif %}
        )
{%- if cookiecutter.tensorboard == "true" %}
        if self.board is not None:
            self.board.add_scalar("train/loss", value, self.step)
            self.board.add_scalar("train/lr", lr, self.step)
            self.board.add_scalar("train/samples_per_s", samples_per_s, self.step)
{%- endif %}
        if self.rank.is_main:
{%- if cookiecutter.model in ["gpt", "hf"] %}
            mfu = f", MFU {throughput['mfu']:.1%}" if "mfu" in throughput else ""
            print(
                f"step {self.step}: loss {value:.4f}, {throughput['tokens_per_s']:,.0f} tokens/s{mfu}, lr {lr:.4g}",
                flush=True,
            )
{%- else %}
            print(
                f"epoch {self.epoch + 1} step {self.step}: loss {value:.4f}, "
                f"{samples_per_s:,.0f} samples/s, lr {lr:.4g}",
                flush=True,
            )
{%- endif %}

    def _evaluate(self) -> float:
{%- if cookiecutter.dataset == "tokens" %}
        """The validation loss: the same EVAL_BATCHES batches of val.bin on every rank, averaged over all."""
{%- else %}
        """The validation loss: the same held-out batches (EVAL_BATCHES at most) on every rank, averaged over all."""
{%- endif %}
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
{%- if cookiecutter.amp == "fp16" %}
        training["scaler"] = self.scaler.state_dict()
{%- endif %}
{%- if cookiecutter.parallelism == "fsdp2" %}
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
{%- elif cookiecutter.parallelism == "zero1" %}
        # the model is whole on every rank; the optimizer state is consolidated (gathered)
        # on the writing ranks, so the checkpoint loads under any parallelism
{%- else %}
        # one copy per node (the weights are equal on every rank): no shared storage needed
{%- endif %}
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
{%- if cookiecutter.tensorboard == "true" %}
        try:
            return self._run_epochs(max_epochs)
        finally:
            if self.board is not None:
                self.board.close()  # writes out the steps still buffered
{%- else %}
        return self._run_epochs(max_epochs)
{%- endif %}

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
{%- if cookiecutter.lr %}
    """The job's learning rate per step: LR, as given in the answers{% if cookiecutter.warmup_steps|int > 0 %}, reached over WARMUP_STEPS{% endif %}."""
{%- if cookiecutter.warmup_steps|int > 0 %}
    warmup = schedule.LinearWarmup(0.0, LR, warmup_steps=WARMUP_STEPS)
{%- else %}
    warmup = schedule.LinearWarmup(LR, LR, warmup_steps=0)
{%- endif %}
{%- else %}
    """The job's learning rate per step: scaled linearly with the global batch.
{%- if cookiecutter.warmup_steps|int > 0 %}

    It climbs there from 0 over the first WARMUP_STEPS optimizer steps.
{%- else %}

    When that raises it above BASE_LR, it climbs there from BASE_LR over
    WARMUP_EPOCHS epochs (Goyal et al. 2017).
{%- endif %}
    """
    global_batch = BATCH_SIZE * GRAD_ACCUM * world_size
    scaled_lr = BASE_LR * global_batch / BASE_BATCH_SIZE
{%- if cookiecutter.warmup_steps|int > 0 %}
    warmup = schedule.LinearWarmup(0.0, scaled_lr, warmup_steps=WARMUP_STEPS)
{%- else %}
    warmup = schedule.LinearWarmup.scaled(
        BASE_LR, scaled_lr, WARMUP_EPOCHS, steps_per_epoch
    )
{%- endif %}
{%- endif %}
{%- if cookiecutter.lr_schedule == "cosine" %}
    return warmup.with_cosine(total_steps, MIN_LR)  # down to MIN_LR at the end
{%- else %}
    return warmup
{%- endif %}


# ---- yours: the data and the model ------------------------------------------------
# Replace load_train_data and build_model (and anything between these two markers)
# with your own. npu-wizard renders this part from training.dataset and
# training.model only, so `npu-wizard update` keeps your version through every
# other change of the answers: nodes, launcher, precision, versions.
{%- if cookiecutter.dataset != "tokens" %}


def held_out_split(
    samples: int, rank: distributed.RankInfo
) -> tuple[torch.Tensor, torch.Tensor]:
    """(kept, held out) sample indices: VAL_FRACTION of them drawn with SEED, the same on every rank."""
    return data.held_out_split(
        samples,
        VAL_FRACTION,
        SEED,
        batch_size=BATCH_SIZE,
        world_size=rank.world_size,
    )
{%- endif %}
{%- if cookiecutter.dataset == "synthetic" %}


def load_train_data(
    rank: distributed.RankInfo, target: torch.device
) -> tuple[data.TensorBatches, data.DataSpec]:
    """The synthetic dataset: learnable, seeded, the same tensors made on every rank (less the held-out part)."""
    spec = data.DataSpec(input_shape=INPUT_SHAPE, num_classes=10)
    features, labels = data.synthetic_tensors(SAMPLES, INPUT_SHAPE, 10, SEED)
    if EVAL_EVERY:
        kept, _ = held_out_split(len(labels), rank)
        features, labels = features[kept], labels[kept]
    train_data = data.TensorBatches(
        features,
        labels,
        BATCH_SIZE,
        rank=rank.rank,
        world_size=rank.world_size,
        seed=SEED,
    )
    return train_data.to(target), spec


def load_val_data(
    rank: distributed.RankInfo, target: torch.device
) -> data.TensorBatches | None:
    """The held-out synthetic samples, this rank's part of them (None with EVAL_EVERY 0: nothing is held out)."""
    if not EVAL_EVERY:
        return None
    features, labels = data.synthetic_tensors(SAMPLES, INPUT_SHAPE, 10, SEED)
    _, held = held_out_split(len(labels), rank)
    val_data = data.TensorBatches(
        features[held],
        labels[held],
        BATCH_SIZE,
        rank=rank.rank,
        world_size=rank.world_size,
        seed=SEED,
    )
    return val_data.to(target)
{%- elif cookiecutter.dataset == "mnist" %}


def fetch_mnist(rank: distributed.RankInfo) -> None:
    """Download MNIST into DATA_DIR once per node (--download-data)."""
    if rank.local_rank == 0:
        data.mnist_tensors(DATA_DIR, download=True)
    torch.distributed.barrier()  # the other ranks read what local rank 0 fetched


def load_train_data(
    rank: distributed.RankInfo, target: torch.device
) -> tuple[data.TensorBatches, data.DataSpec]:
    """MNIST from DATA_DIR, held on the device as whole tensors (less the held-out part)."""
    features, labels = data.mnist_tensors(DATA_DIR)
    spec = data.DataSpec(input_shape=(1, 28, 28), num_classes=10)
    if EVAL_EVERY:
        kept, _ = held_out_split(len(labels), rank)
        features, labels = features[kept], labels[kept]
    train_data = data.TensorBatches(
        features,
        labels,
        BATCH_SIZE,
        rank=rank.rank,
        world_size=rank.world_size,
        seed=SEED,
    )
    return train_data.to(target), spec


def load_val_data(
    rank: distributed.RankInfo, target: torch.device
) -> data.TensorBatches | None:
    """The held-out MNIST samples, this rank's part of them (None with EVAL_EVERY 0: nothing is held out)."""
    if not EVAL_EVERY:
        return None
    features, labels = data.mnist_tensors(DATA_DIR)
    _, held = held_out_split(len(labels), rank)
    val_data = data.TensorBatches(
        features[held],
        labels[held],
        BATCH_SIZE,
        rank=rank.rank,
        world_size=rank.world_size,
        seed=SEED,
    )
    return val_data.to(target)
{%- elif cookiecutter.dataset == "tokens" %}


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
{%- else %}


def load_train_data(
    rank: distributed.RankInfo, target: torch.device
) -> tuple[data.LoaderBatches, data.DataSpec]:
    """An image folder under DATA_DIR (one sub-folder per class) through a DataLoader (less the held-out part)."""
    dataset = data.image_folder(DATA_DIR, IMAGE_SIZE)
    spec = data.DataSpec(
        input_shape=(3, IMAGE_SIZE, IMAGE_SIZE), num_classes=len(dataset.classes)
    )
    if EVAL_EVERY:
        kept, _ = held_out_split(len(dataset), rank)
        dataset = torch.utils.data.Subset(dataset, kept.tolist())
    train_data = data.LoaderBatches(
        dataset,
        BATCH_SIZE,
        rank=rank.rank,
        world_size=rank.world_size,
        seed=SEED,
        workers=LOADER_WORKERS,
        device_type=target.type,
    )
    return train_data, spec


def load_val_data(
    rank: distributed.RankInfo, target: torch.device
) -> data.LoaderBatches | None:
    """The held-out images, resized without augmentation, this rank's part (None with EVAL_EVERY 0: none held out)."""
    if not EVAL_EVERY:
        return None
    dataset = data.image_folder(DATA_DIR, IMAGE_SIZE, augment=False)
    _, held = held_out_split(len(dataset), rank)
    return data.LoaderBatches(
        torch.utils.data.Subset(dataset, held.tolist()),
        BATCH_SIZE,
        rank=rank.rank,
        world_size=rank.world_size,
        seed=SEED,
        workers=LOADER_WORKERS,
        device_type=target.type,
    )
{%- endif %}
{%- if cookiecutter.model == "mlp" %}


def build_model(spec: data.DataSpec) -> nn.Module:
    """A small multi-layer perceptron over the flattened input."""
    features = torch.Size(spec.input_shape).numel()
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(features, 256),
        nn.ReLU(),
        nn.Linear(256, 256),
        nn.ReLU(),
        nn.Linear(256, spec.num_classes),
    )
{%- elif cookiecutter.model == "convnet" %}


def build_model(spec: data.DataSpec) -> nn.Module:
    """A small convolutional network for MNIST-shaped images."""
    channels = spec.input_shape[0]
    return nn.Sequential(
        nn.Conv2d(channels, 32, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(7),
        nn.Flatten(),
        nn.Linear(64 * 7 * 7, 128),
        nn.ReLU(),
        nn.Linear(128, spec.num_classes),
    )
{%- elif cookiecutter.model == "gpt" %}


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
{%- elif cookiecutter.model == "hf" %}


def build_model(spec: data.DataSpec) -> CausalLM:
    """The Hugging Face causal LM saved in HF_MODEL_PATH, read from disk only, for the token data's vocabulary."""
    return load_causal_lm(HF_MODEL_PATH, BLOCK_SIZE, spec.num_classes)
{%- else %}


def build_model(spec: data.DataSpec) -> nn.Module:
    """torchvision's ResNet-18, with as many input channels as the data has."""
    from torchvision.models import resnet18

    model = resnet18(num_classes=spec.num_classes)
    channels = spec.input_shape[0]
    if channels != 3:
        model.conv1 = nn.Conv2d(
            channels, 64, kernel_size=7, stride=2, padding=3, bias=False
        )
    return model
{%- endif %}


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
{%- if cookiecutter.dataset == "mnist" %}
            if args.download_data:
                fetch_mnist(rank)
{%- endif %}
            train_data, spec = load_train_data(rank, target)
            val_data = load_val_data(rank, target)
            # the model's dtype is set here, before any sharding
            model = build_model(spec).to(target)
{%- if cookiecutter.activation_checkpointing == "true" %}
            # training.activation_checkpointing: each block recomputes its activations in
            # the backward pass instead of keeping them; wrapped before any sharding
{%- if cookiecutter.compile != "off" %}
            sharding.checkpoint_activations(sharding.model_blocks(model), compiled=True)
{%- else %}
            sharding.checkpoint_activations(sharding.model_blocks(model))
{%- endif %}
{%- endif %}
{%- if cookiecutter.parallelism == "fsdp2" %}
            # fully_shard each block, then the root{% if cookiecutter.amp == "bf16" %}: bf16 parameters in compute, fp32 reductions{% endif %}
            sharding.shard_model(model, sharding.model_blocks(model), AMP, target.type)
{%- endif %}
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
{%- if cookiecutter.model in ["gpt", "hf"] %}
            optimizer = model.configure_optimizer(lr_schedule.lr_at(0))
{%- else %}
            optimizer = torch.optim.SGD(
                model.parameters(), lr=lr_schedule.lr_at(0), momentum=0.9
            )
{%- endif %}
{%- if cookiecutter.parallelism == "zero1" %}
            # ZeRO-1: each rank keeps and steps only its share of the optimizer state
            optimizer = sharding.zero_redundancy(optimizer)
{%- endif %}
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
{%- if cookiecutter.tensorboard == "true" %}
                run_dir / "tensorboard",
{%- endif %}
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
{%- if cookiecutter.dataset == "mnist" %}
    parser.add_argument("--download-data", action="store_true", help="fetch MNIST")
{%- endif %}
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
