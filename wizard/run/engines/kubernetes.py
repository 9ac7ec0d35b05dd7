"""The Kubernetes engines (ascendjob, pytorchjob): kubectl apply the manifests, follow the pods, delete the job.

`check` refuses a job of the same name that has not ended (another run, or one
left running); `submit` deletes a job of the same name that has ended (an
earlier run's: applied again it would keep its `Succeeded` and nothing would
train), writes k8s/project.yaml again from the project's files and applies it
with the job manifest; `describe` reads the job's conditions and its pods'
phases (at most once a second), saying each change once; once node 0's pod
runs, its log is followed into the run folder and passed on line by line; a
job that ends leaves each pod's log in the run folder; `cancel` deletes the job
and its ConfigMap and waits for the pods to go. Where kubectl or a context is
missing, `manual_steps` gives the commands to run by hand.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from wizard.answers.model import Answers
from wizard.answers.script import is_foreign
from wizard.render import k8s
from wizard.render.pristine import repository_root
from wizard.run.engines.base import ENDED, PENDING, RUNNING, Description, Engine, EngineError, Launch, StatusPlan
from wizard.run.engines.common import run_command
from wizard.run.engines.k8s_pods import failed_codes, job_condition, node_of, pod_phase, pod_restarts
from wizard.stopping import deferred_signals

KUBECTL = "kubectl"
POLL_S = 1.0
"""How often the API server is asked at most."""
CANCEL_WAIT_S = 120.0
MISSES_TO_GIVE_UP = 30
"""Reads of the job in a row that may fail (API server restarting) before the run ends as lost."""
RESOURCES = {"ascendjob": "ascendjob.mindxdl.gitee.com", "pytorchjob": "pytorchjob.kubeflow.org"}


def kubectl_problem(env: dict[str, str] | None = None) -> str | None:
    """Why this machine cannot submit with kubectl (not on PATH, no current context); None when it can."""
    path = (env or os.environ).get("PATH", "")
    if shutil.which(KUBECTL, path=path) is None:
        return "kubectl is not on PATH"
    result = run_command([KUBECTL, "config", "current-context"], env=env, timeout=30)
    if result.returncode != 0 or not result.stdout.strip():
        return f"kubectl has no current context ({(result.stderr or result.stdout).strip() or 'none set'})"
    return None


class KubernetesEngine(Engine):
    """Applies the project's AscendJob or PyTorchJob with its ConfigMap and follows the job until it ends."""

    recovery = "operator"
    passes_env = False  # the pods start as the manifest says; Launch.env stays on this machine

    def __init__(self, name: str) -> None:
        self.name = name
        self.resource = RESOURCES[name]
        self.launch: Launch | None = None
        self.job_name = ""
        self.namespace = ""
        self._last = Description(PENDING)
        self._asked_at = float("-inf")
        self._phases: dict[str, str] = {}
        self._said: str | None = None
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._follower: subprocess.Popen[str] | None = None
        self._logs_saved = False
        self._misses = 0
        self._error = ""
        self._ended_before: str | None = None
        """The condition of the same job an earlier run left ended on the cluster, deleted before submitting."""
        self.pod_restarts: dict[int, int] = {}
        """Each node's pod: the restarts the operator made of it, in place (restartCount) or as a new pod."""
        self._pod_ids: dict[int, str] = {}
        self._in_place: dict[int, int] = {}
        self.job_restarts = 0
        """How often the job's condition turned to Restarting (the operator starting pods again)."""

    # ---- what would be sent ------------------------------------------------------------

    def _target(self, answers: Answers) -> tuple[str, str]:
        return k8s.job_name(answers["project_name"]), answers["cluster.namespace"]

    def files(self) -> list[str]:
        """The manifests applied, in order: the ConfigMap first, which the job's pods mount."""
        return [k8s.CONFIGMAP_FILE, k8s.manifest_file(self.name)]

    def apply_command(self) -> list[str]:
        """kubectl apply of both manifests (run in the project folder), server-side: a client-side apply keeps a
        copy of the ConfigMap in an annotation of at most 256 KiB, which the project's code may outgrow."""
        command = [KUBECTL, "apply", "--server-side"]
        for name in self.files():
            command += ["-f", name]
        return command

    def watch_commands(self, answers: Answers) -> list[list[str]]:
        """How to follow the job by hand: its pods, then node 0's log."""
        name, namespace = self._target(answers)
        selector = f"{k8s.JOB_LABEL}={name}"
        return [
            [KUBECTL, "get", "pods", "-n", namespace, "-l", selector, "--watch"],
            [
                KUBECTL,
                "logs",
                "-f",
                "-n",
                namespace,
                "-l",
                selector,
                "--prefix",
                f"--max-log-requests={answers['nodes']}",
            ],
        ]

    def delete_job_command(self) -> list[str]:
        """kubectl delete of the job alone, returning once its pods are gone too (foreground cascade)."""
        return [
            KUBECTL,
            "delete",
            self.resource,
            self.job_name,
            "-n",
            self.namespace,
            "--ignore-not-found",
            "--wait=true",
            "--cascade=foreground",
        ]

    def delete_command(self) -> list[str]:
        """kubectl delete of the job and its ConfigMap."""
        command = [KUBECTL, "delete", "--ignore-not-found", "--wait=true"]
        for name in reversed(self.files()):
            command += ["-f", name]
        return command

    def dry_run(self, launch: Launch) -> str:
        """The commands and the job manifest exactly as applied; the ConfigMap by its files."""
        configmap = k8s.configmap(launch.answers, launch.project)
        listing = "\n".join(f"#   {key}: {len(text.encode())} bytes" for key, text in configmap["data"].items())
        manifest = (launch.project / k8s.manifest_file(self.name)).read_text()
        return (
            f"# {self.name} engine: run in {launch.project}\n"
            f"{shlex.join(self.apply_command())}\n"
            f"# ---- {k8s.CONFIGMAP_FILE}: ConfigMap {configmap['metadata']['name']}, written again from the "
            f"project's files at submit ----\n{listing}\n"
            f"# ---- {k8s.manifest_file(self.name)} ----\n{manifest}"
        )

    def manual_steps(self, launch: Launch) -> str | None:
        """The commands to run by hand where this machine has no kubectl or no context; None where it has both."""
        problem = kubectl_problem()
        if problem is None:
            return None
        k8s.refresh_configmap(launch.project, launch.answers)
        watch = "\n".join(f"  {shlex.join(command)}" for command in self.watch_commands(launch.answers))
        return (
            f"{problem}: nothing was submitted. To run the job, from a machine with kubectl and a context for "
            f"the cluster, in {launch.project}:\n"
            f"  {shlex.join(self.apply_command())}\n"
            f"watch it:\n{watch}\n"
            f"stop it:\n  {shlex.join(self.delete_command())}"
        )

    # ---- run ---------------------------------------------------------------------------

    def check(self, launch: Launch) -> None:
        """The manifest exists, the pods can be given what was asked, and kubectl can reach a cluster."""
        manifest = launch.project / k8s.manifest_file(self.name)
        if not manifest.is_file():
            raise EngineError(f"{manifest} is missing: render the project again with engine {self.name}")
        if launch.train_args:
            raise EngineError(
                f"{' '.join(launch.train_args)}: the {self.name} engine runs the manifest's command as it is; "
                "add arguments to launch/entry.sh's command in the manifest, or run without them"
            )
        script = launch.answers["training.script"]
        where = repository_root(launch.project)  # the project, or the repository it is a folder of
        if is_foreign(script) and not (where / script).is_file():
            raise EngineError(f"{where / script} is missing: put your script there (training.script)")
        # A manifest of an earlier npu-wizard mounts only the files its items list; today's, the whole ConfigMap.
        listed = k8s.listed_files(k8s.load_manifest(manifest))
        current = k8s.carried_files(launch.project, launch.answers)
        if listed and set(listed) != set(current):
            differ = sorted(set(listed) ^ set(current))
            raise EngineError(
                f"the project's files ({', '.join(differ)}) differ from those {k8s.manifest_file(self.name)} mounts: "
                f"npu-wizard update {launch.project} renders a manifest that mounts them all, or list them in the "
                "project volume's items"
            )
        problem = kubectl_problem()
        if problem is not None:
            raise EngineError(f"{problem}: run this where kubectl reaches the cluster")
        self._check_no_job_runs(launch)

    def _check_no_job_runs(self, launch: Launch) -> None:
        """Refuse while a job of this name has not ended; note one that has, for `submit` to delete."""
        self.job_name, self.namespace = self._target(launch.answers)
        result = run_command(
            [KUBECTL, "get", self.resource, self.job_name, "-n", self.namespace, "-o", "json"], timeout=30
        )
        if result.returncode != 0:
            said = (result.stderr or result.stdout).strip()
            if "NotFound" in said:
                return
            raise EngineError(f"kubectl cannot read {self.resource}/{self.job_name}: {said}")
        try:
            condition, _ = job_condition(json.loads(result.stdout))
        except json.JSONDecodeError:
            said = f"kubectl get {self.resource}/{self.job_name} gave no JSON: {result.stdout[:200]}"
            raise EngineError(said) from None
        if condition in ("Succeeded", "Failed"):
            self._ended_before = condition
            return
        delete = [KUBECTL, "delete", self.resource, self.job_name, "-n", self.namespace]
        raise EngineError(
            f"{self.resource}/{self.job_name} already exists in namespace {self.namespace} ({condition}): "
            f"another run of this project is under way or was left running; applying would not start a new one. "
            f"Wait for it to end, or stop it with `{shlex.join(delete)}`, and run again"
        )

    def _delete_ended_job(self) -> None:
        """Delete the ended job an earlier run left, so that applying creates it anew; say so."""
        if self._ended_before is None:
            return
        result = run_command(self.delete_job_command(), timeout=CANCEL_WAIT_S)
        if result.returncode != 0:
            raise EngineError(
                f"cannot delete the finished job {self.job_name} ({self._ended_before}) an earlier run left: "
                f"{(result.stderr or result.stdout).strip()}; delete it with `{shlex.join(self.delete_job_command())}`"
            )
        said = f"deleted the finished job {self.job_name} ({self._ended_before}) an earlier run left, to run it anew"
        self._say(said)

    def status_plan(self, launch: Launch, port: int | None) -> StatusPlan:
        """The pods cannot reach this runner: nothing listens; the ranks are followed through the pods' logs."""
        return StatusPlan(None, 0, "")

    def submit(self, launch: Launch) -> str:
        """Write the ConfigMap from the project's files, kubectl apply both manifests; return namespace/name."""
        self.launch = launch
        self.job_name, self.namespace = self._target(launch.answers)
        (launch.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        self._delete_ended_job()
        k8s.refresh_configmap(launch.project, launch.answers)
        result = run_command(self.apply_command(), cwd=str(launch.project), timeout=120)
        if result.returncode != 0:
            raise EngineError(f"kubectl apply refused the job: {(result.stderr or result.stdout).strip()}")
        self._say(f"applied {self.resource}/{self.job_name} in namespace {self.namespace}")
        return f"{self.namespace}/{self.job_name}"

    def _kubectl_json(self, *args: str) -> dict[str, Any] | None:
        result = run_command([KUBECTL, *args, "-n", self.namespace, "-o", "json"], timeout=30)
        if result.returncode != 0:
            self._error = (result.stderr or result.stdout).strip()
            return None
        try:
            return json.loads(result.stdout)
        except json.JSONDecodeError:
            return None

    def describe(self) -> Description:
        """The job's state from its conditions and its pods (asked at most once a second)."""
        if self.launch is None or self._last.state == ENDED:
            return self._last
        now = time.monotonic()
        if now - self._asked_at < POLL_S:
            return self._last
        self._asked_at = now
        job = self._kubectl_json("get", self.resource, self.job_name)
        pods = self._kubectl_json("get", "pods", "-l", f"{k8s.JOB_LABEL}={self.job_name}") or {"items": []}
        nodes = {node: pod for pod in pods.get("items", []) if (node := node_of(pod)) is not None}
        self._report_pods(nodes)
        self._count_restarts(nodes)
        if job is None:
            self._misses += 1
            if self._misses >= MISSES_TO_GIVE_UP:
                self._last = Description(ENDED, {}, f"kubectl cannot read the job any more: {self._error}")
            return self._last
        self._misses = 0
        condition, message = job_condition(job)
        said = f"job {self.job_name} {condition}" + (f": {message}" if message else "")
        if said != self._said:
            if condition == "Restarting":
                self.job_restarts += 1
            self._said = said
            self._say(said)
        if condition in ("Succeeded", "Failed"):
            self._save_logs(nodes)
            codes = {node: 0 for node in self.launch.nodes} if condition == "Succeeded" else failed_codes(nodes)
            self._last = Description(ENDED, codes, said)
        elif (
            nodes
            and len(nodes) == self.launch.answers["nodes"]
            and all(p.get("status", {}).get("phase") == "Running" for p in nodes.values())
        ):
            self._follow(nodes[0] if 0 in nodes else None)
            self._last = Description(RUNNING, {node: None for node in nodes})
        else:
            self._last = Description(PENDING)
        return self._last

    def _report_pods(self, nodes: dict[int, dict[str, Any]]) -> None:
        for node, pod in sorted(nodes.items()):
            name = pod["metadata"]["name"]
            phase = pod_phase(pod)
            if self._phases.get(name) != phase:
                self._phases[name] = phase
                self._say(f"pod {name} (node {node}) {phase}")

    def _count_restarts(self, nodes: dict[int, dict[str, Any]]) -> None:
        """Say each restart the operator made of a node's pod: its container in place, or the pod made anew."""
        for node, pod in sorted(nodes.items()):
            name = pod["metadata"]["name"]
            count, code = pod_restarts(pod)
            uid = pod.get("metadata", {}).get("uid")
            if uid is not None and self._pod_ids.setdefault(node, uid) != uid:
                self._pod_ids[node] = uid  # the pod was deleted and made again (MindCluster's rescheduling)
                self._in_place[node] = 0  # a new pod counts its container's restarts from 0
                self.pod_restarts[node] = self.pod_restarts.get(node, 0) + 1
                self._say(f"pod {name} (node {node}) made again by the operator")
            if count > self._in_place.get(node, 0):
                self.pod_restarts[node] = self.pod_restarts.get(node, 0) + count - self._in_place.get(node, 0)
                self._in_place[node] = count
                ended = f" after exit code {code}" if code is not None else ""
                self._say(f"pod {name} (node {node}) restarted in place{ended}: restartCount {count}")

    def summary_fields(self) -> dict[str, Any]:
        """The restarts the operator made (pods and job), for summary.json; {} where it made none."""
        pods = {str(node): count for node, count in sorted(self.pod_restarts.items()) if count}
        if not pods and not self.job_restarts:
            return {}
        return {"operator_restarts": {"pods": pods, "job": self.job_restarts}}

    def _follow(self, pod: dict[str, Any] | None) -> None:
        """Follow node 0's log into the run folder and this runner's lines (once)."""
        if self._follower is not None or pod is None or self.launch is None:
            return
        log = self.launch.run_dir / "logs" / "node-0.log"
        with deferred_signals():  # a signal between the fork and Popen's return would lose the follower
            self._follower = subprocess.Popen(
                [KUBECTL, "logs", "-f", "-n", self.namespace, pod["metadata"]["name"]],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
            )
        threading.Thread(target=self._read_log, args=(self._follower, log), daemon=True).start()

    def _read_log(self, process: subprocess.Popen[str], log: Path) -> None:
        assert process.stdout is not None
        with log.open("a") as out:
            for line in process.stdout:
                out.write(line)
                out.flush()
                with self._lock:
                    self._lines.append(f"node 0: {line.rstrip()}")

    def _save_logs(self, nodes: dict[int, dict[str, Any]]) -> None:
        """Each pod's log into the run folder, where the failure report points."""
        if self._logs_saved or self.launch is None:
            return
        self._logs_saved = True
        self._stop_follower()
        for node, pod in sorted(nodes.items()):
            result = run_command([KUBECTL, "logs", "-n", self.namespace, pod["metadata"]["name"]], timeout=60)
            (self.launch.run_dir / "logs" / f"node-{node}.log").write_text(result.stdout + result.stderr)

    def _stop_follower(self) -> None:
        if self._follower is not None and self._follower.poll() is None:
            self._follower.terminate()
            try:
                self._follower.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._follower.kill()
                self._follower.wait()

    def _say(self, line: str) -> None:
        with self._lock:
            self._lines.append(f"{self.name}: {line}")

    def stream(self) -> list[str]:
        """State changes, pod phases and node 0's log lines since the last call."""
        with self._lock:
            lines, self._lines = self._lines, []
        return lines

    def cancel(self, prompt: bool = False) -> None:
        """Delete the job and its ConfigMap; wait until its pods are gone.

        The pods' termination grace outlasts the save grace; `prompt` (no rank can save) deletes the
        pods themselves with 1 s of grace once the job is gone (a deleted job's pods keep their own).
        """
        self._stop_follower()
        if self.launch is None:
            return
        if self._last.state != ENDED:
            self._asked_at = float("-inf")
            pods = self._kubectl_json("get", "pods", "-l", f"{k8s.JOB_LABEL}={self.job_name}") or {"items": []}
            self._save_logs({node: pod for pod in pods.get("items", []) if (node := node_of(pod)) is not None})
        result = run_command(self.delete_command(), cwd=str(self.launch.project), timeout=CANCEL_WAIT_S)
        if result.returncode != 0:
            self._say(f"kubectl delete failed: {(result.stderr or result.stdout).strip()}")
            return
        self._say(f"deleted {self.resource}/{self.job_name} and its ConfigMap")
        if prompt:
            selector = f"{k8s.JOB_LABEL}={self.job_name}"
            pods = [KUBECTL, "delete", "pods", "-l", selector, "--grace-period=1", "--ignore-not-found", "--wait=false"]
            run_command(pods, cwd=str(self.launch.project), timeout=CANCEL_WAIT_S)
        deadline = time.monotonic() + CANCEL_WAIT_S
        while time.monotonic() < deadline:
            pods = self._kubectl_json("get", "pods", "-l", f"{k8s.JOB_LABEL}={self.job_name}")
            if pods is not None and not pods.get("items"):
                return
            time.sleep(1.0)
        self._say(f"pods of {self.job_name} still present {CANCEL_WAIT_S:.0f}s after kubectl delete")
