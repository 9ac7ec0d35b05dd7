"""Play a pod of a rendered Kubernetes job on this host, as the kubelet and its container would run it.

No cluster runs here. The pod's project volume (the whole ConfigMap, no items)
is laid out as the kubelet lays out a configMap volume, a file per key; the pod
gets a writable workspace; its command is the container's command from the
manifest, with the pod's paths replaced by these folders. The caller runs it
with the environment the operator would give the pod.
"""

from __future__ import annotations

from pathlib import Path

from tests.kube_schemas import load_all
from wizard.render import k8s


def pod_command(project: Path, engine: str, node: int, root: Path) -> list[str]:
    """Set pod `node` up under `root` (source/, workspace/) as the kubelet would; the container's command."""
    (job,) = load_all(project / k8s.manifest_file(engine))
    (configmap,) = load_all(project / k8s.CONFIGMAP_FILE)
    role = "Master" if node == 0 else "Worker"
    replica = (job["spec"].get("replicaSpecs") or job["spec"]["pytorchReplicaSpecs"])[role]
    spec = replica["template"]["spec"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == "project"]
    assert "items" not in volume["configMap"], "the whole ConfigMap is mounted: the pod's command lays it out"
    source, workspace = root / "source", root / "workspace"
    source.mkdir(parents=True)
    workspace.mkdir()
    for key, text in configmap["data"].items():
        (source / key).write_text(text)
    shell, flag, script = spec["containers"][0]["command"]
    return [shell, flag, script.replace(k8s.SOURCE_DIR, str(source)).replace(k8s.WORKSPACE, str(workspace))]


def pod_project(project: Path, root: Path) -> Path:
    """Where the pod set up under `root` keeps its writable copy of `project`."""
    return root / "workspace" / project.name
