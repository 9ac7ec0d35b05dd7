"""The Kubernetes manifests: rendered from the answers, valid against their schemas, safe with any value.

Each rendered AscendJob and PyTorchJob is checked against its CRD's
openAPIV3Schema (jsonschema), its pod templates and the project ConfigMap
against Kubernetes' own schemas (kubernetes-validate), and the same check
refuses a deliberately broken manifest.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.factories import answers
from tests.kube_schemas import core_problems, load_all, problems
from wizard.answers.model import Answers
from wizard.errors import AnswersError
from wizard.render import k8s
from wizard.render.k8s_code import LAYOUT_KEY
from wizard.render.render import render

IMAGE = "swr.example.com/ascend/pytorch:2.9.0-cann9.1"


def k8s_answers(engine: str, **overrides: Any) -> Answers:
    """NPU answers for a Kubernetes engine: 2 nodes x 2 devices on an A2 cluster."""
    settings: dict[str, Any] = {
        "device": "npu",
        "hardware": "atlas-a2",
        "nodes": 2,
        "devices_per_node": 2,
        "amp": "bf16",
        "cluster__engine": engine,
        "cluster__image": IMAGE,
    }
    settings.update(overrides)
    return answers(**settings)


def rendered(tmp_path: Path, engine: str, **overrides: Any) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """Render the project; return it, its job manifest and its ConfigMap as loaded from the files."""
    project = render(k8s_answers(engine, **overrides), tmp_path).project_dir
    (job,) = load_all(project / k8s.manifest_file(engine))
    (configmap,) = load_all(project / k8s.CONFIGMAP_FILE)
    return project, job, configmap


def replicas(job: dict[str, Any]) -> dict[str, Any]:
    """The replica specs of either kind."""
    spec = job["spec"]
    return spec.get("replicaSpecs") or spec["pytorchReplicaSpecs"]


def container(job: dict[str, Any], role: str = "Master") -> dict[str, Any]:
    """The one container of a role's pod."""
    (only,) = replicas(job)[role]["template"]["spec"]["containers"]
    return only


CASES = [
    ("ascendjob", {}),
    ("pytorchjob", {}),
    ("ascendjob", {"nodes": 1, "devices_per_node": 8}),
    ("pytorchjob", {"nodes": 4, "devices_per_node": 8, "cluster__data_pvc": "imagenet"}),
    ("ascendjob", {"hardware": "atlas-a3", "nodes": 3, "devices_per_node": 16, "cluster__data_host_path": "/data"}),
    ("ascendjob", {"device": "cpu", "amp": "off", "cluster__node_selector": {"host-arch": "huawei-arm"}}),
    ("pytorchjob", {"training__dataset": "mnist", "training__data_dir": "/mnt/mnist", "cluster__namespace": "ml"}),
]


@pytest.mark.parametrize(("engine", "overrides"), CASES, ids=[f"{e}-{i}" for i, (e, _) in enumerate(CASES)])
def test_every_rendered_manifest_validates(tmp_path: Path, engine: str, overrides: dict[str, Any]) -> None:
    _project, job, configmap = rendered(tmp_path, engine, **overrides)
    assert job["kind"] == {"ascendjob": "AscendJob", "pytorchjob": "PyTorchJob"}[engine]
    assert problems(job) == []
    assert problems(configmap) == []


BROKEN = [
    ("a misspelt field the server would drop", lambda job: job["spec"].update(sucessPolicy="AllWorkers")),
    ("replicas as text", lambda job: replicas(job)["Master"].update(replicas="one")),
    ("a container without a name", lambda job: container(job).pop("name")),
    (
        "an NPU count that is not a quantity",
        lambda job: container(job)["resources"]["limits"].update({k8s.NPU_RESOURCE: "eight"}),
    ),
    ("a port number as text", lambda job: container(job)["ports"][0].update(containerPort="2222")),
    ("a volume mount without a path", lambda job: container(job)["volumeMounts"][0].pop("mountPath")),
    ("a misspelt pod field", lambda job: replicas(job)["Master"]["template"]["spec"].update(nodeSelectr={})),
]


@pytest.mark.parametrize("engine", ["ascendjob", "pytorchjob"])
@pytest.mark.parametrize(("what", "breaks"), BROKEN, ids=[what for what, _ in BROKEN])
def test_a_broken_manifest_fails_the_same_check(tmp_path: Path, engine: str, what: str, breaks: Any) -> None:
    _project, job, _configmap = rendered(tmp_path, engine)
    broken = copy.deepcopy(job)
    breaks(broken)
    assert problems(broken), f"{what} passed the check"


