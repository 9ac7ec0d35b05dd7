"""A Kubernetes pod gets the project's code, the user's own script with the modules and packages it imports.

The ConfigMap (k8s/project.yaml, written again by `npu-wizard run` from the
files as they are) carries the script's folder tree; each pod's command puts
every file back at its own path, though a ConfigMap key cannot hold a '/'. No
cluster runs here: each pod's project volume is laid out as the kubelet lays
out a configMap volume, and the container's command runs for real.
"""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.factories import answers
from tests.k8s_pods import pod_command, pod_project
from tests.kube_schemas import load_all, problems
from wizard.answers.model import Answers
from wizard.render import k8s, k8s_code
from wizard.render.render import render

IMAGE = "registry.example.com/ml/pytorch:2.9.0"
# A script at src/main.py importing a module beside it and a package below it.
CODE = {
    "src/main.py": "import model\nfrom pkg import NAME\n\nprint('imported', model.WIDTH, NAME)\n",
    "src/model.py": "WIDTH = 4\n",
    "src/pkg/__init__.py": "NAME = 'pkg'\n",
}
# What the script's folder may hold besides its code: none of it is code the pod needs.
NOT_CODE = {
    "src/__pycache__/model.cpython-311.py": "stale\n",
    "src/.cache/notes.py": "hidden\n",
    "src/runs/latest/config.py": "a run's copy\n",
    "src/checkpoints/last.py": "a checkpoint's copy\n",
    "src/venv/pyvenv.cfg": "home = /usr/bin\n",
    "src/venv/lib/site.py": "a virtual environment\n",
    "odd-name/tool.py": "a top-level folder no import reaches (its name is no identifier)\n",
}


def k8s_answers(engine: str = "pytorchjob", **overrides: Any) -> Answers:
    """A CPU job of 2 pods x 1 process running the user's own src/main.py."""
    settings = {
        "nodes": 2,
        "devices_per_node": 1,
        "cluster__engine": engine,
        "cluster__image": IMAGE,
        "training__script": "src/main.py",
        **overrides,
    }
    return answers(**settings)


def project_with(tmp_path: Path, files: dict[str, str], answers_: Answers) -> Path:
    """A rendered project holding `files`, its ConfigMap written again as `npu-wizard run` does."""
    project = render(answers_, tmp_path).project_dir
    for name, text in files.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    k8s.refresh_configmap(project, answers_)
    return project


def play_pod(project: Path, engine: str, root: Path) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Set the master pod up as the kubelet would, run the container's command; its result and the workspace."""
    result = subprocess.run(pod_command(project, engine, 0, root), capture_output=True, text=True, timeout=60)
    return result, pod_project(project, root)


def test_a_script_in_src_gets_its_modules_and_packages_at_their_paths_in_the_pod(tmp_path: Path) -> None:
    project = project_with(tmp_path / "out", {**CODE, **NOT_CODE}, k8s_answers())

    result, copy = play_pod(project, "pytorchjob", tmp_path / "pod")

    # The command went on to launch/entry.sh, which stops here: no operator set this pod's variables.
    assert result.returncode == 2 and "launch/entry.sh: " in result.stderr, result.stderr
    carried = {path.relative_to(copy).as_posix() for path in copy.rglob("*") if path.is_file()}
    assert set(CODE) <= carried
    assert not carried & set(NOT_CODE)
    assert {name: (copy / name).read_text() for name in CODE} == CODE
    ran = subprocess.run([sys.executable, "src/main.py"], cwd=copy, capture_output=True, text=True, timeout=60)
    assert ran.stdout == "imported 4 pkg\n", ran.stderr


def test_a_top_level_script_gets_the_top_level_modules_and_packages(tmp_path: Path) -> None:
    files = {
        "main.py": "import data.prep\nimport helpers\nimport mylib.core\nimport scripts.plot\n\n"
        "print(helpers.X + mylib.core.Y + scripts.plot.Z + data.prep.W)\n",
        "helpers.py": "X = 1\n",
        "mylib/__init__.py": "",
        "mylib/core.py": "Y = 2\n",
        "scripts/plot.py": "Z = 4\n",  # a namespace package (no __init__.py)
        "data/__init__.py": "",  # a user's script has no data folder: a package like any other
        "data/prep.py": "W = 8\n",
        "runs/latest/x.py": "a run's copy\n",
    }
    answers_ = k8s_answers("ascendjob", training__script="main.py")
    project = project_with(tmp_path / "out", files, answers_)

    result, copy = play_pod(project, "ascendjob", tmp_path / "pod")

    assert result.returncode == 2, result.stderr
    carried = {path.relative_to(copy).as_posix() for path in copy.rglob("*.py")}
    assert {name for name in files if not name.startswith("runs/")} <= carried
    assert not (copy / "runs").exists()
    ran = subprocess.run([sys.executable, "main.py"], cwd=copy, capture_output=True, text=True, timeout=60)
    assert ran.stdout == "15\n", ran.stderr


