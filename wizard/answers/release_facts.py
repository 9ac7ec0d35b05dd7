"""Facts the templates take from Python: what a torch_npu release supports, which ports a job uses.

`{% if cookiecutter.torch_npu_version|torch_npu_has("cpu_affinity_conf") %}`
keeps the version rules in one place (wizard/answers/hardware.py), and
`{% set plan = cookiecutter|port_plan %}` the port plan (wizard/answers/questions_cluster.py),
for both render paths: npu-wizard's own environment and plain cookiecutter's
`_extensions`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import jinja2
from jinja2.ext import Extension

from wizard.answers import hardware
from wizard.answers.language_model import gpt_config
from wizard.answers.questions_cluster import HCCL_SLOTS, MASTER_PORT_SPAN, OPERATOR_MASTER_PORTS
from wizard.answers.storage import shared_checkpoints

EXTENSION = f"{__name__}.ReleaseFacts"
FEATURES: dict[str, Callable[[str], bool]] = {
    "task_queue_2": hardware.has_task_queue_2,
    "cpu_affinity_conf": hardware.has_cpu_affinity_conf,
    "cpu_affinity_force": hardware.has_cpu_affinity_force,
    "tiered_store_flag": hardware.has_tiered_store_flag,
    "parallel_store_env": hardware.has_parallel_store_env,
    "profiler_async_parse": hardware.has_profiler_async_parse,
    "hccl_flight_recorder": hardware.has_hccl_flight_recorder,
    "torchair_reduce_overhead": hardware.has_torchair_reduce_overhead,
}


def torch_npu_has(version: object, feature: str) -> bool:
    """Whether torch_npu `version` has `feature` (a key of FEATURES)."""
    return FEATURES[feature](str(version))


@dataclass(frozen=True)
class PortPlan:
    """The master port and HCCL host ports a node of the project may listen on, as first and last port."""

    master: tuple[int, int]
    hccl: tuple[int, int]
    by_job_id: bool  # Slurm: each job takes its own master port and HCCL slot, chosen by its job id
    masters: int  # master ports a job id may pick (1 without a scheduler)
    slots: int  # HCCL port slots a job id may pick (1 without a scheduler)

    @property
    def master_text(self) -> str:
        """The master port or range, as the kernel writes it."""
        return _port_range(*self.master)

    @property
    def hccl_text(self) -> str:
        """The HCCL host port range."""
        return _port_range(*self.hccl)

    @property
    def reserved(self) -> str:
        """Both, ascending: the value for net.ipv4.ip_local_reserved_ports."""
        return ",".join(_port_range(*pair) for pair in sorted((self.master, self.hccl)))


def port_plan(context: Mapping[str, object]) -> PortPlan:
    """The ports of a cookiecutter context: one job's, under Slurm every job id's, under Kubernetes the operator's."""
    master, base, count = (int(str(context[key])) for key in ("master_port", "hccl_base_port", "hccl_port_count"))
    # a Kubernetes operator gives the pods its own master port, whatever the answers say
    master = OPERATOR_MASTER_PORTS.get(str(context["engine"]), master)
    by_job_id = context["engine"] == "slurm"
    masters, slots = (MASTER_PORT_SPAN, HCCL_SLOTS) if by_job_id else (1, 1)
    return PortPlan((master, master + masters - 1), (base, base + slots * count - 1), by_job_id, masters, slots)


def _port_range(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}-{last}"


class ReleaseFacts(Extension):
    """Jinja extension that adds the `torch_npu_has`, `port_plan`, `gpt_config` and `shared_checkpoints` filters."""

    def __init__(self, environment: jinja2.Environment) -> None:
        super().__init__(environment)
        environment.filters["torch_npu_has"] = torch_npu_has
        environment.filters["port_plan"] = port_plan
        environment.filters["gpt_config"] = gpt_config
        environment.filters["shared_checkpoints"] = shared_checkpoints