def test_a_broken_configmap_fails_kubernetes_validate(tmp_path: Path) -> None:
    _project, _job, configmap = rendered(tmp_path, "pytorchjob")
    configmap["data"]["train.py"] = 42
    assert core_problems(configmap)
    configmap["data"]["train.py"] = "print()"
    configmap["metadata"]["lables"] = {}
    assert core_problems(configmap)


def test_ascendjob_follows_mindcluster_rules(tmp_path: Path) -> None:
    _project, job, _configmap = rendered(tmp_path, "ascendjob", nodes=3, devices_per_node=8)
    assert job["apiVersion"] == "mindxdl.gitee.com/v1"
    assert job["metadata"]["labels"]["framework"] == "pytorch"
    assert job["spec"]["schedulerName"] == "volcano"
    assert job["spec"]["runPolicy"]["schedulingPolicy"] == {"minAvailable": 3, "queue": "default"}
    assert job["spec"]["successPolicy"] == "AllWorkers"
    assert {role: spec["replicas"] for role, spec in replicas(job).items()} == {"Master": 1, "Worker": 2}
    for role in ("Master", "Worker"):
        box = container(job, role)
        assert box["name"] == "ascend"
        assert box["ports"] == [{"name": "ascendjob-port", "containerPort": 2222}]
        assert box["resources"] == {"requests": {k8s.NPU_RESOURCE: 8}, "limits": {k8s.NPU_RESOURCE: 8}}


def test_pytorchjob_sets_processes_per_node_explicitly(tmp_path: Path) -> None:
    _project, job, _configmap = rendered(tmp_path, "pytorchjob", nodes=4, devices_per_node=8)
    assert job["apiVersion"] == "kubeflow.org/v1"
    assert job["spec"]["nprocPerNode"] == "8"
    assert {role: spec["replicas"] for role, spec in replicas(job).items()} == {"Master": 1, "Worker": 3}
    assert container(job)["name"] == "pytorch"
    assert container(job)["resources"]["limits"] == {k8s.NPU_RESOURCE: 8}


@pytest.mark.parametrize("engine", ["ascendjob", "pytorchjob"])
def test_one_node_is_a_master_alone(tmp_path: Path, engine: str) -> None:
    _project, job, _configmap = rendered(tmp_path, engine, nodes=1)
    assert list(replicas(job)) == ["Master"]


@pytest.mark.parametrize("engine", ["ascendjob", "pytorchjob"])
def test_pods_outwait_the_save_grace_of_their_launch_script(tmp_path: Path, engine: str) -> None:
    # A pod's SIGTERM makes its ranks save; the kubelet's own SIGKILL must not come before run-node.sh's.
    project, job, _configmap = rendered(tmp_path, engine)
    save_grace = re.search(
        r'SAVE_GRACE="\$\{NPU_WIZARD_SAVE_GRACE:-(\d+)\}"', (project / "launch/run-node.sh").read_text()
    )
    assert save_grace, "run-node.sh's default save grace"
    for replica in replicas(job).values():
        assert replica["template"]["spec"]["terminationGracePeriodSeconds"] > int(save_grace[1])


@pytest.mark.parametrize("engine", ["ascendjob", "pytorchjob"])
def test_pods_get_shared_memory_and_the_driver_read_only(tmp_path: Path, engine: str) -> None:
    _project, job, _configmap = rendered(tmp_path, engine)
    spec = replicas(job)["Master"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m for m in container(job)["volumeMounts"]}
    assert volumes["dshm"] == {"name": "dshm", "emptyDir": {"medium": "Memory"}}
    assert mounts["dshm"]["mountPath"] == "/dev/shm"
    assert volumes["ascend-driver"]["hostPath"]["path"] == "/usr/local/Ascend/driver"
    assert mounts["ascend-driver"] == {
        "name": "ascend-driver",
        "mountPath": "/usr/local/Ascend/driver",
        "readOnly": True,
    }


def test_a_cpu_job_asks_for_no_npu(tmp_path: Path) -> None:
    _project, job, _configmap = rendered(tmp_path, "pytorchjob", device="cpu", amp="off")
    assert "resources" not in container(job)
    assert "ascend-driver" not in {m["name"] for m in container(job)["volumeMounts"]}


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"cluster__data_host_path": "/srv/imagenet"}, {"hostPath": {"path": "/srv/imagenet", "type": "Directory"}}),
        ({"cluster__data_pvc": "imagenet"}, {"persistentVolumeClaim": {"claimName": "imagenet", "readOnly": True}}),
    ],
)
def test_data_comes_from_a_host_path_or_a_claim(tmp_path: Path, overrides: dict[str, Any], expected: Any) -> None:
    _project, job, _configmap = rendered(
        tmp_path, "ascendjob", training__dataset="imagefolder", training__data_dir="imgs", **overrides
    )
    volumes = {v["name"]: v for v in replicas(job)["Worker"]["template"]["spec"]["volumes"]}
    mounts = {m["name"]: m for m in container(job, "Worker")["volumeMounts"]}
    assert {k: v for k, v in volumes["data"].items() if k != "name"} == expected
    assert mounts["data"] == {"name": "data", "mountPath": "/workspace/demo/imgs", "readOnly": True}