@pytest.mark.parametrize(
    ("script", "volume", "carried"),
    [
        ("main.py", {}, True),  # a user's script: data/ is code
        ("main.py", {"cluster__data_host_path": "/srv/data"}, False),  # the pods mount the data volume there
        ("main.py", {"cluster__data_pvc": "datasets"}, False),
        (None, {}, False),  # the generated script's data folder (training.data_dir's default)
    ],
)
def test_data_is_code_unless_it_is_the_pods_data_folder(
    tmp_path: Path, script: str | None, volume: dict[str, str], carried: bool
) -> None:
    files = {"main.py": "import data.loader\n", "data/loader.py": "ROWS = 3\n"}
    project = project_with(tmp_path / "out", files, k8s_answers(training__script=script, **volume))
    assert ("data/loader.py" in carried_paths(project)) is carried


@pytest.mark.parametrize("engine", ["ascendjob", "pytorchjob"])
def test_the_job_mounts_the_whole_configmap_and_both_validate(tmp_path: Path, engine: str) -> None:
    project = project_with(tmp_path, CODE, k8s_answers(engine))
    (job,) = load_all(project / k8s.manifest_file(engine))
    (configmap,) = load_all(project / k8s.CONFIGMAP_FILE)
    assert problems(job) == [] and problems(configmap) == []
    assert {"src.main.py", "src.model.py", "src.pkg.__init__.py", "runtime.data.py"} <= set(configmap["data"])


def test_any_file_name_becomes_a_valid_key_and_comes_back_at_its_path(tmp_path: Path) -> None:
    files = {
        **CODE,
        "src/my model.py": "A = 1\n",
        "src/ odd  name.py": "D = 4\n",
        "src/my.model.py": "B = 2\n",
        "src/my/model.py": "C = 3\n",
    }
    project = project_with(tmp_path / "out", files, k8s_answers())
    (configmap,) = load_all(project / k8s.CONFIGMAP_FILE)
    assert problems(configmap) == []
    assert all(re.fullmatch(r"[-._a-zA-Z0-9]{1,253}", key) for key in configmap["data"]), list(configmap["data"])

    _result, copy = play_pod(project, "pytorchjob", tmp_path / "pod")

    assert {name: (copy / name).read_text() for name in files} == files


def outside_files(root: Path) -> Path:
    """A folder outside the project holding what must never reach a pod: a file and a package."""
    (root / "lib").mkdir(parents=True)
    (root / "passwd").write_text("root:x:0:0:SECRET\n")
    (root / "lib" / "__init__.py").write_text("KEY = 'SECRET'\n")
    return root


def carried_paths(project: Path) -> list[str]:
    """The paths the ConfigMap of `project` puts back in each pod."""
    (configmap,) = load_all(project / k8s.CONFIGMAP_FILE)
    assert not any("SECRET" in text for text in configmap["data"].values())
    return [line.split(" ", 1)[1] for line in configmap["data"][k8s_code.LAYOUT_KEY].splitlines()]


@pytest.mark.parametrize(
    ("engine", "script", "files", "links"),
    [
        ("pytorchjob", "src/main.py", CODE, {"src/secret.py": "passwd", "src/alias": "lib", "src/pkg/lib": "lib"}),
        (
            "ascendjob",
            "main.py",
            {"main.py": "print(1)\n"},
            {"notes.py": "passwd", "lib": "lib", "launch/x.sh": "passwd"},
        ),
    ],
)
def test_a_symbolic_link_in_the_project_never_brings_what_it_points_to(
    tmp_path: Path, engine: str, script: str, files: dict[str, str], links: dict[str, str]
) -> None:
    outside = outside_files(tmp_path / "outside")
    answers_ = k8s_answers(engine, training__script=script)
    project = project_with(tmp_path / "out", files, answers_)
    for name, target in links.items():
        (project / name).symlink_to(outside / target)

    k8s.refresh_configmap(project, answers_)

    paths = carried_paths(project)
    assert set(files) <= set(paths)
    assert [path for path in paths if path.startswith(tuple(links))] == []


@pytest.mark.parametrize("linked", ["src/main.py", "src"])
def test_a_training_script_reached_through_a_symbolic_link_is_refused_in_one_line(tmp_path: Path, linked: str) -> None:
    project = project_with(tmp_path / "out", CODE, k8s_answers())
    elsewhere = tmp_path / "elsewhere"
    (project / linked).rename(elsewhere)
    (project / linked).symlink_to(elsewhere)
    before = (project / k8s.CONFIGMAP_FILE).read_text()

    with pytest.raises(k8s_code.ConfigMapError) as refused:
        k8s.refresh_configmap(project, k8s_answers())

    message = str(refused.value)
    assert message.startswith(f"training.script src/main.py: {linked} is a symbolic link") and "\n" not in message
    assert (project / k8s.CONFIGMAP_FILE).read_text() == before


def test_a_file_name_that_is_not_utf8_is_refused_naming_it(tmp_path: Path) -> None:
    project = project_with(tmp_path / "out", CODE, k8s_answers())
    (project / os.fsdecode(b"src/x\xff.py")).write_text("X = 1\n")
    before = (project / k8s.CONFIGMAP_FILE).read_text()

    with pytest.raises(k8s_code.ConfigMapError) as refused:
        k8s.refresh_configmap(project, k8s_answers())

    message = str(refused.value)
    assert message.startswith("b'src/x\\xff.py': a file name that is not UTF-8"), message
    assert message.encode("utf-8") and "\n" not in message
    assert (project / k8s.CONFIGMAP_FILE).read_text() == before


