"""The answer sets the snapshot, lint and cookiecutter tests render.

Together they cover every series, launcher and AMP setting, one node and
several, every model and dataset, TensorBoard on and off, each compile mode; the `own-` cases run
the user's own script (training.script) under every launcher that can start it
and every engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from wizard.answers.model import Answers, load_text, resolve

EXAMPLES = Path(__file__).parent.parent / "examples"


def _ips(count: int, prefix: str = "10.0.0.") -> list[str]:
    return [f"{prefix}{10 + node}" for node in range(count)]


CASES: dict[str, dict[str, Any]] = {
    "training-2x4-mp-spawn-fp16": {
        "project_name": "t910-spawn",
        "hardware": "atlas-training",
        "nodes": 2,
        "devices_per_node": 4,
        "launcher": "mp-spawn",
        "amp": "fp16",
        "network.host_ips": _ips(2),
        "environment.torch_npu_version": "2.1.0.post10",
        "environment.torch_version": "2.1.0",
    },
    "training-1x1-torchrun-off": {
        "project_name": "t910-one",
        "hardware": "atlas-training",
        "devices_per_node": 1,
        "launcher": "torchrun",
        "amp": "off",
        "network.host_ips": ["192.168.0.5"],
    },
    "a2-2x8-torch-launch-off-nic": {
        "project_name": "a2-launch",
        "hardware": "atlas-a2",
        "nodes": 2,
        "devices_per_node": 8,
        "launcher": "torch-launch",
        "amp": "off",
        "network.host_ips": _ips(2),
        "network.nic": "eth0",
        "network.master_port": 29600,
        "training.lr": 0.2,
    },
    "a2-4x8-torch-npu-run-fp16-mnist": {
        "project_name": "a2-mnist",
        "hardware": "atlas-a2",
        "nodes": 4,
        "devices_per_node": 8,
        "launcher": "torch-npu-run",
        "amp": "fp16",
        "network.host_ips": _ips(4),
        "training.model": "convnet",
        "training.dataset": "mnist",
        "training.data_dir": "data/mnist",
        "training.eval_every": 200,  # on a held-out tenth of MNIST's training set
        "environment.torch_npu_version": "2.6.0.post3",
        "environment.torch_version": "2.6.0",
    },
    "a3-1x16-shell-off": {
        "project_name": "a3-shell",
        "hardware": "atlas-a3",
        "devices_per_node": 16,
        "launcher": "shell",
        "amp": "off",
        "network.host_ips": ["10.1.0.1"],
        "network.hccl_base_port": 61000,
    },
    "a3-2x8-mp-spawn-bf16-imagefolder": {
        "project_name": "a3-images",
        "hardware": "atlas-a3",
        "nodes": 2,
        "devices_per_node": 8,
        "launcher": "mp-spawn",
        "amp": "bf16",
        "network.host_ips": ["fd00::1", "fd00::2"],
        "network.master_addr": "fd00::1",
        "training.model": "resnet18",
        "training.dataset": "imagefolder",
        "training.data_dir": "/data/images",
        "training.eval_every": 500,  # on a held-out tenth of the images, without augmentation
    },
    "a3-8x16-torch-npu-run-bf16-cluster": {
        "project_name": "a3-big",
        "hardware": "atlas-a3",
        "nodes": 8,
        "devices_per_node": 16,
        "launcher": "torch-npu-run",
        "amp": "bf16",
        "network.host_ips": _ips(8),
        "network.connect_timeout": 1200,
        "network.exec_timeout": 3600,
    },
    "a2-1x8-torchrun-bf16-tensorboard": {
        "project_name": "a2-board",
        "hardware": "atlas-a2",
        "devices_per_node": 8,
        "launcher": "torchrun",
        "amp": "bf16",
        "network.host_ips": ["10.0.0.10"],
        "training.tensorboard": True,
    },
    "a2-1x8-torchrun-bf16-reduce-overhead": {
        "project_name": "a2-graph",
        "hardware": "atlas-a2",
        "devices_per_node": 8,
        "launcher": "torchrun",
        "amp": "bf16",
        "network.host_ips": ["10.0.0.10"],
        "training.model": "resnet18",
        "training.compile": "reduce-overhead",
    },
    "cpu-1x2-torchrun-off-compile": {
        "project_name": "cpu-compiled",
        "device": "cpu",
        "devices_per_node": 2,
        "launcher": "torchrun",
        "amp": "off",
        "training.compile": "default",
    },
    "cpu-1x2-shell-fp16": {
        "project_name": "cpu-shell",
        "device": "cpu",
        "devices_per_node": 2,
        "launcher": "shell",
        "amp": "fp16",
        "training.eval_every": 50,  # on a held-out tenth of the synthetic samples
    },
    "a2-2x8-torchrun-bf16-gpt-tokens": {
        "project_name": "a2-gpt",
        "hardware": "atlas-a2",
        "nodes": 2,
        "devices_per_node": 8,
        "launcher": "torchrun",
        "amp": "bf16",
        "network.host_ips": _ips(2),
        "training.model": "gpt",
        "training.dataset": "tokens",
        "training.gpt_size": "gpt2-124m",
        "training.block_size": 512,
        "training.lr_schedule": "cosine",
        "training.warmup_steps": 200,
        "training.min_lr": 0.0001,
        "training.grad_accum": 4,
        "training.peak_tflops": 280.0,
    },
    "training-1x8-shell-fp16-gpt-compile-off": {
        "project_name": "t910-gpt",
        "hardware": "atlas-training",
        "devices_per_node": 8,
        "launcher": "shell",
        "amp": "fp16",
        "network.host_ips": ["10.0.0.10"],
        "training.model": "gpt",
        "training.dataset": "tokens",
        "training.gpt_size": "small",
        "training.n_layer": 4,
        "training.dropout": 0.0,
        "training.lr": 0.0006,
        "training.data_dir": "/data/tokens",
    },
    "cpu-1x2-torchrun-off-gpt-compile": {
        "project_name": "cpu-gpt",
        "device": "cpu",
        "devices_per_node": 2,
        "launcher": "torchrun",
        "amp": "off",
        "training.model": "gpt",
        "training.dataset": "tokens",
        "training.compile": "default",
        "training.grad_accum": 2,
    },
    "cpu-1x2-torchrun-off-hf-tokens": {
        "project_name": "cpu-hf",
        "device": "cpu",
        "devices_per_node": 2,
        "launcher": "torchrun",
        "amp": "off",
        "training.model": "hf",
        "training.dataset": "tokens",
        "training.hf_model_path": "models/tiny-gpt2",
        "training.block_size": 128,
    },
    "a2-1x8-torchrun-bf16-hf-tokens-torch251": {
        "project_name": "a2-hf",
        "hardware": "atlas-a2",
        "devices_per_node": 8,
        "launcher": "torchrun",
        "amp": "bf16",
        "network.host_ips": ["10.0.0.10"],
        "environment.torch_npu_version": "2.5.1.post1",
        "environment.torch_version": "2.5.1",
        "training.model": "hf",
        "training.dataset": "tokens",
        "training.hf_model_path": "/models/Qwen2.5-0.5B",  # not on this machine: read at start-up
        "training.lr": 0.00005,
        "training.lr_schedule": "cosine",
        "training.warmup_steps": 100,
        "training.grad_accum": 8,
        "training.peak_tflops": 280.0,
    },
    "a2-2x8-torchrun-bf16-gpt-fsdp2": {  # no shared checkpoint folder: whole checkpoints per node
        "project_name": "a2-fsdp2",
        "hardware": "atlas-a2",
        "nodes": 2,
        "devices_per_node": 8,
        "launcher": "torchrun",
        "amp": "bf16",
        "network.host_ips": _ips(2),
        "training.model": "gpt",
        "training.dataset": "tokens",
        "training.gpt_size": "small",
        "training.grad_accum": 2,
        "training.parallelism": "fsdp2",
        "training.activation_checkpointing": True,
    },
    "cpu-2x2-torchrun-off-gpt-fsdp2": {  # nodes simulated on one host: sharded checkpoints
        "project_name": "cpu-fsdp2",
        "device": "cpu",
        "nodes": 2,
        "devices_per_node": 2,
        "launcher": "torchrun",
        "amp": "off",
        "network.host_ips": ["127.0.0.1", "127.0.0.1"],
        "training.model": "gpt",
        "training.dataset": "tokens",
        "training.parallelism": "fsdp2",
    },
    "training-1x8-shell-fp16-resnet-zero1": {
        "project_name": "t910-zero1",
        "hardware": "atlas-training",
        "devices_per_node": 8,
        "launcher": "shell",
        "amp": "fp16",
        "network.host_ips": ["10.0.0.10"],
        "training.model": "resnet18",
        "training.parallelism": "zero1",
        "training.activation_checkpointing": True,
    },
    "auto-2x2-torch-launch-bf16": {
        "project_name": "auto-launch",
        "device": "auto",
        "nodes": 2,
        "devices_per_node": 2,
        "launcher": "torch-launch",
        "amp": "bf16",
        "network.host_ips": ["127.0.0.1", "127.0.0.1"],
    },
}

# The user's own script, with arguments a shell would mangle unquoted.
OWN_SCRIPT = {"training.script": "src/my train.py", "training.script_args": ["--data", "/data/my set", "--tag", "it's"]}
CASES.update(
    {
        "own-cpu-1x2-shell-manual": {
            "project_name": "own-shell",
            "device": "cpu",
            "devices_per_node": 2,
            "launcher": "shell",
            "amp": "off",
            **OWN_SCRIPT,
        },
        "own-training-1x8-shell-taskset": {
            "project_name": "own-taskset",
            "hardware": "atlas-training",
            "devices_per_node": 8,
            "launcher": "shell",
            "amp": "fp16",
            "network.host_ips": ["10.0.0.10"],
            "environment.torch_npu_version": "2.1.0.post6",
            "environment.torch_version": "2.1.0",
            "training.script": "main.py",
        },
        "own-a2-2x8-torchrun-ssh": {
            "project_name": "own-ssh",
            "hardware": "atlas-a2",
            "nodes": 2,
            "devices_per_node": 8,
            "launcher": "torchrun",
            "amp": "bf16",
            "network.host_ips": _ips(2),
            "cluster.engine": "ssh",
            "cluster.ssh_hosts": ["atlas-a", "atlas-b"],
            "cluster.remote_dir": "/data/jobs/own-ssh",
            **OWN_SCRIPT,
        },
        "own-a2-2x8-torch-npu-run-slurm": {
            "project_name": "own-slurm",
            "hardware": "atlas-a2",
            "nodes": 2,
            "devices_per_node": 8,
            "launcher": "torch-npu-run",
            "amp": "bf16",
            "cluster.engine": "slurm",
            "cluster.partition": "npu",
            **OWN_SCRIPT,
        },
        "own-a3-2x8-torch-launch-ascendjob": {
            "project_name": "own-acjob",
            "hardware": "atlas-a3",
            "nodes": 2,
            "devices_per_node": 8,
            "launcher": "torch-launch",
            "amp": "bf16",
            "cluster.engine": "ascendjob",
            "cluster.image": "registry.example.com/ml/pytorch-npu:2.9.0",
            "training.script": "src/train_mine.py",
            "training.script_args": ["--data", "/data/my set", "--tag", "it's"],
        },
        "own-cpu-2x2-torchrun-pytorchjob": {
            "project_name": "own-ptjob",
            "device": "cpu",
            "nodes": 2,
            "devices_per_node": 2,
            "launcher": "torchrun",
            "amp": "off",
            "cluster.engine": "pytorchjob",
            "cluster.image": "registry.example.com/ml/pytorch:2.9.0",
            "training.script": "train_ddp.py",
        },
    }
)


def case_answers(name: str) -> Answers:
    """The answers of a matrix case or of an example file (`example:<stem>`)."""
    if name.startswith("example:"):
        return load_text((EXAMPLES / f"{name.split(':', 1)[1]}.yaml").read_text())
    return resolve(CASES[name])


ALL: list[str] = [*CASES, *(f"example:{p.stem}" for p in sorted(EXAMPLES.glob("*.yaml")))]
