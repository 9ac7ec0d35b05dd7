"""How the ranks share the model (training.parallelism), applied from outside the model.

ddp keeps the whole model, its gradients and its optimizer state on every rank;
zero1 is DDP with the optimizer state split across the ranks
(ZeroRedundancyOptimizer); fsdp2 splits parameters, gradients and optimizer
state (fully_shard on each block, then on the root). Activation checkpointing
makes each block recompute its activations in the backward pass, under any
mode. The model itself knows none of it.

A whole checkpoint (step-N.pt) holds the model's state dict and the optimizer's
in torch's own form (state keyed by the parameter's place in the optimizer),
whatever the mode that wrote it, so every mode resumes from it. torch is
imported here; torch.distributed's FSDP, ZeRO and checkpoint modules only
inside the functions that use them.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .checkpoint import unwrap
from .errors import SetupError

MODES = ("ddp", "zero1", "fsdp2")


def load_errors() -> tuple[type[BaseException], ...]:
    """What loading a checkpoint that does not fit raises: torch's usual errors, and DCP's
    CheckpointException (a BaseException, which `except Exception` lets through)."""
    try:
        from torch.distributed.checkpoint.api import CheckpointException
    except ImportError:  # a torch without distributed checkpointing
        return (KeyError, RuntimeError, ValueError)
    return (KeyError, RuntimeError, ValueError, CheckpointException)


def model_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks: its `blocks`, ResNet's residual blocks, a Hugging Face model's decoder
    layers, else its layers with parameters."""
    blocks = getattr(model, "blocks", None)
    if isinstance(blocks, nn.ModuleList | nn.Sequential):
        return list(blocks)
    stages = [getattr(model, f"layer{index}", None) for index in range(1, 5)]
    if all(isinstance(stage, nn.Sequential) for stage in stages):
        return [block for stage in stages for block in stage]  # type: ignore[union-attr]
    # a Hugging Face model (model: hf): its decoder layers, the longest list of modules of one kind
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) > 0]
    layers = max(lists, key=len, default=None)
    if layers is not None and len({type(block) for block in layers}) == 1:
        return list(layers)
    return [
        child for child in model.children() if any(True for _ in child.parameters())
    ]


def checkpoint_activations(blocks: list[nn.Module], compiled: bool = False) -> None:
    """Make each block recompute its activations in the backward pass instead of keeping them.

    `compiled`: the blocks run under torch.compile, whose traced recomputation updates no
    batch-norm statistics a second time (and which would break its graph on the contexts
    that keep them in eager mode).
    """
    from torch.utils.checkpoint import checkpoint

    for block in blocks:
        # non-reentrant: works under DDP and fully_shard, and with inputs that need no gradient
        options: dict[str, Any] = {"use_reentrant": False}
        norms = [
            module
            for module in block.modules()
            if isinstance(module, nn.modules.batchnorm._BatchNorm)
            and module.track_running_stats
        ]
        if norms and not compiled:  # the recomputation would count each batch twice
            options["context_fn"] = functools.partial(_recomputed_once, norms)
        block.forward = functools.partial(checkpoint, block.forward, **options)


def _recomputed_once(norms: list[nn.Module]) -> tuple[Any, Any]:
    """checkpoint's contexts: the forward as usual, and a recomputation that leaves the
    batch norms' running statistics as that forward left them."""
    return contextlib.nullcontext(), _statistics_kept(norms)


@contextlib.contextmanager
def _statistics_kept(norms: list[nn.Module]) -> Iterator[None]:
    kept = [
        (
            norm.running_mean.clone(),
            norm.running_var.clone(),
            norm.num_batches_tracked.clone(),
        )
        for norm in norms
    ]
    try:
        yield
    finally:
        with torch.no_grad():
            for norm, (mean, var, count) in zip(norms, kept, strict=True):
                norm.running_mean.copy_(mean)
                norm.running_var.copy_(var)
                norm.num_batches_tracked.copy_(count)


def shard_model(
    model: nn.Module, blocks: list[nn.Module], amp: str, device_type: str
) -> nn.Module:
    """FSDP2: fully_shard each block, then the root; bf16 parameters with fp32 reductions under amp bf16.

    Any cast of the model's dtype must come before this (torch_npu has no DTensor rule for
    npu_dtype_cast): the parameters stay fp32 here and the policy casts the gathered copies.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device_type, (dist.get_world_size(),))
    policy = MixedPrecisionPolicy()
    if amp == "bf16":
        policy = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32
        )
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def zero_redundancy(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """ZeRO-1: the same optimizer (class, parameter groups, settings), its state split across the ranks."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    groups = [dict(group) for group in optimizer.param_groups]
    # the class's own settings only: a subclass's defaults may hold more (AdamW's decoupled_weight_decay)
    accepted = inspect.signature(type(optimizer)).parameters
    settings = {
        key: value for key, value in optimizer.defaults.items() if key in accepted
    }
    return ZeroRedundancyOptimizer(groups, optimizer_class=type(optimizer), **settings)


