"""Kubernetes manifests for the `ascendjob` and `pytorchjob` engines, built as data and dumped as YAML.

Every user value goes into a Python structure that PyYAML writes out, so no
answer can break the YAML; the one shell line inside (the container command)
quotes its values with shlex. The project's code reaches the pods as a
ConfigMap (read-only; wizard.render.k8s_code says which files), which each
pod copies into a writable workspace, every file at its own path, before it
runs `launch/entry.sh`.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from wizard.answers.model import Answers
from wizard.answers.questions_cluster import OPERATOR_MASTER_PORTS
from wizard.answers.questions_k8s import DRIVER_DIR, SOURCE_DIR, WORKSPACE, data_mount_point, pod_project_path
from wizard.render.k8s_code import (
    check_fits,
    configmap_data,
    folder_files,
    pods_data_folder,
    project_files,
    restore_command,
)
from wizard.render.repository import repository_folder, repository_root

ENGINES = ("ascendjob", "pytorchjob")
NPU_RESOURCE = "huawei.com/Ascend910"
JOB_LABEL = "npu-wizard/job"
POD_IP_ENV = "NPU_WIZARD_POD_IP"
CONFIGMAP_FILE = "k8s/project.yaml"
# The ascend-operator reads the master port from the container port of this name (default 2222);
# the training operator's default port name and number for PyTorchJob.
ASCENDJOB_PORT = ("ascendjob-port", OPERATOR_MASTER_PORTS["ascendjob"])
PYTORCHJOB_PORT = ("pytorchjob-port", OPERATOR_MASTER_PORTS["pytorchjob"])
# The card type label the Ascend Volcano plug-in schedules by. A3 under ascend-910b is not confirmed on a cluster.
# A pod's SIGTERM (an eviction, a delete) makes its ranks save at their next logged step: launch/run-node.sh
# gives them NPU_WIZARD_SAVE_GRACE (60 s) before it kills them, so the kubelet must wait longer than that
# before its own SIGKILL (its default is 30 s).
TERMINATION_GRACE_S = 90
RING_CONTROLLER = {"atlas-training": "ascend-910", "atlas-a2": "ascend-910b", "atlas-a3": "ascend-910b"}


def manifest_file(engine: str) -> str:
    """The project-relative path of the job manifest of a Kubernetes engine."""
    return f"k8s/{engine}.yaml"


def job_name(project_name: str) -> str:
    """The job's Kubernetes name: the project name as a DNS label, short enough for the pods' names."""
    name = project_name.replace("_", "-")[:48]
    return name.rstrip("-")


def project_path(answers: Answers) -> str:
    """Where the project's writable copy lives inside a pod."""
    return pod_project_path(answers["project_name"])


def data_mount_path(answers: Answers) -> str:
    """Where the data volume is mounted: the project's data folder, as train.py looks for it."""
    return data_mount_point(answers["project_name"], answers.get("training.data_dir"))


def job_manifest(answers: Answers, folder: str = "") -> dict[str, Any]:
    """The AscendJob or PyTorchJob of the answers' engine, as a mapping ready to dump; `folder`: the project's
    folder inside its repository, which the pods' copy holds whole (the entry script starts there)."""
    engine = answers["cluster.engine"]
    if engine == "ascendjob":
        manifest = _ascendjob(answers)
    elif engine == "pytorchjob":
        manifest = _pytorchjob(answers)
    else:
        raise ValueError(f"not a Kubernetes engine: {engine}")
    for replica in _replica_specs(manifest).values():
        replica["template"]["spec"]["containers"][0]["command"] = container_command(answers, folder)
    return manifest


def restarts(answers: Answers) -> int:
    """How often the operator may start the job again after a failure (run.restarts; 0 where not answered)."""
    return int(answers.get("run.restarts") or 0)


