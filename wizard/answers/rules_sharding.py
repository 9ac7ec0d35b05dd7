"""Rules for training.parallelism (ASCEND.md, "Sharded training on NPU"), as plain functions (see rules.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from wizard.answers import hardware
from wizard.answers.storage import shared_from_values
from wizard.errors import Problem

Values = Mapping[str, Any]
FULLY_SHARD_TORCH = (2, 6, 0)  # torch.distributed.fsdp.fully_shard is public from torch 2.6


def fsdp2_fits_release(v: Values) -> Iterator[Problem]:
    """fully_shard needs torch 2.6; on an NPU the A2/A3 series and torch_npu 2.6 (warned below 2.7.1)."""
    if v["training.parallelism"] != "fsdp2":
        return
    torch = hardware.parse_version(v["environment.torch_version"])
    if torch is not None and torch[:3] < FULLY_SHARD_TORCH:
        yield Problem(
            "training.parallelism",
            "fsdp2",
            f"torch {v['environment.torch_version']} has no torch.distributed.fsdp.fully_shard (public from torch "
            "2.6): choose zero1 or ddp, or a newer environment.torch_version",
        )
    if v["device"] == "cpu":
        return
    npu = v["environment.torch_npu_version"]
    if v["hardware"] == "atlas-training":
        yield Problem(
            "training.parallelism",
            "fsdp2",
            "torch_npu supports fully_shard (FSDP2) and distributed checkpoints on the Atlas A2 and A3 series, "
            "not on the Atlas training series (Ascend 910): choose zero1 (ZeroRedundancyOptimizer runs on every "
            "series) or ddp",
        )
    elif not hardware.has_fully_shard(npu):
        yield Problem(
            "training.parallelism",
            "fsdp2",
            f"FSDP2 on an NPU needs torch_npu 2.6 or later (torch_npu {npu} is older): choose zero1 or ddp, or a "
            "newer environment.torch_npu_version",
        )
    elif not hardware.fully_shard_field_tested(npu):
        yield Problem(
            "training.parallelism",
            "fsdp2",
            f"torch_npu's API docs list fully_shard from 2.7.1; users report FSDP2 failures on older releases "
            f"(this is {npu}): prefer environment.torch_npu_version 2.7.1 or later",
            "warning",
        )


def fsdp2_without_fp16(v: Values) -> Iterator[Problem]:
    """FSDP2 trains in bf16 or fp32: its mixed precision keeps no loss scaler for fp16."""
    if v["training.parallelism"] == "fsdp2" and v["amp"] == "fp16":
        yield Problem(
            "amp",
            "fp16",
            "refused with training.parallelism fsdp2: sharded training is done as torchtitan and MindSpeed-LLM do "
            "it, bf16 parameters with fp32 reductions, and fp16 would need a loss scaler that works on shards; "
            "choose bf16 (Atlas A2/A3) or off, or ddp / zero1 for fp16",
        )


def fsdp2_checkpoint_storage(v: Values) -> Iterator[Problem]:
    """Sharded checkpoints need one folder every rank reaches; without it rank 0 of each node saves it whole."""
    if v["training.parallelism"] != "fsdp2" or shared_from_values(v):
        return
    yield Problem(
        "training.parallelism",
        "fsdp2",
        "the ranks of this project reach no common checkpoint folder (each host or pod keeps its own), and a "
        "sharded checkpoint is one folder that every rank writes its shard into: train.py instead gathers the "
        "whole model and optimizer state to each node's local rank 0 at every save, which writes it as one "
        "file. That costs, per save, a gather of all the state over the network and host memory for all of it "
        "(about 12 bytes per parameter with AdamW) on those ranks. For sharded checkpoints run where the nodes "
        "share the project's folder (cluster.engine slurm) or simulate the nodes on this host",
        "warning",
    )


SHARDING_RULES: tuple[tuple[tuple[str, ...], Callable[[Values], Iterator[Problem]]], ...] = (
    (
        (
            "training.parallelism",
            "device",
            "hardware",
            "environment.torch_version",
            "environment.torch_npu_version",
        ),
        fsdp2_fits_release,
    ),
    (("training.parallelism", "amp"), fsdp2_without_fp16),
    (("training.parallelism", "nodes", "cluster.engine"), fsdp2_checkpoint_storage),
)
