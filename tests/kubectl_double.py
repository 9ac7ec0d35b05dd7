"""A test double of kubectl: records every call and plays a scripted job, with no cluster behind it.

Tests put a `kubectl` on PATH that runs this file. It appends each call's
arguments and working folder to $KUBECTL_DOUBLE_DIR/calls.jsonl, keeps what
`apply` was given, and answers `get`, `logs` and `delete` from the scenario in
$KUBECTL_DOUBLE_DIR/scenario:

- succeed: the job is Created (pods Pending, unschedulable), then Running, then Succeeded;
- fail: Created, Running, then Failed with node 1's pod exited 3;
- restart: Created, Running, Restarting (the operator restarted node 1's pod in place after exit
  code 137: restartCount 1), Running again, then Succeeded;
- run: Running until it is deleted;
- no-context: `kubectl config current-context` fails, as on a machine with no cluster set up.
- refuse-apply: the cluster refuses to apply the job (a quota), after the ConfigMap.

The step of a scenario advances with each `get` of the job. Like an API
server, the double keeps a job until it is deleted: applying the same job
again while it exists changes nothing (its status, a finished one's
`Succeeded` included, stays), while applying it after a delete creates it
anew from the first step. $KUBECTL_DOUBLE_DIR/created counts the jobs
created.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

STATE = Path(os.environ["KUBECTL_DOUBLE_DIR"])
FOLLOW_AT_MOST_S = 600.0
# the API server refuses annotations over 256 KiB: a client-side apply keeps the whole object in one
ANNOTATION_LIMIT = 262144


def record(argv: list[str]) -> None:
    """Append this call to the log."""
    with (STATE / "calls.jsonl").open("a") as log:
        log.write(json.dumps({"argv": argv, "cwd": os.getcwd()}) + "\n")


def scenario() -> str:
    """The scripted job's name."""
    return (STATE / "scenario").read_text().strip()


def step() -> int:
    """How many times the job was asked for so far."""
    path = STATE / "steps"
    return int(path.read_text()) if path.exists() else 0


def job_name() -> str:
    """The applied job's name and kind (from what apply was given)."""
    applied = json.loads((STATE / "applied.json").read_text())
    return applied["name"]


def job_exists() -> bool:
    """Whether a job was applied and not deleted since."""
    return (STATE / "applied.json").exists() and not (STATE / "deleted").exists()


def create_job(name: str) -> bool:
    """Apply the job: create it anew where none exists (True), else leave it as it stands (False)."""
    if job_exists():
        return False
    (STATE / "applied.json").write_text(json.dumps({"name": name}))
    (STATE / "deleted").unlink(missing_ok=True)
    (STATE / "steps").write_text("0")
    created = STATE / "created"
    created.write_text(str(int(created.read_text()) + 1 if created.exists() else 1))
    return True


def pod(
    name: str,
    role: str,
    index: int,
    phase: str,
    *,
    code: int | None = None,
    pending: str = "",
    at: str = "",
    restarts: int = 0,
) -> dict[str, Any]:
    """A pod as `kubectl get pods -o json` lists it, with the training operator's labels."""
    status: dict[str, Any] = {"phase": phase}
    if pending:
        status["conditions"] = [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": pending}
        ]
    if code is not None:
        ended = {"exitCode": code, "finishedAt": at or "2026-01-01T10:00:00Z"}
        status["containerStatuses"] = [{"name": "c", "state": {"terminated": ended}}]
    elif phase == "Running":
        status["containerStatuses"] = [{"name": "c", "state": {"running": {}}}]
    if restarts:  # the kubelet started the container again after it ended with 137 (killed)
        for container in status["containerStatuses"]:
            container["restartCount"] = restarts
            container["lastState"] = {"terminated": {"exitCode": 137, "finishedAt": "2026-01-01T10:00:03Z"}}
    labels = {"training.kubeflow.org/replica-type": role, "training.kubeflow.org/replica-index": str(index)}
    return {"metadata": {"name": f"{name}-{role}-{index}", "labels": labels}, "status": status}


def pods(now: int) -> list[dict[str, Any]]:
    """The job's two pods at this step of the scenario."""
    if not job_exists():
        return []
    name, plan = job_name(), scenario()
    if now <= 1:
        unschedulable = "0/2 nodes are available: 2 Insufficient huawei.com/Ascend910."
        return [pod(name, "master", 0, "Pending", pending=unschedulable), pod(name, "worker", 0, "Pending")]
    if now == 2 or plan == "run":
        return [pod(name, "master", 0, "Running"), pod(name, "worker", 0, "Running")]
    if plan == "restart":
        phase, code = ("Running", None) if now <= 4 else ("Succeeded", 0)
        return [pod(name, "master", 0, phase, code=code), pod(name, "worker", 0, phase, code=code, restarts=1)]
    if plan == "fail":
        # the worker fails first; the operator then stops the master (143: SIGTERM)
        return [
            pod(name, "master", 0, "Failed", code=143, at="2026-01-01T10:00:09Z"),
            pod(name, "worker", 0, "Failed", code=3, at="2026-01-01T10:00:05Z"),
        ]
    return [pod(name, "master", 0, "Succeeded", code=0), pod(name, "worker", 0, "Succeeded", code=0)]