def _ascendjob(answers: Answers) -> dict[str, Any]:
    name = job_name(answers["project_name"])
    labels = {"framework": "pytorch", "ring-controller.atlas": RING_CONTROLLER[answers["hardware"]], JOB_LABEL: name}
    retries = restarts(answers)
    if retries:
        # MindCluster's job-level rescheduling: Volcano and the ascend-operator stop every pod of the job and
        # start them again (off a faulty node), at most fault-retry-times times for a failure of the training
        # itself; backoffLimit bounds the job's restarts as the operator counts them.
        labels |= {"fault-scheduling": "force", "fault-retry-times": str(retries)}
    run_policy: dict[str, Any] = {
        "schedulingPolicy": {"minAvailable": answers["nodes"], "queue": answers["cluster.queue"]}
    }
    if retries:
        run_policy["backoffLimit"] = retries
    env: list[dict[str, Any]] = [_field_env("XDL_IP", "status.hostIP")]
    if _uses_npus(answers):
        # ascend-docker-runtime mounts the cards Volcano picked, which it names in this annotation.
        env.append(_field_env("ASCEND_VISIBLE_DEVICES", f"metadata.annotations['{NPU_RESOURCE}']"))
    template = _pod_template(answers, "ascend", ASCENDJOB_PORT, labels, env)
    return {
        "apiVersion": "mindxdl.gitee.com/v1",
        "kind": "AscendJob",
        "metadata": _metadata(answers, labels),
        "spec": {
            "schedulerName": "volcano",
            "runPolicy": run_policy,
            "successPolicy": "AllWorkers",
            "replicaSpecs": _replicas(answers["nodes"], template, "Never"),
        },
    }


def _pytorchjob(answers: Answers) -> dict[str, Any]:
    name = job_name(answers["project_name"])
    labels = {JOB_LABEL: name}
    template = _pod_template(answers, "pytorch", PYTORCHJOB_PORT, labels, [])
    retries = restarts(answers)
    spec: dict[str, Any] = {
        # Explicit: the operator's "auto" counts only GPUs, never NPUs.
        "nprocPerNode": str(answers["devices_per_node"]),
        # OnFailure: the failed pod's container starts again in place (restartCount), its launcher
        # rejoining the others, until the job has failed backoffLimit times.
        "pytorchReplicaSpecs": _replicas(answers["nodes"], template, "OnFailure" if retries else "Never"),
    }
    if retries:
        spec["runPolicy"] = {"backoffLimit": retries}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": _metadata(answers, labels),
        "spec": spec,
    }


def _metadata(answers: Answers, labels: Mapping[str, str]) -> dict[str, Any]:
    return {
        "name": job_name(answers["project_name"]),
        "namespace": answers["cluster.namespace"],
        "labels": dict(labels),
    }


def _replicas(nodes: int, template: dict[str, Any], restart_policy: str) -> dict[str, Any]:
    """One Master pod, and a Worker pod for every other node."""
    replicas = {"Master": {"replicas": 1, "restartPolicy": restart_policy, "template": template}}
    if nodes > 1:
        replicas["Worker"] = {"replicas": nodes - 1, "restartPolicy": restart_policy, "template": template}
    return replicas


def _uses_npus(answers: Answers) -> bool:
    return answers["device"] != "cpu"


def _field_env(name: str, field_path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}


def container_command(answers: Answers, folder: str = "") -> list[str]:
    """The container's command: copy the project (the repository around its `folder`) out of the ConfigMap, each
    file to its path, then run the entry script in the project's folder."""
    workdir = project_path(answers)
    start = posixpath.join(workdir, folder) if folder else workdir
    script = f"set -e; {restore_command(SOURCE_DIR, workdir)}; cd {shlex.quote(start)}; exec bash launch/entry.sh"
    return ["/bin/bash", "-c", script]