def test_the_configmap_carries_the_project_to_its_paths(tmp_path: Path) -> None:
    project, job, configmap = rendered(tmp_path, "pytorchjob")
    volume = {v["name"]: v for v in replicas(job)["Master"]["template"]["spec"]["volumes"]}["project"]["configMap"]
    assert volume == {"name": configmap["metadata"]["name"]} and volume["name"] == "demo-project"  # every key
    layout = dict(line.split(" ", 1) for line in configmap["data"][LAYOUT_KEY].splitlines())
    assert {"train.py", "runtime/distributed.py", "answers.yaml"} <= set(layout.values())
    assert set(layout) == set(configmap["data"]) - {LAYOUT_KEY}
    for key, path in layout.items():
        assert configmap["data"][key] == (project / path).read_text()


def test_the_configmap_carries_any_file_text_exactly(tmp_path: Path) -> None:
    project, _job, _configmap = rendered(tmp_path, "ascendjob")
    awkward = "x = 1   \n\ty = '|'\n---\n... \u00e9\u4e2d\r\n# trailing\t\n\n"
    (project / "helpers.py").write_text(awkward, newline="")
    k8s.refresh_configmap(project, k8s_answers("ascendjob"))
    (configmap,) = load_all(project / k8s.CONFIGMAP_FILE)
    assert configmap["data"]["helpers.py"] == awkward
    assert configmap["data"]["train.py"] == (project / "train.py").read_text()


def test_master_and_worker_are_written_out_in_full(tmp_path: Path) -> None:
    project, _job, _configmap = rendered(tmp_path, "pytorchjob")
    text = (project / k8s.manifest_file("pytorchjob")).read_text()
    assert "&id" not in text and "*id" not in text
    assert text.count("image: " + IMAGE) == 2


def test_user_values_cannot_break_the_yaml(tmp_path: Path) -> None:
    # Label values that YAML would otherwise read as other types or as syntax.
    selector = {"example.com/zone": "on", "tier": "0755", "flag": "null", "k": "a-b_c.d"}
    _project, job, _configmap = rendered(tmp_path, "ascendjob", cluster__node_selector=selector)
    assert replicas(job)["Master"]["template"]["spec"]["nodeSelector"] == selector
    assert problems(job) == []


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"cluster__image": None}, "cluster.image"),
        ({"cluster__image": "img:latest\nkind: Secret"}, "cluster.image"),
        ({"cluster__image": "my image"}, "cluster.image"),
        ({"cluster__namespace": "Team_A"}, "cluster.namespace"),
        ({"cluster__queue": "q; rm -rf /"}, "cluster.queue"),
        ({"cluster__node_selector": {"zone": "a b"}}, "cluster.node_selector"),
        ({"cluster__node_selector": "zone"}, "cluster.node_selector"),
        ({"cluster__data_host_path": "data"}, "cluster.data_host_path"),
        ({"cluster__data_host_path": "/data", "cluster__data_pvc": "imagenet"}, "cluster.data_pvc"),
    ],
)
def test_bad_kubernetes_settings_are_refused_at_their_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(AnswersError) as refused:
        k8s_answers("ascendjob", **overrides)
    assert [p.field for p in refused.value.problems] == [field]


def test_node_selector_reads_a_mapping_or_pairs_and_round_trips(tmp_path: Path) -> None:
    from wizard.answers.model import dump, load_text

    as_text = k8s_answers("pytorchjob", cluster__node_selector="host-arch=huawei-arm, accelerator-type=module-910b-8")
    as_map = k8s_answers(
        "pytorchjob", cluster__node_selector={"host-arch": "huawei-arm", "accelerator-type": "module-910b-8"}
    )
    assert as_text["cluster.node_selector"] == as_map["cluster.node_selector"]
    document = yaml.safe_load(dump(as_text))
    assert document["cluster"]["node_selector"] == {"host-arch": "huawei-arm", "accelerator-type": "module-910b-8"}
    assert load_text(dump(as_text)).values == as_text.values


def test_the_job_name_is_a_kubernetes_name() -> None:
    assert k8s.job_name("my_project_") == "my-project"
    assert len(k8s.job_name("a" * 64)) <= 48


KUBERNETES_EXAMPLES = sorted(
    path
    for path in (Path(__file__).parent.parent / "examples").glob("*.yaml")
    if any(f"engine: {engine}" in path.read_text() for engine in k8s.ENGINES)
)


