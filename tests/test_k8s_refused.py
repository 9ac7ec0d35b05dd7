"""A job the cluster refuses to start is not stopped: npu-wizard run deletes only what it submitted.

The real `npu-wizard run` against tests/kubectl_double.py (a kubectl test
double that records its calls) scripted to refuse the job's apply, as a
quota or an admission webhook does.
"""

from __future__ import annotations

from pathlib import Path

from tests.runs import run_dirs, start_runner
from tests.test_k8s_engine import Kubectl, finish, k8s_project


def test_a_refused_apply_deletes_nothing_and_says_why(tmp_path: Path) -> None:
    project = k8s_project(tmp_path, "pytorchjob")
    kubectl = Kubectl(tmp_path / "kubectl", "refuse-apply")

    code, output = finish(start_runner(project, env=kubectl.env))

    assert code != 0, output
    assert "exceeded quota" in output
    # a job of the same name may be running: cancelling would have deleted it
    assert kubectl.called("delete") == []
    assert "npu-wizard run itself failed" not in output
    assert all(not (run_dir / "summary.json").exists() for run_dir in run_dirs(project))