def _pod_template(
    answers: Answers,
    container: str,
    port: tuple[str, int],
    labels: Mapping[str, str],
    env: list[dict[str, Any]],
) -> dict[str, Any]:
    name = job_name(answers["project_name"])
    mounts: list[dict[str, Any]] = [
        {"name": "project", "mountPath": SOURCE_DIR, "readOnly": True},
        {"name": "workspace", "mountPath": WORKSPACE},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    volumes: list[dict[str, Any]] = [
        {"name": "project", "configMap": {"name": configmap_name(answers)}},
        {"name": "workspace", "emptyDir": {}},
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    ]
    container_spec: dict[str, Any] = {
        "name": container,
        "image": answers["cluster.image"],
        "imagePullPolicy": "IfNotPresent",
        "command": container_command(answers),
        # The pod's own address: HCCL_IF_IP, and where node 0 listens (entry.sh).
        "env": [_field_env(POD_IP_ENV, "status.podIP"), *env],
        "ports": [{"name": port[0], "containerPort": port[1]}],
        "volumeMounts": mounts,
    }
    spec: dict[str, Any] = {
        "containers": [container_spec],
        "volumes": volumes,
        "terminationGracePeriodSeconds": TERMINATION_GRACE_S,
    }
    if _uses_npus(answers):
        count = answers["devices_per_node"]
        container_spec["resources"] = {"requests": {NPU_RESOURCE: count}, "limits": {NPU_RESOURCE: count}}
        mounts.append({"name": "ascend-driver", "mountPath": DRIVER_DIR, "readOnly": True})
        volumes.append({"name": "ascend-driver", "hostPath": {"path": DRIVER_DIR, "type": "Directory"}})
        # One pod per server: each pod is one node of the job.
        spec["affinity"] = {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "labelSelector": {"matchLabels": {JOB_LABEL: name}},
                        "topologyKey": "kubernetes.io/hostname",
                    }
                ]
            }
        }
    data = _data_volume(answers)
    if data is not None:
        mounts.append({"name": "data", "mountPath": data_mount_path(answers), "readOnly": True})
        volumes.append({"name": "data", **data})
    selector = answers.get("cluster.node_selector")
    if selector:
        spec["nodeSelector"] = dict(selector)
    return {"metadata": {"labels": dict(labels)}, "spec": spec}


def _data_volume(answers: Answers) -> dict[str, Any] | None:
    host_path = answers.get("cluster.data_host_path")
    if host_path:
        return {"hostPath": {"path": host_path, "type": "Directory"}}
    claim = answers.get("cluster.data_pvc")
    if claim:
        return {"persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
    return None


def configmap_name(answers: Answers) -> str:
    """The name of the ConfigMap that carries the project's files."""
    return f"{job_name(answers['project_name'])}-project"


def configmap(answers: Answers, project: Path, folder: str = "") -> dict[str, Any]:
    """The ConfigMap with the project's code as it is now (k8s_code.ConfigMapError when it cannot carry it): for a
    project in a folder of a repository, the repository's code too, every path from the repository's root.
    `folder`: that folder, for a render not yet in its place (its own files only, each under the folder)."""
    if folder:
        data = configmap_data(project, project_files(project), prefix=folder + "/")
    else:
        data = configmap_data(repository_root(project), carried_files(project, answers))
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": configmap_name(answers),
            "namespace": answers["cluster.namespace"],
            "labels": {JOB_LABEL: job_name(answers["project_name"])},
        },
        "data": data,
    }


def carried_files(project: Path, answers: Answers) -> list[str]:
    """The project's files the ConfigMap carries to the pods (wizard.render.k8s_code says which), relative to the
    project, or to its repository's root for a project in a folder of one."""
    script = answers["training.script"]
    data_folder = pods_data_folder(script, answers.get("training.data_dir"), _data_volume(answers) is not None)
    folder = repository_folder(project)
    if folder:
        return folder_files(repository_root(project), folder, script, data_folder)
    return project_files(project, script, data_folder)


def check_repository_fits(repository: Path, folder: str, answers: Answers, texts: Mapping[str, str]) -> None:
    """ConfigMapTooLarge, before anything is written, when the repository's code and the project's files about to
    be written into its `folder` (`texts`) are over what one ConfigMap carries to the pods."""
    script = answers["training.script"]
    data_folder = pods_data_folder(script, answers.get("training.data_dir"), _data_volume(answers) is not None)
    names = [
        name for name in folder_files(repository, folder, script, data_folder) if not name.startswith(folder + "/")
    ]
    carried = {name for name in texts if name.endswith((".py", ".sh")) or name in ("answers.yaml", "requirements.txt")}
    check_fits(repository, names, {f"{folder}/{name}": texts[name] for name in sorted(carried)})