def is_sharded(model: nn.Module) -> bool:
    """Whether fully_shard split this model's parameters."""
    return any(hasattr(parameter, "full_tensor") for parameter in model.parameters())


def writers(world_size: int, local_world_size: int, shared: bool) -> list[int]:
    """The ranks that write a whole checkpoint: rank 0 on a shared folder, else each node's local rank 0."""
    return [0] if shared else list(range(0, world_size, local_world_size))


def whole_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, mode: str, writing: list[int]
) -> dict[str, Any] | None:
    """The model's and optimizer's whole state on the ranks in `writing` (None on the others).

    Every rank calls it: under zero1 and fsdp2 the state is gathered from all of them.
    """
    rank = dist.get_rank() if dist.is_initialized() else 0
    if mode == "zero1" and dist.is_initialized():
        kept = None
        for writer in writing:  # each consolidation gathers the state on one rank only
            optimizer.consolidate_state_dict(to=writer)  # type: ignore[attr-defined]
            if rank == writer:
                kept = optimizer.state_dict()
        if kept is None:
            return None
        return {"model": unwrap(model).state_dict(), "optimizer": kept}
    if mode == "fsdp2" and is_sharded(model):
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optimizer_state = get_state_dict(model, optimizer)
        keep = rank in writing
        whole_model = _gathered(model_state, keep)
        whole_optimizer = _gathered(optimizer_state, keep)
        if not keep:
            return None
        names = parameter_names(model, optimizer)
        return {
            "model": whole_model,
            "optimizer": optimizer_state_by_index(whole_optimizer, names),
        }
    if rank not in writing and dist.is_initialized():
        return None
    return {"model": unwrap(model).state_dict(), "optimizer": optimizer.state_dict()}


def _gathered(value: Any, keep: bool) -> Any:
    """`value` with each shard replaced by the whole tensor on the CPU (every rank gathers; `keep` keeps it)."""
    if isinstance(value, Mapping):
        return {key: _gathered(item, keep) for key, item in value.items()}
    if isinstance(value, list):
        return [_gathered(item, keep) for item in value]
    if hasattr(value, "full_tensor"):
        whole = value.full_tensor()  # a collective: one tensor at a time on the device
        return whole.cpu() if keep else None
    if isinstance(value, torch.Tensor):
        return value.cpu() if keep else None
    return value


def parameter_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """Each parameter's name in the order the optimizer holds them (torch's state dict keys them by place)."""
    names = {parameter: name for name, parameter in unwrap(model).named_parameters()}
    return [
        names[parameter]
        for group in optimizer.param_groups
        for parameter in group["params"]
    ]


def optimizer_state_by_name(
    state: Mapping[str, Any], names: list[str]
) -> dict[str, Any]:
    """torch's optimizer state dict (keyed by place) keyed by parameter name, as get_state_dict keys it."""
    return {
        "state": {names[index]: value for index, value in state["state"].items()},
        "param_groups": [
            {**group, "params": [names[index] for index in group["params"]]}
            for group in state["param_groups"]
        ],
    }


def optimizer_state_by_index(
    state: Mapping[str, Any], names: list[str]
) -> dict[str, Any]:
    """An optimizer state dict keyed by parameter name back in torch's own form (keyed by place)."""
    place = {name: index for index, name in enumerate(names)}
    return {
        "state": {place[name]: value for name, value in state["state"].items()},
        "param_groups": [
            {**group, "params": [place[name] for name in group["params"]]}
            for group in state["param_groups"]
        ],
    }


def load_whole_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, state: Mapping[str, Any]
) -> None:
    """Load a whole checkpoint's model and optimizer state under any mode (each shard takes its part)."""
    if not is_sharded(model):
        unwrap(model).load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])  # ZeRO-1 keeps this rank's part
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    named = optimizer_state_by_name(
        state["optimizer"], parameter_names(model, optimizer)
    )
    set_state_dict(
        model,
        optimizer,
        model_state_dict=dict(state["model"]),
        optim_state_dict=named,
        options=StateDictOptions(full_state_dict=True),
    )


def load_sharded_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path, mode: str
) -> None:
    """Load a sharded checkpoint folder (one shard per rank, any world size) under fsdp2 or ddp."""
    if mode == "zero1":
        raise SetupError(
            f"{folder} is a sharded (fsdp2) checkpoint, which ZeroRedundancyOptimizer cannot load: resume it "
            "once with training.parallelism ddp or fsdp2 (their next checkpoint loads under zero1), or run "
            "with --fresh"
        )
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    # the state to read into: shards under fsdp2, whole tensors under ddp (every rank reads every shard)
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=str(folder))
    set_state_dict(
        model,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optimizer"],
    )