def test_code_over_a_configmaps_limit_is_refused_naming_the_biggest_files(tmp_path: Path) -> None:
    project = render(k8s_answers(), tmp_path).project_dir
    for name, text in CODE.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    # Over a ConfigMap's 1 MiB with the rest of the code.
    (project / "src" / "table.py").write_text("T = '" + "x" * 600_000 + "'\n")
    (project / "src" / "pkg" / "vocab.py").write_text("V = '" + "y" * 400_000 + "'\n")
    before = (project / k8s.CONFIGMAP_FILE).read_text()

    with pytest.raises(k8s_code.ConfigMapTooLarge) as refused:
        k8s.refresh_configmap(project, k8s_answers())

    message = str(refused.value)
    assert "as kubectl sends it, over the 1024000 a ConfigMap can carry" in message
    assert "src/table.py (600007 bytes), src/pkg/vocab.py (400007 bytes)" in message
    assert "data comes from the data volume" in message
    assert (project / k8s.CONFIGMAP_FILE).read_text() == before


def test_a_conda_environment_in_the_project_is_not_code(tmp_path: Path) -> None:
    # `conda create -p ./env` leaves no pyvenv.cfg: its conda-meta/ marks it. Its standard library (300 KB here)
    # would put the code over the ConfigMap's limit, and a rank imports none of it from there.
    answers_ = k8s_answers()
    project = project_with(tmp_path / "out", CODE, answers_)
    environment = project / "env"
    (environment / "conda-meta").mkdir(parents=True)
    (environment / "conda-meta" / "history").write_text("==> 2026-01-01 00:00:00 <==\n")
    library = environment / "lib" / "python3.11"
    library.mkdir(parents=True)
    for module in ("os", "json", "email", "typing", "argparse", "pathlib"):
        (library / f"{module}.py").write_text(f"# {module}\n" + "X = 0\n" * 8_000)

    result = subprocess.run(
        [sys.executable, "-m", "wizard", "run", str(project), "--dry-run"], capture_output=True, text=True, timeout=120
    )

    assert result.returncode == 0, result.stderr
    k8s.refresh_configmap(project, answers_)
    carried = carried_paths(project)
    assert set(CODE) <= set(carried) and not [name for name in carried if name.startswith("env/")]


def test_a_file_of_gigabytes_is_refused_by_its_size_without_reading_it(tmp_path: Path) -> None:
    project = project_with(tmp_path / "out", CODE, k8s_answers())
    (project / "src" / "table.py").write_text("")
    os.truncate(project / "src" / "table.py", 2 * 1024**3)  # 2 GiB on a sparse file: no disk used
    memory = 1024**3  # this process may map 1 GiB: enough for npu-wizard, half the file

    result = subprocess.run(
        [sys.executable, "-m", "wizard", "run", str(project), "--dry-run"],
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (memory, memory)),
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == 1 and len(result.stderr.splitlines()) == 1, result.stderr
    size = re.match(
        r"npu-wizard: the project's code comes to at least (\d+) bytes as kubectl sends it, over "
        r"the 1024000 a ConfigMap",
        result.stderr,
    )
    assert size and int(size[1]) > 2 * 1024**3, result.stderr
    assert "the biggest: src/table.py (2147483648 bytes)" in result.stderr


def test_code_is_measured_as_kubectl_apply_escapes_it(tmp_path: Path) -> None:
    files = {**CODE, "src/table.py": "T = '" + "<" * 200_000 + "'\n"}  # 200 KB on disk, 1.2 MB as kubectl's JSON
    project = render(k8s_answers(), tmp_path).project_dir
    for name, text in files.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)

    with pytest.raises(k8s_code.ConfigMapTooLarge) as refused:
        k8s.refresh_configmap(project, k8s_answers())

    assert "the biggest: src/table.py (200007 bytes)" in str(refused.value)


def test_the_readme_says_the_pods_get_the_code_and_not_the_data(tmp_path: Path) -> None:
    project = render(k8s_answers(), tmp_path).project_dir
    readme = " ".join((project / "README.md").read_text().split())
    assert (
        "It carries every Python file a rank can import: those of `src/` (your script's folder, sub-folders "
        "included), the top-level modules and the top-level folders (packages, with or without `__init__.py`, "
        "sub-folders included)"
    ) in readme
    assert "a ConfigMap with this project's code only: data comes from the data volume" in readme
    assert "`checkpoints/`, caches and virtual environments stay here" in readme  # a user's script: no data folder
    with_volume = render(k8s_answers(cluster__data_pvc="datasets"), tmp_path / "volume").project_dir
    readme = " ".join((with_volume / "README.md").read_text().split())
    assert "`checkpoints/`, `data/` (where the pods mount the data volume), caches and virtual" in readme
