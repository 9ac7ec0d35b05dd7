"""The summary's lines on hosts and schedulers: spares that took a node's place, nodes kept off, operator restarts."""

from __future__ import annotations

from typing import Any


def host_lines(summary: dict[str, Any]) -> list[str]:
    """What summary.json says of hosts replaced, nodes excluded and the operator's restarts, as printed lines."""
    lines = []
    for change in summary.get("hosts_changed") or []:
        if change.get("by"):
            lines.append(
                f"attempt {change['attempt']}: node {change['node']} moved from {change['replaced']} to spare host "
                f"{change['by']} ({change['why']})"
            )
        else:
            lines.append(f"attempt {change['attempt']}: {change['replaced']} (node {change['node']}) kept off the job")
    lines += [f"hosts: {note}" for note in summary.get("hosts_notes") or []]
    excluded = summary.get("slurm_excluded")
    if excluded:
        lines.append(f"slurm: this job was kept off {', '.join(excluded)} (sbatch --exclude), where a node failed")
    restarts = summary.get("operator_restarts")
    if restarts:
        pods = restarts.get("pods") or {}
        said = [f"node {node}'s pod {count} time{'s' if count > 1 else ''}" for node, count in pods.items()]
        job = restarts.get("job") or 0
        if job:
            said.append(f"the job {job} time{'s' if job > 1 else ''} (Restarting)")
        lines.append(f"the operator restarted {', '.join(said)}")
    return lines
