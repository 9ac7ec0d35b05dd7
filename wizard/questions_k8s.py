"""The questions of the Kubernetes engines (ascendjob, pytorchjob), asked after the engine."""

from __future__ import annotations

from wizard.spec import Question, Values

KUBERNETES_ENGINES = ("ascendjob", "pytorchjob")


def on_kubernetes(values: Values) -> bool:
    """Whether the engine is one of the Kubernetes operators."""
    return values.get("cluster.engine") in KUBERNETES_ENGINES


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
