"""The questions of the Kubernetes engines (ascendjob, pytorchjob), asked after the engine."""

from __future__ import annotations

import posixpath

from wizard.answers.spec import Question, Values

KUBERNETES_ENGINES = ("ascendjob", "pytorchjob")
DRIVER_DIR = "/usr/local/Ascend/driver"
SOURCE_DIR = "/opt/npu-wizard/project"
WORKSPACE = "/workspace"
# Folders of the image a data volume must never cover: the system's, and where npu-wizard mounts the project.
SYSTEM_DIRS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run", "/sbin", "/sys")
SYSTEM_DIRS += ("/usr", "/var", SOURCE_DIR)


def on_kubernetes(values: Values) -> bool:
    """Whether the engine is one of the Kubernetes operators."""
    return values.get("cluster.engine") in KUBERNETES_ENGINES


def pod_project_path(project_name: str) -> str:
    """Where the project's writable copy lives inside a pod."""
    return posixpath.join(WORKSPACE, project_name)


def data_mount_point(project_name: str, data_dir: str | None) -> str:
    """Where the data volume is mounted in a pod: the project's data folder, as train.py looks for it."""
    return posixpath.normpath(posixpath.join(pod_project_path(project_name), data_dir or "data"))


def mount_point_problem(project_name: str, data_dir: str | None) -> str | None:
    """Why the data volume cannot be mounted at the data folder's place in a pod, or None when it can."""
    point = data_mount_point(project_name, data_dir)
    project = pod_project_path(project_name)
    if point == "/":
        return "/, the root of the pod"
    if point == project:
        return f"{point}, the project's own folder in the pod"
    if project.startswith(point + "/"):
        return f"{point}, which holds the project's folder in the pod"
    for system in SYSTEM_DIRS:
        if point == system or point.startswith(system + "/"):
            return f"{point}, {'' if point == system else 'inside '}a system folder of the image"
        if system.startswith(point + "/"):
            return f"{point}, which holds {system}"
    return None


KUBERNETES_QUESTIONS: tuple[Question, ...] = (
    Question(
        name="cluster.image",
        prompt="Container image",
        kind="image",
        optional=True,
        when=on_kubernetes,
        step="cluster",
        help="The training image every pod runs: CANN, torch and torch_npu at the versions in requirements.txt "
        "(the project itself comes in as a ConfigMap).",
    ),
    Question(
        name="cluster.namespace",
        prompt="Namespace",
        kind="k8s_name",
        default="default",
        when=on_kubernetes,
        step="cluster",
        help="The Kubernetes namespace of the job and its ConfigMap.",
    ),
    Question(
        name="cluster.queue",
        prompt="Volcano queue",
        kind="k8s_name",
        default="default",
        when=lambda values: values.get("cluster.engine") == "ascendjob",
        step="cluster",
        help="The Volcano queue the AscendJob is gang-scheduled in (all its pods start together or none does).",
    ),
    Question(
        name="cluster.node_selector",
        prompt="Node selector (optional)",
        kind="labels",
        optional=True,
        when=on_kubernetes,
        step="cluster",
        help="Node labels the pods must land on, e.g. accelerator-type=module-910b-8, host-arch=huawei-arm.",
    ),
    Question(
        name="cluster.data_host_path",
        prompt="Data on each node (hostPath, optional)",
        kind="path",
        optional=True,
        when=on_kubernetes,
        step="cluster",
        help="A folder present on every node that holds the dataset; mounted read-only at the project's data folder.",
    ),
    Question(
        name="cluster.data_pvc",
        prompt="Data volume claim (optional)",
        kind="k8s_name",
        optional=True,
        when=on_kubernetes,
        step="cluster",
        help="An existing PersistentVolumeClaim that holds the dataset; mounted read-only at the project's data "
        "folder. Give this or a hostPath, not both.",
    ),
)
