"""`npu-wizard run` for the Kubernetes engines, against a kubectl test double on PATH.

No API server can run here: tests/kubectl_double.py stands in for kubectl,
records every call and plays a scripted job (pending, running, then
succeeded or failed, or running until deleted). The runner is the real
`npu-wizard run`, started as a user starts it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.runs import BIN, start_runner, wait_for
from wizard.answers.model import resolve
from wizard.render import k8s
from wizard.render.k8s_code import LAYOUT_KEY
from wizard.render.render import render

DOUBLE = Path(__file__).parent / "kubectl_double.py"


def k8s_project(tmp_path: Path, engine: str) -> Path:
    """A rendered 2 x 2 CPU project for the engine."""
    raw: dict[str, Any] = {
        "project_name": "demo",
        "device": "cpu",
        "nodes": 2,
        "devices_per_node": 2,
        "amp": "off",
        "cluster.engine": engine,
        "cluster.image": "registry.example.com/train:cpu",
        "cluster.namespace": "ml",
    }
    return render(resolve(raw), tmp_path / "out").project_dir


def plain_path() -> str:
    """PATH with this venv first and no folder that holds a real kubectl."""
    folders = [BIN] + [d for d in os.environ.get("PATH", "").split(":") if d and not Path(d, "kubectl").exists()]
    return ":".join(folders)


class Kubectl:
    """The kubectl double's folder: its scenario, its calls."""

    def __init__(self, root: Path, scenario: str) -> None:
        self.state = root / "state"
        self.state.mkdir(parents=True)
        (self.state / "scenario").write_text(scenario)
        bin_dir = root / "bin"
        bin_dir.mkdir()
        launcher = bin_dir / "kubectl"
        launcher.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{DOUBLE}" "$@"\n')
        launcher.chmod(0o755)
        self.env = {**os.environ, "PATH": f"{bin_dir}:{plain_path()}", "KUBECTL_DOUBLE_DIR": str(self.state)}

    def calls(self) -> list[list[str]]:
        """Every call's arguments, in order."""
        log = self.state / "calls.jsonl"
        return [json.loads(line)["argv"] for line in log.read_text().splitlines()] if log.exists() else []

    def called(self, *prefix: str) -> list[list[str]]:
        """The calls that start with these arguments."""
        return [call for call in self.calls() if call[: len(prefix)] == list(prefix)]

    def jobs_created(self) -> int:
        """How many times the cluster created the job (a second apply of an existing job creates none)."""
        created = self.state / "created"
        return int(created.read_text()) if created.exists() else 0


def finish(runner: subprocess.Popen[str], timeout: float = 120) -> tuple[int, str]:
    """Wait for the runner; its exit code and output."""
    try:
        output, _ = runner.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        runner.kill()
        output, _ = runner.communicate()
        raise AssertionError(f"npu-wizard run did not end:\n{output}") from None
    return runner.returncode, output


def test_code_over_the_256_kib_of_a_client_side_apply_is_applied_and_runs(tmp_path: Path) -> None:
    # The runtime alone came close to what a client-side apply's annotation holds; a module of 300 KB beside
    # the script is over it, and the double refuses a client-side apply as the API server does.
    project = k8s_project(tmp_path, "pytorchjob")
    (project / "vocabulary.py").write_text("WORDS = '" + "w" * 300_000 + "'\n")
    kubectl = Kubectl(tmp_path / "kubectl", "succeed")
    code, output = finish(start_runner(project, env=kubectl.env))
    assert code == 0, output
    assert "vocabulary.py" in (kubectl.state / "applied-ConfigMap.yaml").read_text()
    assert "pytorchjob: job demo Succeeded" in output


@pytest.mark.parametrize("engine", ["ascendjob", "pytorchjob"])
def test_run_applies_follows_and_finishes(tmp_path: Path, engine: str) -> None:
    project = k8s_project(tmp_path, engine)
    kubectl = Kubectl(tmp_path / "kubectl", "succeed")
    code, output = finish(start_runner(project, env=kubectl.env))
    assert code == 0, output
    (apply,) = kubectl.called("apply")
    assert apply == ["apply", "--server-side", "-f", k8s.CONFIGMAP_FILE, "-f", f"k8s/{engine}.yaml"]
    assert (kubectl.state / "applied-ConfigMap.yaml").read_text() == (project / k8s.CONFIGMAP_FILE).read_text()
    kind = {"ascendjob": "AscendJob", "pytorchjob": "PyTorchJob"}[engine]
    assert (kubectl.state / f"applied-{kind}.yaml").read_text() == (project / f"k8s/{engine}.yaml").read_text()
    resource = {"ascendjob": "ascendjob.mindxdl.gitee.com", "pytorchjob": "pytorchjob.kubeflow.org"}[engine]
    assert ["get", resource, "demo", "-n", "ml", "-o", "json"] in kubectl.calls()
    assert ["logs", "-f", "-n", "ml", "demo-master-0"] in kubectl.calls()
    assert "Unschedulable: 0/2 nodes are available: 2 Insufficient huawei.com/Ascend910." in output
    assert f"{engine}: pod demo-worker-0 (node 1) Running" in output
    assert "node 0: [rank 0] step 10 loss 0.40" in output
    assert f"{engine}: job demo Succeeded" in output
    assert not kubectl.called("delete"), "a finished job is left for kubectl to show"
    (run_dir,) = [p for p in (project / "runs").iterdir() if p.is_dir()]
    assert "log of demo-worker-0 ends" in (run_dir / "logs" / "node-1.log").read_text()
    assert "[rank 0] step 20" in (run_dir / "logs" / "node-0.log").read_text()