@pytest.mark.parametrize("example", KUBERNETES_EXAMPLES, ids=[p.stem for p in KUBERNETES_EXAMPLES])
def test_the_kubernetes_examples_validate(tmp_path: Path, example: Path) -> None:
    from wizard.answers.model import load_text

    answers = load_text(example.read_text())
    project = render(answers, tmp_path).project_dir
    for name in (k8s.manifest_file(answers["cluster.engine"]), k8s.CONFIGMAP_FILE):
        for document in load_all(project / name):
            assert problems(document) == [], name


def test_typed_kubernetes_answers_render_the_same_project_as_the_answers_file(tmp_path: Path) -> None:
    from tests.test_tui_flow import answers_file, render_with_answers_file
    from tests.tui_driver import answer_all, render_into, run_wizard, snapshot_of

    raw = {
        "project_name": "typed-k8s",
        "device": "cpu",
        "nodes": 2,
        "devices_per_node": 2,
        "amp": "off",
        "cluster.engine": "ascendjob",
        "cluster.image": IMAGE,
        "cluster.namespace": "ml",
        "cluster.node_selector": "host-arch=huawei-arm, zone=a",
        "cluster.data_pvc": "datasets",
    }

    async def scenario(pilot: Any) -> None:
        await answer_all(pilot, raw)
        await render_into(pilot, tmp_path / "tui")

    run_wizard(scenario)
    render_with_answers_file(answers_file(tmp_path, raw), tmp_path / "cli")
    typed = snapshot_of(tmp_path / "tui" / "typed-k8s")
    assert typed == snapshot_of(tmp_path / "cli" / "typed-k8s")
    (job,) = yaml.safe_load_all(typed["k8s/ascendjob.yaml"][0])
    assert replicas(job)["Master"]["template"]["spec"]["nodeSelector"] == {"host-arch": "huawei-arm", "zone": "a"}


def test_a_cpu_ascendjob_is_warned_about() -> None:
    warned = k8s_answers("ascendjob", device="cpu", amp="off").warnings
    assert [(w.field, w.value) for w in warned] == [("device", "cpu")]
    assert "use pytorchjob" in warned[0].message
    assert not k8s_answers("pytorchjob", device="cpu", amp="off").warnings


# values a ConfigMap may carry: keys, quotes, trailing or leading blanks, kept and stripped newlines, controls
AWKWARD_TEXTS = [
    "a: b", "'q'", '"dq"', "x\ny ", "trail \n", "tab\tin", "\u00e9t\u00e9", "line\n\n\nend\n\n", " lead\nx",
    "#c", "- x", "\x07bell", "\ufeffbom", "x" * 200, "a " * 100, "null", "1e3", "~", "\r\nwin\r\n", "\u2028ls",
    "emoji \U0001f600\nx", "end\\", "k: v\n- l\n", "\n", "", "0o17", "yes", "...", "x\n...\n", "---",
]  # fmt: skip
# files no literal block holds, in lines long enough to be wrapped: each emitter wraps them its own way
QUOTED_FILES = [
    "# \u8bad\u7ec3\u811a\u672c\nprint('a fairly long line of python code that goes past the eighty column limit')\n",
    "import os\r\nprint('hello world, this is a fairly long line of python code here, and more')\r\nx = 1\r\n",
    "caf\u00e9 " * 30,
]


@pytest.mark.skipif(not hasattr(yaml, "CSafeDumper"), reason="PyYAML was built without libyaml")
def test_libyaml_and_pyyaml_write_the_same_manifests(tmp_path: Path) -> None:
    # renders use libyaml's emitter where PyYAML has it and PyYAML's own elsewhere: the same project either way
    plain = k8s.literal_dumper(yaml.SafeDumper)
    fast = k8s.literal_dumper(yaml.CSafeDumper)
    project, job, configmap = rendered(tmp_path, "ascendjob")
    same_text = [job, configmap]
    for text in AWKWARD_TEXTS:
        same_text += [{"k": text}, {"k": text, "z": 1}, {"z": 1, "k": text}]
    for document in same_text:
        written = k8s.dump(document, "# header\n", fast)
        assert written == k8s.dump(document, "# header\n", plain)
        assert yaml.safe_load(written) == document
    for text in QUOTED_FILES:  # the same values, in text each emitter wraps differently
        document = {"data": {"train.py": text, "": "an empty key"}}
        for dumper in (fast, plain):
            assert yaml.safe_load(k8s.dump(document, "# header\n", dumper)) == document
    assert (project / k8s.CONFIGMAP_FILE).read_text().endswith(k8s.dump(configmap, "", fast))
