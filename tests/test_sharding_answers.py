"""training.parallelism and training.activation_checkpointing in the answers (issue 39): questions, rules, render."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from wizard.answers.model import resolve
from wizard.errors import AnswersError
from wizard.render.render import render

NPU_A2 = {
    "project_name": "shards",
    "hardware": "atlas-a2",
    "device": "npu",
    "nodes": 2,
    "devices_per_node": 8,
    "network.host_ips": ["10.0.0.1", "10.0.0.2"],
    "amp": "bf16",
    "environment.torch_npu_version": "2.7.1",
    "environment.torch_version": "2.7.1",
}


def problems_of(raw: dict[str, Any]) -> list[tuple[str, str]]:
    """(field, message) of every error the answers raise."""
    with pytest.raises(AnswersError) as raised:
        resolve(raw)
    return [(problem.field, problem.message) for problem in raised.value.problems]


def warnings_of(raw: dict[str, Any]) -> list[tuple[str, str]]:
    """(field, message) of every warning of answers that resolve."""
    return [(problem.field, problem.message) for problem in resolve(raw).warnings]


def test_the_defaults_are_ddp_without_activation_checkpointing() -> None:
    answers = resolve(NPU_A2)
    assert answers["training.parallelism"] == "ddp"
    assert answers["training.activation_checkpointing"] is False


def test_fsdp2_on_the_atlas_training_series_with_fp16_is_refused_with_both_reasons_at_once() -> None:
    found = problems_of(
        {
            **NPU_A2,
            "hardware": "atlas-training",
            "amp": "fp16",
            "training.parallelism": "fsdp2",
            "environment.torch_npu_version": "2.1.0.post17",
            "environment.torch_version": "2.1.0",
        }
    )
    fields = [field for field, _message in found]
    assert fields.count("training.parallelism") == 2  # the series and torch (2.1 has no fully_shard)
    assert any("not on the Atlas training series" in message for _field, message in found)
    assert any(field == "amp" and "refused with training.parallelism fsdp2" in message for field, message in found)


def test_fsdp2_needs_torch_npu_2_6_and_is_warned_below_2_7_1() -> None:
    old = {
        **NPU_A2,
        "training.parallelism": "fsdp2",
        "environment.torch_npu_version": "2.5.1",
        "environment.torch_version": "2.5.1",
    }
    assert any("needs torch_npu 2.6 or later" in message for _field, message in problems_of(old))
    warned = {**old, "environment.torch_npu_version": "2.6.0", "environment.torch_version": "2.6.0"}
    assert any("list fully_shard from 2.7.1" in message for _field, message in warnings_of(warned))
    assert not any("2.7.1" in message for _field, message in warnings_of({**NPU_A2, "training.parallelism": "fsdp2"}))


def test_fsdp2_on_a_cpu_project_needs_only_torch_2_6() -> None:
    cpu = {
        **NPU_A2,
        "device": "cpu",
        "hardware": "atlas-training",
        "amp": "off",
        "training.parallelism": "fsdp2",
        "environment.torch_npu_version": "2.6.0",
        "environment.torch_version": "2.6.0",
    }
    assert resolve(cpu)["training.parallelism"] == "fsdp2"


def test_zero1_runs_on_every_series() -> None:
    assert resolve(
        {
            **NPU_A2,
            "hardware": "atlas-training",
            "amp": "fp16",
            "training.parallelism": "zero1",
            "environment.torch_npu_version": "2.1.0.post17",
            "environment.torch_version": "2.1.0",
        }
    )


def test_a_script_of_your_own_gets_no_parallelism_question() -> None:
    found = problems_of(
        {
            **NPU_A2,
            "training.script": "my_train.py",
            "training.parallelism": "fsdp2",
            "training.activation_checkpointing": True,
        }
    )
    assert [field for field, _message in found] == ["training.parallelism", "training.activation_checkpointing"]
    assert all("shards itself" in message for _field, message in found)


def test_fsdp2_without_a_shared_checkpoint_folder_warns_of_the_whole_state_save_and_renders_it(tmp_path: Path) -> None:
    raw = {**NPU_A2, "training.parallelism": "fsdp2", "cluster.engine": "ssh"}
    (warning,) = [message for field, message in warnings_of(raw) if "common checkpoint folder" in message]
    assert "each node's local rank 0 at every save" in warning and "12 bytes per parameter" in warning
    train = (render(resolve(raw), tmp_path).project_dir / "train.py").read_text()
    assert "SHARDED_CHECKPOINTS = False" in train


@pytest.mark.parametrize(
    ("changes", "shared"),
    [
        ({"network.host_ips": ["127.0.0.1", "127.0.0.1"]}, True),  # nodes simulated on this host
        ({"cluster.engine": "slurm"}, True),  # every node runs in the submit folder
        ({"nodes": 1, "network.host_ips": ["10.0.0.1"]}, True),
        ({"cluster.engine": "manual"}, False),  # each host its own project
    ],
)
def test_sharded_checkpoints_where_every_rank_reaches_the_folder(
    tmp_path: Path, changes: dict[str, Any], shared: bool
) -> None:
    raw = {**NPU_A2, "training.parallelism": "fsdp2", **changes}
    train = (render(resolve(raw), tmp_path).project_dir / "train.py").read_text()
    assert f"SHARDED_CHECKPOINTS = {shared}" in train
    assert "fully_shard each block, then the root: bf16 parameters in compute, fp32 reductions" in train


def test_an_hf_models_blocks_are_its_decoder_layers_so_fsdp2_shards_each() -> None:
    pytest.importorskip("transformers")
    from torch import nn
    from transformers import GPT2Config, GPT2LMHeadModel

    from runtime.sharding import model_blocks

    class Wrapped(nn.Module):  # as the generated hf_model.py holds the loaded model
        def __init__(self) -> None:
            super().__init__()
            self.model = GPT2LMHeadModel(GPT2Config(n_layer=3, n_embd=16, n_head=2, vocab_size=64, n_positions=32))

    wrapped = Wrapped()
    blocks = model_blocks(wrapped)
    assert [type(block).__name__ for block in blocks] == ["GPT2Block"] * 3
    assert blocks[0] is wrapped.model.transformer.h[0]


@pytest.mark.parametrize(("parallelism", "entries"), [("ddp", "2000"), ("fsdp2", "8000"), ("zero1", "8000")])
def test_a_project_that_shards_keeps_more_collectives_in_its_flight_recorders(
    tmp_path: Path, parallelism: str, entries: str
) -> None:
    import subprocess

    from runtime import stacks

    project = render(resolve({**NPU_A2, "training.parallelism": parallelism}), tmp_path).project_dir
    script = (project / "launch" / "run-node.sh").read_text()
    (line,) = [line for line in script.splitlines() if line.startswith("hccl_trace_size=")]
    said = subprocess.run(
        ["bash", "-c", f'{line}; printf %s "$hccl_trace_size"'], capture_output=True, text=True, check=True
    )
    assert said.stdout == entries  # HCCL's recorder, unless the user set TORCH_HCCL_TRACE_BUFFER_SIZE
    sharded = parallelism != "ddp"
    assert 'stacks.install(run_dir, rank.rank, sharded=PARALLELISM != "ddp")' in (project / "train.py").read_text()
    env: dict[str, str] = {}
    stacks.enable_recorder(env, stacks.RECORDER_ENTRIES_SHARDED if sharded else stacks.RECORDER_ENTRIES)
    assert env == {"TORCH_FR_BUFFER_SIZE": entries}  # gloo's and NCCL's
    chosen = {"TORCH_FR_BUFFER_SIZE": "64"}
    stacks.enable_recorder(chosen, stacks.RECORDER_ENTRIES_SHARDED)
    assert chosen == {"TORCH_FR_BUFFER_SIZE": "64"}  # the user's own size stays


def test_activation_checkpointing_counts_each_batch_once_in_the_batch_norm_statistics() -> None:
    # the recomputation in backward runs each block's forward again: without care a batch norm would take the
    # same batch into its running statistics twice (ResNet-18 has twenty of them)
    import torch
    from torch import nn

    from runtime.sharding import checkpoint_activations, model_blocks

    def model() -> nn.Module:
        torch.manual_seed(3)
        block = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        return nn.Sequential(block, nn.Sequential(nn.Conv2d(8, 4, 1), nn.BatchNorm2d(4)), nn.Flatten())

    plain, checkpointed = model(), model()
    blocks = model_blocks(checkpointed)
    assert len(blocks) == 2  # the two with parameters
    checkpoint_activations(blocks)
    inputs = torch.randn(4, 3, 6, 6)
    for each in (plain, checkpointed):
        for _ in range(2):
            each(inputs).square().mean().backward()
    for kept, recomputed in zip(plain.modules(), checkpointed.modules(), strict=True):
        if isinstance(kept, nn.BatchNorm2d):
            assert int(recomputed.num_batches_tracked) == int(kept.num_batches_tracked) == 2
            assert torch.equal(recomputed.running_mean, kept.running_mean)
            assert torch.equal(recomputed.running_var, kept.running_var)
    for kept, recomputed in zip(plain.parameters(), checkpointed.parameters(), strict=True):
        assert recomputed.grad is not None and torch.allclose(recomputed.grad, kept.grad, atol=1e-6)
    # under torch.compile the traced recomputation updates no statistics a second time (measured: two batches
    # tracked after two steps), and dynamo would break its graph on the contexts: none there
    compiled = model()
    checkpoint_activations(model_blocks(compiled), compiled=True)
    assert all("context_fn" not in block.forward.keywords for block in model_blocks(compiled))
    assert all("context_fn" in block.forward.keywords for block in blocks)
