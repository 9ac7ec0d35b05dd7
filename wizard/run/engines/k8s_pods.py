"""Reading the training operator's jobs and pods as `kubectl get -o json` gives them: nodes, phases, exit codes."""

from __future__ import annotations

import re
from typing import Any

ROLE_LABELS = ("training.kubeflow.org/replica-type", "replica-type")
INDEX_LABELS = ("training.kubeflow.org/replica-index", "replica-index")


def node_of(pod: dict[str, Any]) -> int | None:
    """The job node a pod is: Master is node 0, Worker i is node i + 1 (None when the pod says neither)."""
    labels = pod.get("metadata", {}).get("labels", {})
    role = next((labels[key] for key in ROLE_LABELS if key in labels), None)
    index = next((labels[key] for key in INDEX_LABELS if key in labels), None)
    if role is None or index is None:
        match = re.search(r"-(master|worker)-(\d+)$", pod.get("metadata", {}).get("name", ""))
        if match is None:
            return None
        role, index = match.groups()
    if not str(index).isdigit():
        return None
    return 0 if str(role).lower() == "master" else int(index) + 1


def pod_phase(pod: dict[str, Any]) -> str:
    """A pod's phase with the reason that matters while it waits or after it ended."""
    status = pod.get("status", {})
    phase = status.get("phase", "Unknown")
    for container in status.get("containerStatuses", []):
        state = container.get("state", {})
        if "waiting" in state and state["waiting"].get("reason") not in (None, "ContainerCreating"):
            waiting = state["waiting"]
            return f"{phase} ({waiting['reason']}: {waiting.get('message', '')})".replace(": )", ")")
        if "terminated" in state:
            return f"{phase} (exit code {state['terminated'].get('exitCode')})"
    for condition in status.get("conditions", []):
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return f"{phase} ({condition.get('reason')}: {condition.get('message', '')})"
    return phase


def terminated(pod: dict[str, Any]) -> dict[str, Any] | None:
    """How a pod's container ended (exitCode, finishedAt), or None while it has not."""
    for container in pod.get("status", {}).get("containerStatuses", []):
        state = container.get("state", {}).get("terminated")
        if state is not None:
            return state
    return None


def failed_codes(nodes: dict[int, dict[str, Any]]) -> dict[int, int | None]:
    """Each node's exit code, keeping only the first failure by time: the operator stops the others after it."""
    ended = {node: state for node, pod in nodes.items() if (state := terminated(pod)) is not None}
    codes: dict[int, int | None] = {node: int(state.get("exitCode", 1)) for node, state in ended.items()}
    failures = [node for node, code in codes.items() if code != 0]
    if failures:
        first = min(failures, key=lambda node: (str(ended[node].get("finishedAt", "")), node))
        codes.update({node: None for node in failures if node != first})
    return codes


def job_condition(job: dict[str, Any]) -> tuple[str, str]:
    """The job's latest true condition (Created, Running, Restarting, Succeeded, Failed) and its message."""
    current = [c for c in job.get("status", {}).get("conditions", []) if c.get("status") == "True"]
    if not current:
        return "Created", ""
    return current[-1].get("type", "Unknown"), current[-1].get("message", "")


def pod_restarts(pod: dict[str, Any]) -> tuple[int, int | None]:
    """How often the kubelet restarted the pod's container (restartCount), and how its last run ended (exit code)."""
    count, code = 0, None
    for container in pod.get("status", {}).get("containerStatuses", []):
        count = max(count, int(container.get("restartCount") or 0))
        last = container.get("lastState", {}).get("terminated")
        if last is not None:
            code = last.get("exitCode")
    return count, code