def listed_files(manifest: Mapping[str, Any]) -> list[str]:
    """The project files the project volume of a job manifest rendered by an earlier npu-wizard mounts (the paths
    of its items; none since the whole ConfigMap is mounted)."""
    listed: list[str] = []
    for replica in _replica_specs(manifest).values():
        for volume in replica["template"]["spec"].get("volumes", []):
            if volume.get("name") == "project":
                listed += [item["path"] for item in volume.get("configMap", {}).get("items", [])]
    return sorted(set(listed))


def load_manifest(path: Path) -> dict[str, Any]:
    """The one document of a job manifest file."""
    return yaml.safe_load(path.read_text())


def _replica_specs(manifest: Mapping[str, Any]) -> dict[str, Any]:
    spec = manifest["spec"]
    return spec["replicaSpecs"] if "replicaSpecs" in spec else spec["pytorchReplicaSpecs"]


_HEADER = "# {what}: written by npu-wizard from answers.yaml. {how}\n"


def dump(document: Mapping[str, Any], header: str, dumper: type[yaml.SafeDumper] | None = None) -> str:
    """YAML text of a manifest, with a comment line first; multi-line strings as literal blocks."""
    text = yaml.dump(dict(document), Dumper=dumper or _DUMPER, sort_keys=False, default_flow_style=False)
    # libyaml ends the document with `...` once any block kept its trailing newlines (`|+`), PyYAML's own
    # emitter only when the last one did; the marker is optional at the end of a stream, so neither writes it
    return header + (text[: -len("...\n")] if text.endswith("\n...\n") else text)


def literal_dumper(base: type[yaml.SafeDumper]) -> type[yaml.SafeDumper]:
    """Safe YAML from `base` with file contents as readable literal blocks, and no anchors: each replica spelt
    out (Master and Worker share a template object but read as two)."""

    class Dumper(base):  # type: ignore[valid-type,misc]
        def ignore_aliases(self, data: Any) -> bool:
            return True

    Dumper.add_representer(str, _represent_str)
    return Dumper


def _represent_str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    # PyYAML's emitter falls back to a quoted scalar where a literal block cannot hold the text exactly.
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


# libyaml's emitter, where PyYAML was built with it (its wheels are), writes about 20 times faster: a ConfigMap
# carries the whole project, and writing it took most of a Kubernetes project's render. Both write the same
# values, and the same text for the literal blocks a project's files are; they wrap a long quoted string
# differently (a file with a non-ASCII character or a carriage return cannot be a literal block).
_DUMPER = literal_dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper))


def write_manifests(project: Path, answers: Answers, folder: str = "") -> list[str]:
    """Write the job manifest and the project ConfigMap into `project/k8s`; return their paths. `folder`: the
    project's folder inside its repository (the ConfigMap then carries the project's own files under it, until
    `npu-wizard run` writes it again with the repository's code)."""
    engine = answers["cluster.engine"]
    (project / "k8s").mkdir(exist_ok=True)
    job = job_manifest(answers, folder)
    job_file = manifest_file(engine)
    (project / job_file).write_text(
        dump(job, _HEADER.format(what=job["kind"], how="Apply with the ConfigMap: kubectl apply --server-side -f k8s/"))
    )
    refresh_configmap(project, answers, folder)
    return [job_file, CONFIGMAP_FILE]


def refresh_configmap(project: Path, answers: Answers, folder: str = "") -> str:
    """Write k8s/project.yaml from the project's files as they are now; return its text."""
    text = dump(
        configmap(answers, project, folder),
        _HEADER.format(what="ConfigMap", how="npu-wizard run writes it again from the project's current files."),
    )
    (project / CONFIGMAP_FILE).write_text(text)
    return text
