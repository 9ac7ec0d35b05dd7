"""A Kubernetes engine for a project that is one folder of a repository (`--into REPO`, its folder npu/).

The pods get the repository's code around the folder through the one ConfigMap: every Python file its ranks can
import from the repository's root (the script's folder tree, the top-level modules and packages, as for any
project) and the project's own files under npu/, each path from the repository's root. Each pod copies them into
its workspace, starts the entry script in npu/, and the ranks start from the copy's root, as in the manual engine.
Over one ConfigMap's 1 MiB the render is refused, naming the limit and the ways out, with nothing written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kube_schemas import load_all, problems
from tests.test_one_folder import STEPS, answers_file, foreign_repository, git, npu_wizard
from wizard.answers.model import load_text
from wizard.render import k8s
from wizard.render.k8s_code import LAYOUT_KEY


def k8s_answers(tmp_path: Path, engine: str, devices: int = 2, launcher: str = "torchrun") -> Path:
    """The foreign repository's answers (its train.py, --resume on a restart) for 2 pods x `devices` ranks of
    `engine`."""
    answers: dict[str, Any] = yaml.safe_load(answers_file(tmp_path, launcher).read_text())
    answers.update(
        nodes=2, devices_per_node=devices, cluster={"engine": engine, "image": "registry.example.com/train:cpu"}
    )
    answers["network"].pop("host_ips")
    path = tmp_path / f"{engine}.yaml"
    path.write_text(yaml.safe_dump(answers))
    return path


def render_k8s(tmp_path: Path, engine: str, devices: int = 2, launcher: str = "torchrun") -> Path:
    """The foreign repository rendered --into (npu/) with `engine`; the repository."""
    repo = foreign_repository(tmp_path)
    result = npu_wizard("--answers", str(k8s_answers(tmp_path, engine, devices, launcher)), "--into", str(repo))
    assert result.returncode == 0, result.stdout + result.stderr
    return repo


def layout(configmap: dict[str, Any]) -> dict[str, str]:
    """The ConfigMap's files: path -> key."""
    return {path: key for key, path in (line.split(" ", 1) for line in configmap["data"][LAYOUT_KEY].splitlines())}


def refreshed(project: Path) -> dict[str, Any]:
    """k8s/project.yaml written again from the repository's files, as `npu-wizard run` does before it applies."""
    answers = load_text((project / "answers.yaml").read_text(), project)
    k8s.refresh_configmap(project, answers)
    (configmap,) = load_all(project / k8s.CONFIGMAP_FILE)
    return configmap


@pytest.mark.parametrize("engine", ["ascendjob", "pytorchjob"])
def test_the_manifests_validate_and_the_configmap_carries_the_repository_around_the_folder(
    tmp_path: Path, engine: str
) -> None:
    repo = render_k8s(tmp_path, engine)
    project = repo / "npu"
    assert git(repo, "status", "--porcelain") == "?? npu/\n"
    (job,) = load_all(project / k8s.manifest_file(engine))
    assert problems(job) == []
    command = (job["spec"].get("replicaSpecs") or job["spec"]["pytorchReplicaSpecs"])["Master"]["template"]["spec"]
    script = command["containers"][0]["command"][2]
    assert f"cd {k8s.WORKSPACE}/their-gpt/npu; exec bash launch/entry.sh" in script

    (project / "runs" / "old").mkdir(parents=True)  # a run's files are never code
    (project / "runs" / "old" / "x.py").write_text("")
    configmap = refreshed(project)

    assert problems(configmap) == []
    files = layout(configmap)
    assert {"train.py", "runtime/__init__.py"} <= set(files)  # the repository's script and its own package
    assert {"npu/runtime/start_userscript.py", "npu/launch/run-node.sh", "npu/answers.yaml"} <= set(files)
    assert not any(name.startswith(("npu/runs/", "npu/k8s/", ".git/")) for name in files)
    assert configmap["data"][files["runtime/__init__.py"]] == 'OWNER = "the repository"\n'


def test_the_dry_run_lists_the_repository_files_the_configmap_carries(tmp_path: Path) -> None:
    repo = render_k8s(tmp_path, "pytorchjob")

    shown = npu_wizard("run", str(repo / "npu"), "--dry-run")

    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "#   train.py: " in shown.stdout and "#   runtime.__init__.py: " in shown.stdout
    assert "#   npu.launch.run-node.sh: " in shown.stdout


def test_a_repository_too_big_for_a_configmap_is_refused_at_render_naming_the_limit_and_the_ways_out(
    tmp_path: Path,
) -> None:
    repo = foreign_repository(tmp_path)
    (repo / "runtime" / "tables.py").write_text("TABLE = " + repr("x" * 1_100_000) + "\n")  # imported code
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=them", "-c", "user.email=them@example.com", "commit", "-qm", "big")

    result = npu_wizard("--answers", str(k8s_answers(tmp_path, "pytorchjob")), "--into", str(repo))

    assert result.returncode == 1, result.stdout + result.stderr
    said = result.stderr
    assert "over the 1024000 a ConfigMap can carry (1 MiB" in said and "runtime/tables.py" in said, said
    assert "into the image, or put it on a volume" in said and "nothing was written" in said
    assert git(repo, "status", "--porcelain", "--ignored") == "" and not (repo / "npu").exists()


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["ascendjob", "pytorchjob"])
def test_the_pods_start_their_train_py_from_the_repository_root_with_its_own_runtime_package(
    tmp_path: Path, engine: str
) -> None:
    from tests.k8s_pods import pod_project
    from tests.test_k8s_entry import NODES, OWN_DEVICES, train_pods

    # pods of one process and the shell launcher, as for a user's script in tests/test_k8s_entry.py: the
    # repository around the folder is the point
    repo = render_k8s(tmp_path, engine, OWN_DEVICES, "shell")
    project = repo / "npu"
    refreshed(project)

    # each pod exits 0; train.py asserts it imported the repository's runtime
    train_pods(project, engine, tmp_path, OWN_DEVICES)

    for node in range(NODES):
        copy = pod_project(repo, tmp_path / f"pod{node}")  # the pod's copy of the repository
        logs = copy / "npu" / "runs" / "latest" / "logs"
        for rank in range(node * OWN_DEVICES, (node + 1) * OWN_DEVICES):
            assert f"[rank {rank}] finished at step {STEPS}" in (logs / f"rank-{rank}.log").read_text()
    assert (pod_project(repo, tmp_path / "pod0") / "out" / "ckpt.pt").is_file()  # saved from the repository's root