def test_a_failed_pod_fails_the_run_and_names_its_node(tmp_path: Path) -> None:
    project = k8s_project(tmp_path, "ascendjob")
    kubectl = Kubectl(tmp_path / "kubectl", "fail")
    code, output = finish(start_runner(project, env=kubectl.env))
    assert code == 3, output
    assert "node 1's launcher" in output and "(exit code 3)" in output, "the first failure by time is named"
    assert "has failed because has pod failed" in output
    # a failed job's pods may still run (and hold NPUs): the job is deleted, its logs kept here
    assert kubectl.called("delete")
    (run_dir,) = [p for p in (project / "runs").iterdir() if p.is_dir()]
    assert "log of demo-worker-0 ends" in (run_dir / "logs" / "node-1.log").read_text()


def test_ctrl_c_deletes_the_job(tmp_path: Path) -> None:
    project = k8s_project(tmp_path, "pytorchjob")
    kubectl = Kubectl(tmp_path / "kubectl", "run")
    runner = start_runner(project, env=kubectl.env)
    try:
        wait_for(lambda: kubectl.called("logs", "-f"), timeout=60, what="the runner to follow node 0's log")
        runner.send_signal(signal.SIGINT)
        code, output = finish(runner)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert code == 130, output
    (delete,) = kubectl.called("delete")
    assert delete == [
        "delete",
        "--ignore-not-found",
        "--wait=true",
        "-f",
        "k8s/pytorchjob.yaml",
        "-f",
        k8s.CONFIGMAP_FILE,
    ]
    assert "deleted pytorchjob.kubeflow.org/demo" in output


def test_a_second_run_deletes_the_finished_job_first_and_trains_again(tmp_path: Path) -> None:
    project = k8s_project(tmp_path, "ascendjob")
    kubectl = Kubectl(tmp_path / "kubectl", "succeed")
    code, first = finish(start_runner(project, env=kubectl.env))
    assert code == 0, first
    assert kubectl.jobs_created() == 1
    # the finished job stays on the cluster, Succeeded, as a real API server keeps it

    code, second = finish(start_runner(project, env=kubectl.env))

    assert code == 0, second
    assert "ascendjob: deleted the finished job demo (Succeeded) an earlier run left, to run it anew" in second
    delete = ["delete", "ascendjob.mindxdl.gitee.com", "demo", "-n", "ml", "--ignore-not-found", "--wait=true"]
    assert kubectl.called("delete") == [[*delete, "--cascade=foreground"]]
    assert kubectl.jobs_created() == 2
    assert "ascendjob: pod demo-master-0 (node 0) Running" in second
    assert "node 0: [rank 0] step 10 loss 0.40" in second, "the second run trained"
    second_run = sorted(p for p in (project / "runs").iterdir() if p.is_dir())[-1]
    assert "[rank 0] step 20" in (second_run / "logs" / "node-0.log").read_text()


def test_a_job_of_the_same_name_still_running_is_refused_and_left_alone(tmp_path: Path) -> None:
    project = k8s_project(tmp_path, "pytorchjob")
    kubectl = Kubectl(tmp_path / "kubectl", "run")
    subprocess.run(
        ["kubectl", "apply", "--server-side", "-f", k8s.CONFIGMAP_FILE, "-f", "k8s/pytorchjob.yaml"],
        cwd=project,
        env=kubectl.env,
        check=True,
        capture_output=True,
    )

    code, output = finish(start_runner(project, env=kubectl.env))

    assert code == 1, output
    assert "pytorchjob.kubeflow.org/demo already exists in namespace ml (Created)" in output
    assert "kubectl delete pytorchjob.kubeflow.org demo -n ml" in output
    assert kubectl.called("delete") == []
    assert len(kubectl.called("apply")) == 1, "only the job that was there before"
    assert kubectl.jobs_created() == 1


