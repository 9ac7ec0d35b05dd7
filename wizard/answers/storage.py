"""Whether every rank of a project reaches one checkpoint folder, as the engines arrange the nodes' files.

A sharded checkpoint (torch.distributed.checkpoint) is a folder of one shard
per rank that every rank must reach: on a loopback simulation or a single node
the project's own checkpoints/ is one folder; Slurm runs every node in the
submit folder, which the nodes share; by hand and over ssh each host has its
own copy of the project, and each Kubernetes pod its own workspace.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from wizard.answers.addresses import is_loopback

SHARED_ENGINES = ("slurm",)  # job.sbatch starts every node in $SLURM_SUBMIT_DIR, a folder they all see


def shared_checkpoint_folder(engine: str, nodes: int, host_ips: tuple[str, ...] | list[str]) -> bool:
    """Whether every rank reaches the same checkpoint folder."""
    if nodes == 1 or engine in SHARED_ENGINES:
        return True
    if engine in ("ascendjob", "pytorchjob"):
        return False  # each pod writes into its own emptyDir workspace
    return bool(host_ips) and all(is_loopback(ip) for ip in host_ips)


def shared_from_values(values: Mapping[str, Any]) -> bool:
    """shared_checkpoint_folder for answers keyed by dotted name."""
    return shared_checkpoint_folder(
        str(values.get("cluster.engine") or "manual"), int(values["nodes"]), tuple(values.get("network.host_ips") or ())
    )


def shared_checkpoints(context: Mapping[str, object]) -> bool:
    """shared_checkpoint_folder for a cookiecutter context (its values are text)."""
    ips = [ip for ip in str(context.get("host_ips", "")).split(",") if ip.strip()]
    return shared_checkpoint_folder(str(context["engine"]), int(str(context["nodes"])), ips)
