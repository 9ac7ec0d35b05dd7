"""The per-rank report of a smoke run (`npu-wizard run PROJECT --smoke`).

Each rank of `train.py --smoke` writes one `smoke` event (runtime/smoke.py):
where it ran, the all_reduce sum it got and expected, and how long the
all_reduce and barrier took. This module turns those events into lines.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from runtime.preflight import compress_numbers


def smoke_lines(events: Mapping[int, Sequence[Mapping[str, Any]]], world_size: int) -> tuple[list[str], bool]:
    """One line per rank that reported, then a summary; and whether every rank in `events` passed."""
    found = {rank: _last(rank_events, "smoke") for rank, rank_events in events.items()}
    reports = {rank: event for rank, event in found.items() if event is not None}
    lines = []
    for rank, event in sorted(reports.items()):
        verdict = "ok" if event.get("ok") else "WRONG"
        lines.append(
            f"  rank {rank:>3}  node {event.get('node')}  {event.get('host')}  {event.get('device')}  "
            f"all_reduce {event.get('got')}/{event.get('expected')} {verdict}  {event.get('seconds', 0.0):.3f}s"
        )
    silent = [rank for rank in events if rank not in reports]
    elsewhere = [rank for rank in range(world_size) if rank not in events]
    if silent:
        lines.append(f"  {_ranks(silent)}: started but wrote no smoke result (see their logs)")
    if elsewhere:
        lines.append(f"  {_ranks(elsewhere)}: no events here (other nodes keep their own)")
    passed = sum(1 for event in reports.values() if event.get("ok"))
    ok = not silent and passed == len(reports) > 0
    slowest = max((event.get("seconds", 0.0) for event in reports.values()), default=0.0)
    nodes = len({event.get("node") for event in reports.values()})
    head = "smoke ok" if ok else "smoke FAILED"
    lines.insert(
        0,
        f"{head}: {passed}/{world_size} ranks on {nodes} node(s) agree on the all_reduce and passed the barrier "
        f"(slowest {slowest:.3f}s)",
    )
    return lines, ok


def print_smoke_report(run_dir: Path, world_size: int, out: TextIO | None = None) -> bool:
    """Print the smoke report of the run in `run_dir`; return whether every rank here passed."""
    out = out or sys.stdout  # looked up now: a test may have swapped it since import
    from wizard.monitor.attach import REMOTE_DIR
    from wizard.monitor.run_files import read_events

    # other hosts' ranks reach this runner only through the status stream, recorded under remote/
    here, streamed = read_events(run_dir), read_events(run_dir / REMOTE_DIR)
    events = {rank: here.get(rank) or streamed[rank] for rank in {*here, *streamed}}
    lines, ok = smoke_lines(events, world_size)
    for line in lines:
        print(line, file=out)
    return ok


def _last(events: Sequence[Mapping[str, Any]], kind: str) -> Mapping[str, Any] | None:
    return next((event for event in reversed(events) if event.get("event") == kind), None)


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {compress_numbers(ranks)}"
