"""The network check's report (`npu-wizard run PROJECT --smoke --bandwidth`).

Rank 0 records the measurements as one `bandwidth` event (runtime/bandwidth.py);
this module adds what the project's hardware series should reach, writes
`<run dir>/bandwidth.json` and prints the table.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from runtime.bandwidth_report import table_lines
from wizard.answers.hardware import SERIES
from wizard.atomic_files import write_json

BANDWIDTH_FILE = "bandwidth.json"
RESULT_FIELDS = (
    "backend",
    "world_size",
    "nodes",
    "collectives",
    "latency_us",
    "links",
    "link_mode",
    "slowest_link",
)

# What each series should reach, in GB/s, each figure with its source: HCCS between the NPUs
# of one server ("intra_node") and the RoCE NICs between servers ("inter_node"). The project's
# facts file (ASCEND.md) has no such figure with a source for any series, so none is given:
# the report says so instead of guessing. Add {"intra_node": (GBps, source), ...} per series.
EXPECTED: dict[str, dict[str, tuple[float, str]]] = {}


def expected(answers: Mapping[str, Any], backend: str) -> dict[str, Any]:
    """What the series should reach inside a server and between servers, or why nothing is compared."""
    key = answers.get("hardware", "")
    series = SERIES.get(key)
    title = series.title if series else key
    if backend == "gloo":
        note = f"a CPU simulation (gloo): no figure of the {title} applies"
        return {"series": key, "intra_node": None, "inter_node": None, "note": note}
    figures = EXPECTED.get(key, {})
    found = {
        link: {"GBps": figures[link][0], "source": figures[link][1]} if link in figures else None
        for link in ("intra_node", "inter_node")
    }
    missing = [words for link, words in _LINKS.items() if found[link] is None]
    note = (
        f"no sourced figure for {' or '.join(missing)} of the {title}: nothing to compare with"
        if missing
        else f"the {title}'s figures, with their sources"
    )
    return {"series": key, **found, "note": note}


_LINKS = {"intra_node": "HCCS inside a server", "inter_node": "the RoCE NICs between servers"}


def bandwidth_result(event: Mapping[str, Any], answers: Mapping[str, Any]) -> dict[str, Any]:
    """bandwidth.json: rank 0's measurements and what the series should reach."""
    result = {name: event.get(name) for name in RESULT_FIELDS}
    result["expected"] = expected(answers, str(event.get("backend")))
    return result


def expected_lines(result: Mapping[str, Any]) -> list[str]:
    """The comparison with the series' figures (or why there is none)."""
    found = result["expected"]
    lines = [f"  expected: {found['note']}"]
    busbw = max((row["busbw_GBps"] for row in result["collectives"]), default=0.0)
    links = max((link["GBps"] for link in result["links"]), default=0.0)
    for link, measured in (("intra_node", busbw), ("inter_node", links)):
        figure = found.get(link)
        if figure:
            share = measured / figure["GBps"] if figure["GBps"] else 0.0
            lines.append(
                f"  {_LINKS[link]}: {figure['GBps']:.3g} GB/s ({figure['source']}); "
                f"measured {measured:.3g} GB/s, {share:.0%} of it"
            )
    return lines


def print_bandwidth_report(run_dir: Path, answers: Mapping[str, Any], out: TextIO | None = None) -> bool:
    """Print the network check of the run in `run_dir` and write its bandwidth.json; False when none came."""
    out = out or sys.stdout  # looked up now: a test may have swapped it since import
    from wizard.monitor.attach import REMOTE_DIR
    from wizard.monitor.run_files import read_events

    # rank 0 runs on node 0, which may be another host: then its events came through the status stream
    found = [
        event
        for events in (read_events(run_dir).get(0, []), read_events(run_dir / REMOTE_DIR).get(0, []))
        for event in events
        if event.get("event") == "bandwidth"
    ]
    if not found:
        print("bandwidth: rank 0 recorded no result (see its log under logs/)", file=out)
        return False
    result = bandwidth_result(found[-1], answers)
    write_json(run_dir / BANDWIDTH_FILE, result)
    for line in [*table_lines(result), *expected_lines(result)]:
        print(line, file=out)
    print(f"  written to {run_dir / BANDWIDTH_FILE}", file=out)
    return True
