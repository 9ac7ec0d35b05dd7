"""Kubernetes restarts are the operators' own: run.restarts renders their fault handling, the run reports what they did.

The AscendJob gets MindCluster's job-level rescheduling (the fault-scheduling
and fault-retry-times labels that Volcano and the ascend-operator read, and
runPolicy.backoffLimit); the PyTorchJob the training operator's OnFailure
restart policy with runPolicy.backoffLimit. Both are checked against their CRD
schemas; a run against the kubectl double, whose job restarts node 1's pod,
names the restart live and in the summary.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.kube_schemas import problems
from tests.runs import start_runner
from tests.test_k8s_engine import Kubectl, finish, k8s_project
from tests.test_k8s_manifests import rendered, replicas


def test_an_ascendjob_with_restarts_asks_mindcluster_to_reschedule_the_job(tmp_path: Path) -> None:
    _project, job, _configmap = rendered(tmp_path, "ascendjob", run__restarts=3)

    assert problems(job) == []
    labels = job["metadata"]["labels"]
    assert labels["fault-scheduling"] == "force" and labels["fault-retry-times"] == "3"
    assert job["spec"]["runPolicy"]["backoffLimit"] == 3
    # MindCluster reschedules whole jobs whose pods do not restart in place
    assert {spec["restartPolicy"] for spec in replicas(job).values()} == {"Never"}


def test_a_pytorchjob_with_restarts_restarts_failed_pods_up_to_its_backoff_limit(tmp_path: Path) -> None:
    _project, job, _configmap = rendered(tmp_path, "pytorchjob", run__restarts=2)

    assert problems(job) == []
    assert job["spec"]["runPolicy"] == {"backoffLimit": 2}
    assert {role: spec["restartPolicy"] for role, spec in replicas(job).items()} == {
        "Master": "OnFailure",
        "Worker": "OnFailure",
    }


def test_without_restarts_the_operators_restart_nothing(tmp_path: Path) -> None:
    for engine in ("ascendjob", "pytorchjob"):
        _project, job, _configmap = rendered(tmp_path / engine, engine)
        assert "fault-scheduling" not in job["metadata"]["labels"]
        assert "backoffLimit" not in job["spec"].get("runPolicy", {})
        assert {spec["restartPolicy"] for spec in replicas(job).values()} == {"Never"}


def test_the_restarts_the_operator_made_are_said_live_and_in_the_summary(tmp_path: Path) -> None:
    project = k8s_project(tmp_path, "pytorchjob")
    kubectl = Kubectl(tmp_path / "kubectl", "restart")

    code, output = finish(start_runner(project, env=kubectl.env))

    assert code == 0, output
    assert "pytorchjob: job demo Restarting: pod restarted" in output
    assert "pytorchjob: pod demo-worker-0 (node 1) restarted in place after exit code 137: restartCount 1" in output
    assert "the operator restarted node 1's pod 1 time, the job 1 time (Restarting)" in output
    (run_dir,) = [p for p in (project / "runs").iterdir() if p.is_dir()]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "finished"
    assert summary["operator_restarts"] == {"pods": {"1": 1}, "job": 1}


def test_more_restarts_than_mindcluster_documents_are_warned_of_for_an_ascendjob() -> None:
    from tests.test_k8s_manifests import k8s_answers

    warned = [(p.field, p.message) for p in k8s_answers("ascendjob", run__restarts=101).warnings]
    assert (
        "run.restarts",
        "an AscendJob carries it as MindCluster's fault-retry-times label, documented for 0 to 100",
    ) in warned
    assert not [p for p in k8s_answers("pytorchjob", run__restarts=101).warnings if p.field == "run.restarts"]


def test_run_restarts_under_kubernetes_leaves_the_restarting_to_the_operator(tmp_path: Path) -> None:
    project = k8s_project(tmp_path, "ascendjob")
    kubectl = Kubectl(tmp_path / "kubectl", "fail")

    code, output = finish(start_runner(project, "--restarts", "2", env=kubectl.env))

    assert code == 3, output
    assert (
        "note: --restarts 2: under ascendjob the operator restarts the job, as its manifest says, and "
        "k8s/ascendjob.yaml asks for no restart (run.restarts 0); npu-wizard run does not start it again on top"
    ) in output
    assert kubectl.jobs_created() == 1  # the failed job was not applied again by the runner
