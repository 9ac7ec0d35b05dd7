"""The out-of-memory root cause's own lines: the rank's last peak, the run's estimate, and what would fit.

The estimate is the one `npu-wizard run` wrote into run.json when it started
the job (wizard/memory/fit.py's `to_record`); run.json is anyone's to write, so
each value is taken only where it is what it should be.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from wizard.memory.estimate import gib
from wizard.monitor.hints import OUT_OF_MEMORY
from wizard.monitor.ranks import Failure
from wizard.monitor.run_files import read_json_object
from wizard.monitor.values import is_step

RUN_FILE = "run.json"
SHOWN_ALTERNATIVES = 3


def oom_lines(failure: Failure, run_dir: Path) -> list[str]:
    """For a rank that ran out of memory: its last peak, the estimate against the device, the changes that fit."""
    if failure.hint is None or failure.hint.code != OUT_OF_MEMORY:
        return []
    who = f"rank {failure.rank}" if failure.rank is not None else "the rank"
    if failure.memory_peak is not None:
        step, peak, of = failure.memory_peak
        lines = [f"{who}'s last logged peak: {gib(peak)} at step {step} ({of}); it ran out after it"]
    else:
        lines = [f"{who} logged no peak before it ran out (it failed before its first logged step)"]
    record = (read_json_object(run_dir / RUN_FILE) or {}).get("memory_estimate")
    if not isinstance(record, dict) or not is_step(record.get("total_bytes")):
        return [*lines, "no estimate of this run's memory (npu-wizard run writes one into run.json)"]
    return lines + estimate_lines(record)


def estimate_lines(record: dict[str, Any]) -> list[str]:
    """The estimate against the capacity, then the changes that would fit (or that lower it most)."""
    total, capacity = record["total_bytes"], record.get("capacity_bytes")
    said = f"the estimate for this run: {record.get('breakdown')}"
    options = [
        (str(entry.get("setting")), entry["total_bytes"])
        for entry in record.get("alternatives") or []
        if isinstance(entry, dict) and is_step(entry.get("total_bytes"))
    ]
    if not is_step(capacity):
        return [said, _lowest(options, total)]
    said += f", of {gib(capacity)} ({record.get('capacity_of')})"
    if total > capacity:
        fitting = [(what, size) for what, size in options if size <= capacity]
        if not fitting:
            return [said, "none of fsdp2, activation checkpointing or a smaller batch fits it alone: a larger card"]
        return [said, "would fit: " + "; ".join(f"{what} ({gib(size)})" for what, size in fitting)]
    return [said, "the estimate fits, so the real peak was higher than estimated; " + _lowest(options, total)]


def _lowest(options: list[tuple[str, int]], total: int) -> str:
    lower = sorted((size, what) for what, size in options if size < total)[:SHOWN_ALTERNATIVES]
    if not lower:
        return "no change of mode, checkpointing or batch lowers it"
    return "these lower it most: " + "; ".join(f"{what} ({gib(size)})" for size, what in lower)
