"""Engines that start, follow and stop a job's nodes, one module each behind `Engine` (base.py).

`engine_for(answers)` picks the project's engine; nothing else in npu-wizard
asks which engine it is.
"""

from __future__ import annotations

from collections.abc import Callable

from wizard.answers import Answers
from wizard.cluster_questions import NOT_YET
from wizard.engines.base import Description, Engine, EngineError, Launch, StatusPlan


def _manual() -> Engine:
    from wizard.engines.manual import ManualEngine

    return ManualEngine()


def _ssh() -> Engine:
    from wizard.engines.ssh import SshEngine

    return SshEngine()


def _slurm() -> Engine:
    from wizard.engines.slurm import SlurmEngine

    return SlurmEngine()


ENGINES: dict[str, Callable[[], Engine]] = {"manual": _manual, "ssh": _ssh, "slurm": _slurm}
"""Each runnable engine by its `cluster.engine` name; the Kubernetes engines add theirs here."""


def engine_for(answers: Answers) -> Engine:
    """A fresh engine for the project's `cluster.engine`."""
    name = answers.get("cluster.engine") or "manual"
    if name in ENGINES:
        return ENGINES[name]()
    if name in NOT_YET:
        raise EngineError(f"cluster.engine {name}: not yet: this npu-wizard runs manual, ssh and slurm projects")
    raise EngineError(f"cluster.engine {name}: unknown engine; one of: {', '.join(ENGINES)}")


__all__ = ["ENGINES", "Description", "Engine", "EngineError", "Launch", "StatusPlan", "engine_for"]
