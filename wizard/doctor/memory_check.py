"""Doctor's memory check: the estimated bytes per rank against what one rank's device can hold."""

from __future__ import annotations

from pathlib import Path

from runtime.checks import PASS, SKIP, WARN, Result
from wizard.answers.model import Answers
from wizard.answers.script import is_foreign
from wizard.doctor.network import Node
from wizard.doctor.probe import Software
from wizard.memory.estimate import ModelUnknown, gib, with_model_folder
from wizard.memory.fit import (
    MEMINFO,
    Capacity,
    advise,
    breakdown,
    cuda_capacity,
    fits_words,
    host_capacity,
    npu_capacity,
)


def device_capacity(answers: Answers, found: Software, node: Node, meminfo: Path = MEMINFO) -> Capacity | None:
    """What one rank may use: the series' card on an NPU, the GPU auto finds, else this host's memory."""
    device = answers["device"]
    if device == "npu" or (device == "auto" and found.npu_count):
        return npu_capacity(answers["hardware"])
    if device == "auto" and found.cuda_memory:
        return cuda_capacity(found.cuda_memory)
    ranks = answers.world_size if node.how == "simulated" else answers["devices_per_node"]
    return host_capacity(ranks, meminfo)


def check_memory(answers: Answers, capacity: Capacity | None, project: Path | None = None) -> Result:
    """The estimate per rank fits the device (a warning, with the modes and settings that fit, where not)."""
    if is_foreign(answers["training.script"]):
        return Result("memory", SKIP, "your own script: its model is not known before it runs")
    try:
        advice = advise(with_model_folder(answers.values, project) if project else answers.values, capacity)
    except ModelUnknown as error:
        return Result("memory", SKIP, f"the model's size is not known here: {error}")
    words = breakdown(advice.chosen)
    if capacity is None:
        return Result("memory", SKIP, f"{words}; this host's memory is unknown (no /proc/meminfo)")
    against = f"{words}, of {gib(capacity.bytes)} ({capacity.what})"
    if advice.fits:
        return Result("memory", PASS, f"{against} (an estimate: the run shows each rank's real peak)")
    return Result(
        "memory",
        WARN,
        f"{against}: does not fit (an estimate)",
        f"would fit: {fits_words(advice)}",
    )
