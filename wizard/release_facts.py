"""What the chosen torch_npu release supports, for the templates: the `torch_npu_has` filter.

`{% if cookiecutter.torch_npu_version|torch_npu_has("cpu_affinity_conf") %}`
keeps the version rules in one place (wizard/hardware.py) for both render
paths: npu-wizard's own environment and plain cookiecutter's `_extensions`.
"""

from __future__ import annotations

from collections.abc import Callable

import jinja2
from jinja2.ext import Extension

from wizard import hardware

EXTENSION = f"{__name__}.ReleaseFacts"
FEATURES: dict[str, Callable[[str], bool]] = {
    "task_queue_2": hardware.has_task_queue_2,
    "cpu_affinity_conf": hardware.has_cpu_affinity_conf,
    "tiered_store_flag": hardware.has_tiered_store_flag,
}


def torch_npu_has(version: object, feature: str) -> bool:
    """Whether torch_npu `version` has `feature` (a key of FEATURES)."""
    return FEATURES[feature](str(version))


class ReleaseFacts(Extension):
    """Jinja extension that adds the `torch_npu_has` filter."""

    def __init__(self, environment: jinja2.Environment) -> None:
        super().__init__(environment)
        environment.filters["torch_npu_has"] = torch_npu_has
