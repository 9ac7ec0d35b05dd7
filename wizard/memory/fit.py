"""Whether a rank's estimated memory fits its device, and which modes or settings would fit when not.

The device's memory: on an NPU the card's usable HBM for the answers' series
(ASCEND.md: about 61 GiB of a 64 GB A2 or A3 card, as users' out-of-memory
texts quote "60.96 GiB total capacity"; the Atlas training series' Ascend 910
has 32 GB, taken as about 30 GiB usable, not checked on a card); on a CUDA GPU
the total torch reports for it; on the CPU the host's available memory
(MemAvailable) shared by the ranks it runs. A verdict is a warning, never a
refusal: estimates are estimates, and the run shows its real peak per rank.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wizard.memory.estimate import Estimate, estimate, gib

MEMINFO = Path("/proc/meminfo")
CARD_USABLE = {  # bytes a rank's tensors can take on one device of the series
    "atlas-training": (30 * 2**30, "an Ascend 910's 32 GB HBM (about 30 GiB usable, not checked on a card)"),
    "atlas-a2": (61 * 2**30, "an Atlas A2 card's 64 GB HBM (about 61 GiB usable)"),
    "atlas-a3": (61 * 2**30, "an Atlas A3 device's 64 GB HBM (about 61 GiB usable)"),
}


@dataclass(frozen=True)
class Capacity:
    """The bytes one rank may use, and what they are."""

    bytes: int
    what: str


@dataclass(frozen=True)
class Advice:
    """The answers' estimate against the capacity, and the changes that would fit where it does not."""

    values: Mapping[str, Any]
    chosen: Estimate
    capacity: Capacity | None
    fits_with: tuple[tuple[str, Estimate], ...] = ()

    @property
    def fits(self) -> bool:
        """Whether the chosen mode's estimate fits (True where the capacity is unknown)."""
        return self.capacity is None or self.chosen.total <= self.capacity.bytes


def npu_capacity(series: str) -> Capacity:
    """The usable memory of one device of the Ascend `series`."""
    usable, what = CARD_USABLE.get(series, CARD_USABLE["atlas-a2"])
    return Capacity(usable, what)


def host_capacity(ranks: int, meminfo: Path = MEMINFO) -> Capacity | None:
    """This host's available memory shared by `ranks` CPU ranks; None where /proc/meminfo says nothing."""
    try:
        text = meminfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            available = int(line.split()[1]) * 1024
            share = f" shared by {ranks} ranks" if ranks > 1 else ""
            return Capacity(available // max(1, ranks), f"this host's available memory, {gib(available)}{share}")
    return None


def cuda_capacity(total: int) -> Capacity:
    """A CUDA GPU's memory, as torch reports its total."""
    return Capacity(total, f"the CUDA GPU's {gib(total)}")


def advise(values: Mapping[str, Any], capacity: Capacity | None) -> Advice:
    """The answers' estimate, and (where it does not fit) each change of mode or setting that would."""
    chosen = estimate(values)
    if capacity is None or chosen.total <= capacity.bytes:
        return Advice(values, chosen, capacity)
    fitting = tuple((what, found) for what, found in alternatives(values) if found.total <= capacity.bytes)
    return Advice(values, chosen, capacity, fitting)


def alternatives(values: Mapping[str, Any]) -> list[tuple[str, Estimate]]:
    """(the answers to set, their estimate) for each other mode, checkpointing, and smaller batches."""
    chosen = estimate(values)
    found = [
        (f"training.parallelism: {mode}", estimate(values, mode=mode))
        for mode in ("zero1", "fsdp2")
        if mode != chosen.mode and (mode != "fsdp2" or fsdp2_allowed(values))
    ]
    if not chosen.checkpointing:  # every mode, every series and every generated model take it
        setting = "training.activation_checkpointing: true"
        checkpointed = estimate(values, checkpointed=True)
        if checkpointed.total < chosen.total:  # a model without blocks (the MLP) keeps nothing less
            found.append((setting, checkpointed))
        if chosen.mode != "fsdp2" and fsdp2_allowed(values):
            both = estimate(values, mode="fsdp2", checkpointed=True)
            if both.total < estimate(values, mode="fsdp2").total:
                found.append((f"training.parallelism: fsdp2 with {setting}", both))
    accum = int(values.get("training.grad_accum") or 1)
    batch = chosen.batch_size // 2
    while batch >= 1:
        ratio = chosen.batch_size // batch
        if chosen.batch_size % batch == 0:
            setting = f"training.batch_size: {batch} with training.grad_accum: {accum * ratio} (the same global batch)"
            found.append((setting, estimate(values, batch_size=batch)))
        batch //= 2
    return found


def fsdp2_allowed(values: Mapping[str, Any]) -> bool:
    """fsdp2 passes the answers' rules here: never with fp16, and the series and releases that have fully_shard
    (wizard.answers.rules_sharding, ASCEND.md): what is suggested is never what the rules refuse."""
    from wizard.answers.rules_sharding import fsdp2_fits_release

    if values.get("amp") == "fp16":
        return False
    asked = {
        "training.parallelism": "fsdp2",
        "device": values.get("device", "npu"),
        "hardware": values.get("hardware", "atlas-a2"),
        "environment.torch_version": values.get("environment.torch_version") or "",
        "environment.torch_npu_version": values.get("environment.torch_npu_version") or "",
    }
    return not any(problem.severity == "error" for problem in fsdp2_fits_release(asked))


def breakdown(found: Estimate) -> str:
    """`172 MiB parameters + ... = 1.8 GiB per rank (GPT small, ddp on 4 ranks)`."""
    parts = " + ".join(f"{gib(size)} {name}" for name, size in found.parts())
    ranks = f"{found.world_size} rank{'s' * (found.world_size > 1)}"
    return f"{parts} = {gib(found.total)} per rank ({found.model.name}, {found.mode} on {ranks})"


def fits_words(advice: Advice) -> str:
    """The changes that fit, each with its estimate; or that none of them does."""
    if not advice.fits_with:
        return "no single change of mode, checkpointing or batch fits it: a larger card or a smaller model"
    return "; ".join(f"{what} ({gib(found.total)})" for what, found in advice.fits_with)


def to_record(advice: Advice) -> dict[str, Any]:
    """The advice as JSON for run.json: the out-of-memory root cause quotes it."""
    return {
        "mode": advice.chosen.mode,
        "total_bytes": advice.chosen.total,
        "breakdown": breakdown(advice.chosen),
        "capacity_bytes": advice.capacity.bytes if advice.capacity else None,
        "capacity_of": advice.capacity.what if advice.capacity else None,
        "alternatives": [{"setting": what, "total_bytes": found.total} for what, found in alternatives(advice.values)],
    }


def run_capacity(values: Mapping[str, Any], ranks_here: int, meminfo: Path = MEMINFO) -> Capacity | None:
    """What one rank of a run started here may use: the series' card, this host's share, or unknown (auto)."""
    if values.get("device") == "npu":
        return npu_capacity(str(values.get("hardware")))
    if values.get("device") == "cpu":
        return host_capacity(ranks_here, meminfo)
    return None  # auto: the device is known only once the ranks chose it
