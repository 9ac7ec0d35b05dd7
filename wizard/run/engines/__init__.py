"""Engines that start, follow and stop a job's nodes, one module each behind `Engine` (base.py).

`engine_for(answers)` picks the project's engine; nothing else in npu-wizard
asks which engine it is.
"""

from __future__ import annotations

from collections.abc import Callable

from wizard.answers.model import Answers
from wizard.run.engines.base import Description, Engine, EngineError, Launch, StatusPlan


def _manual() -> Engine:
    from wizard.run.engines.manual import ManualEngine

    return ManualEngine()


def _ssh() -> Engine:
    from wizard.run.engines.ssh import SshEngine

    return SshEngine()


def _slurm() -> Engine:
    from wizard.run.engines.slurm import SlurmEngine

    return SlurmEngine()


def _kubernetes(name: str) -> Callable[[], Engine]:
    def make() -> Engine:
        from wizard.run.engines.kubernetes import KubernetesEngine

        return KubernetesEngine(name)

    return make


ENGINES: dict[str, Callable[[], Engine]] = {
    "manual": _manual,
    "ssh": _ssh,
    "slurm": _slurm,
    "ascendjob": _kubernetes("ascendjob"),
    "pytorchjob": _kubernetes("pytorchjob"),
}
"""Each runnable engine by its `cluster.engine` name."""


def engine_for(answers: Answers) -> Engine:
    """A fresh engine for the project's `cluster.engine`."""
    name = answers.get("cluster.engine") or "manual"
    if name in ENGINES:
        return ENGINES[name]()
    raise EngineError(f"cluster.engine {name}: unknown engine; one of: {', '.join(ENGINES)}")


__all__ = ["ENGINES", "Description", "Engine", "EngineError", "Launch", "StatusPlan", "engine_for"]