@pytest.mark.parametrize("setup", ["no kubectl", "no context"])
def test_without_kubectl_the_commands_are_printed(tmp_path: Path, setup: str) -> None:
    project = k8s_project(tmp_path, "ascendjob")
    if setup == "no kubectl":
        assert shutil.which("kubectl", path=plain_path()) is None
        env = {**os.environ, "PATH": plain_path()}
        kubectl = None
    else:
        kubectl = Kubectl(tmp_path / "kubectl", "no-context")
        env = kubectl.env
    code, output = finish(start_runner(project, env=env))
    assert code == 0, output
    assert "nothing was submitted" in output
    assert "  kubectl apply --server-side -f k8s/project.yaml -f k8s/ascendjob.yaml\n" in output
    assert "kubectl get pods -n ml -l npu-wizard/job=demo --watch" in output
    assert "kubectl delete --ignore-not-found --wait=true -f k8s/ascendjob.yaml -f k8s/project.yaml" in output
    if kubectl is not None:
        assert kubectl.calls() == [["config", "current-context"]]
    assert not (project / "runs").exists()


def test_dry_run_prints_the_manifest_and_submits_nothing(tmp_path: Path) -> None:
    project = k8s_project(tmp_path, "pytorchjob")
    kubectl = Kubectl(tmp_path / "kubectl", "succeed")
    code, output = finish(start_runner(project, "--dry-run", env=kubectl.env))
    assert code == 0, output
    assert "kubectl apply --server-side -f k8s/project.yaml -f k8s/pytorchjob.yaml" in output
    assert (project / "k8s" / "pytorchjob.yaml").read_text() in output
    assert "#   train.py: " in output
    assert kubectl.calls() == []


def test_a_module_added_to_the_project_travels_with_the_next_run(tmp_path: Path) -> None:
    project = k8s_project(tmp_path, "ascendjob")
    (project / "helpers.py").write_text("ANSWER = 42\n")
    kubectl = Kubectl(tmp_path / "kubectl", "succeed")
    code, output = finish(start_runner(project, env=kubectl.env))
    assert code == 0, output
    applied = yaml.safe_load((kubectl.state / "applied-ConfigMap.yaml").read_text())
    assert applied["data"]["helpers.py"] == "ANSWER = 42\n"
    assert "helpers.py helpers.py\n" in applied["data"][LAYOUT_KEY]


def test_a_manifest_listing_files_the_project_no_longer_matches_is_refused_before_anything_is_applied(
    tmp_path: Path,
) -> None:
    project = k8s_project(tmp_path, "ascendjob")
    manifest = project / k8s.manifest_file("ascendjob")
    job = k8s.load_manifest(manifest)
    for replica in job["spec"]["replicaSpecs"].values():  # as an earlier npu-wizard mounted the files: one by one
        (volume,) = [v for v in replica["template"]["spec"]["volumes"] if v["name"] == "project"]
        volume["configMap"]["items"] = [{"key": "train.py", "path": "train.py"}]
    manifest.write_text(yaml.safe_dump(job))
    kubectl = Kubectl(tmp_path / "kubectl", "succeed")
    code, output = finish(start_runner(project, env=kubectl.env))
    assert code == 1, output
    assert "runtime/data.py" in output and f"npu-wizard update {project} renders a manifest" in output
    assert not kubectl.called("apply")


def readme_run_commands(project: Path) -> list[str]:
    """The kubectl commands the project's README gives for running the job, above how to watch and stop it."""
    text = (project / "README.md").read_text().split("Watch and stop the job yourself")[0]
    return [line.strip() for line in text.splitlines() if line.startswith("    kubectl ")]


@pytest.mark.parametrize("engine", ["ascendjob", "pytorchjob"])
def test_the_readmes_commands_by_hand_run_a_finished_job_again(tmp_path: Path, engine: str) -> None:
    project = k8s_project(tmp_path, engine)
    kubectl = Kubectl(tmp_path / "kubectl", "succeed")
    readme = (project / "README.md").read_text()
    assert readme.index("    npu-wizard run .") < readme.index("    kubectl apply")
    code, output = finish(start_runner(project, env=kubectl.env))
    assert code == 0 and f"{engine}: job demo Succeeded" in output, output
    assert kubectl.jobs_created() == 1
    for command in readme_run_commands(project):
        subprocess.run(["/bin/sh", "-c", command], cwd=project, env=kubectl.env, check=True, capture_output=True)
    assert kubectl.jobs_created() == 2, readme_run_commands(project)