def job(now: int) -> dict[str, Any] | None:
    """The job's status at this step."""
    if not job_exists():
        return None
    plan = scenario()
    conditions = [{"type": "Created", "status": "True"}]
    if now >= 2:
        conditions.append({"type": "Running", "status": "True"})
    if plan == "restart" and now >= 3:
        # the operator restarts the failed pod (Restarting), then the job runs again and succeeds
        conditions[-1]["status"] = "False" if now == 3 else "True"
        restarting = {"type": "Restarting", "status": "True" if now == 3 else "False", "message": "pod restarted"}
        conditions.insert(-1 if now > 3 else len(conditions), restarting)
        if now >= 5:
            conditions.append({"type": "Succeeded", "status": "True", "message": "all pods succeeded"})
    if now >= 3 and plan == "succeed":
        conditions += [{"type": "Succeeded", "status": "True", "message": "all pods succeeded"}]
    if now >= 3 and plan == "fail":
        message = f"Job default/{job_name()} has failed because has pod failed."
        conditions += [{"type": "Failed", "status": "True", "message": message}]
    return {"metadata": {"name": job_name()}, "status": {"conditions": conditions}}


def files_given(argv: list[str]) -> list[Path]:
    """The -f arguments of a call."""
    return [Path(argv[i + 1]) for i, arg in enumerate(argv) if arg == "-f"]


def main(argv: list[str]) -> int:
    """Answer one kubectl call."""
    record(argv)
    if argv[:2] == ["config", "current-context"]:
        if scenario() == "no-context":
            print("error: current-context is not set", file=sys.stderr)
            return 1
        print("double-cluster")
        return 0
    if argv[:1] == ["apply"]:
        import yaml

        for path in files_given(argv):
            document = yaml.safe_load(path.read_text())
            applied = len(json.dumps(document).encode())
            if "--server-side" not in argv and applied > ANNOTATION_LIMIT:
                # a client-side apply copies the object into an annotation, which the API server caps
                print(
                    f'The {document["kind"]} "{document["metadata"]["name"]}" is invalid: metadata.annotations: '
                    f"Too long: must have at most {ANNOTATION_LIMIT} bytes",
                    file=sys.stderr,
                )
                return 1
            if scenario() == "refuse-apply" and document["kind"] != "ConfigMap":
                print('Error from server (Forbidden): exceeded quota: "compute"', file=sys.stderr)
                return 1
            (STATE / f"applied-{document['kind']}.yaml").write_text(path.read_text())
            said = "created"
            if document["kind"] != "ConfigMap" and not create_job(document["metadata"]["name"]):
                said = "unchanged"
            print(f"{document['kind'].lower()}/{document['metadata']['name']} {said}")
        return 0
    if argv[:1] == ["get"] and argv[1] == "pods":
        print(json.dumps({"items": pods(step())}))
        return 0
    if argv[:1] == ["get"]:
        if not job_exists():
            print(f'Error from server (NotFound): "{argv[2]}" not found', file=sys.stderr)
            return 1
        now = step() + 1
        (STATE / "steps").write_text(str(now))
        found = job(now)
        if found is None:
            print(f'Error from server (NotFound): "{argv[2]}" not found', file=sys.stderr)
            return 1
        print(json.dumps(found))
        return 0
    if argv[:1] == ["logs"]:
        pod_name = argv[-1]
        for step_done in (10, 20):
            print(f"[rank 0] step {step_done} loss 0.{50 - step_done}", flush=True)
        if "-f" in argv and scenario() == "run":
            # follows until the job is deleted; bounded, so that a runner killed outright leaves nothing for ever
            deadline = time.monotonic() + FOLLOW_AT_MOST_S
            while not (STATE / "deleted").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
        print(f"log of {pod_name} ends")
        return 0
    if argv[:1] == ["delete"]:
        (STATE / "deleted").write_text("yes")
        for path in files_given(argv):
            print(f"{path} deleted")
        if not files_given(argv):
            print(f"{argv[1]}/{argv[2]} deleted")
        return 0
    print(f"kubectl double: unscripted call {argv}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
