"""`npu-wizard update`: real projects, real edits, the real command in a fresh interpreter."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.runs import free_port, node_env, start_nodes, wait_nodes
from tests.wizard_forks import wizard
from wizard.answers.model import resolve
from wizard.render.journal import PAUSE_AT_ENV, PAUSE_FILE_ENV
from wizard.render.render import render

# The user's own model, in place of the generated build_model.
USER_MODEL = '''def build_model(spec: data.DataSpec) -> nn.Module:
    """My model: one hidden layer of 32."""
    print("building my own model", flush=True)
    features = torch.Size(spec.input_shape).numel()
    return nn.Sequential(nn.Flatten(), nn.Linear(features, 32), nn.ReLU(), nn.Linear(32, spec.num_classes))
'''


def project_raw(nodes: int, **overrides: Any) -> dict[str, Any]:
    """Answers of a small CPU project: `nodes` x 1 process on loopback, a few steps."""
    return {
        "project_name": "job",
        "device": "cpu",
        "nodes": nodes,
        "devices_per_node": 1,
        "launcher": "torchrun",
        "amp": "off",
        "network.host_ips": ["127.0.0.1"] * nodes,
        "network.master_port": free_port(),
        "training.samples": 256,
        "training.batch_size": 16,
        "training.epochs": 1,
        "training.log_every": 4,
        **overrides,
    }


def render_project(folder: Path, raw: dict[str, Any]) -> Path:
    """Render `raw` into `folder`; return the project."""
    return render(resolve(raw), folder).project_dir


def replace_build_model(text: str) -> str:
    """train.py with the generated build_model swapped for USER_MODEL."""
    start = text.index("def build_model(")
    end = text.index("\n\n\n# ---- end of yours")
    return text[:start] + USER_MODEL.rstrip("\n") + text[end:]


def edit_answers(project: Path, **changes: Any) -> None:
    """Change answers.yaml the way a user does (dotted names for nested keys)."""
    path = project / "answers.yaml"
    document = yaml.safe_load(path.read_text())
    for name, value in changes.items():
        *sections, key = name.split("__")
        (document[sections[0]] if sections else document)[key] = value
    path.write_text(yaml.safe_dump(document, sort_keys=False))


def update(project: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `npu-wizard update PROJECT ...`, a process of its own (tests/wizard_forks.py)."""
    return wizard(["update", str(project), *args], env=env, timeout=180)


def files_of(root: Path, skip: tuple[str, ...] = ()) -> dict[str, tuple[bytes, int]]:
    """Every file under root: bytes and permission bits, by relative path (minus `skip` prefixes)."""
    found = {}
    for path in sorted(root.rglob("*")):
        name = path.relative_to(root).as_posix()
        if path.is_file() and not name.startswith(skip):
            found[name] = (path.read_bytes(), path.stat().st_mode & 0o777)
    return found


def two_node_project_with_my_model(tmp_path: Path) -> Path:
    """A rendered 2-node project whose build_model the user replaced."""
    project = render_project(tmp_path / "projects", project_raw(2))
    train = project / "train.py"
    train.write_text(replace_build_model(train.read_text()))
    return project


def wait_for(condition: Callable[[], bool], timeout: float = 120) -> None:
    """Poll `condition` until it holds; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


# ---- merges that keep the user's code ----------------------------------------------


@pytest.mark.slow  # the updated project trains: four torch processes
def test_my_build_model_survives_two_to_four_nodes_and_a_launcher_change_and_trains(tmp_path: Path) -> None:
    project = two_node_project_with_my_model(tmp_path)
    port = yaml.safe_load((project / "answers.yaml").read_text())["network"]["master_port"]
    edit_answers(project, nodes=4, launcher="shell", network__host_ips=["127.0.0.1"] * 4)

    result = update(project)

    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[1:] == [
        "  updated  README.md",
        "  updated  launch/node0.sh",
        "  updated  launch/node1.sh",
        "  added    launch/node2.sh",
        "  added    launch/node3.sh",
        "  updated  launch/run-node.sh",
        "  merged   train.py (your edits kept)",
        f"updated {project}: 7 file(s)",
    ]
    fresh = render_project(tmp_path / "fresh", project_raw(4, launcher="shell", **{"network.master_port": port}))
    assert (project / "train.py").read_text() == replace_build_model((fresh / "train.py").read_text())
    skip = ("train.py", "answers.yaml", ".npu-wizard/")
    assert files_of(project, skip) == files_of(fresh, skip)

    nodes = wait_nodes(start_nodes(project, node_env(tmp_path / "run")), timeout=300)
    assert [code for code, _ in nodes] == [0, 0, 0, 0], "\n".join(out for _, out in nodes)
    for rank in range(4):
        assert "building my own model" in (tmp_path / "run" / "logs" / f"rank-{rank}.log").read_text()


def test_four_to_two_nodes_removes_unedited_node_scripts_and_keeps_an_edited_one(tmp_path: Path) -> None:
    project = render_project(tmp_path, project_raw(4))
    with (project / "launch" / "node3.sh").open("a") as script:
        script.write("# node 3 is the one with the big disk\n")
    edit_answers(project, nodes=2, network__host_ips=["127.0.0.1"] * 2)

    result = update(project)

    assert result.returncode == 0, result.stderr
    assert "  removed  launch/node2.sh (no longer generated)" in result.stdout.splitlines()
    assert "  kept     launch/node3.sh (no longer generated, but edited here: left as it is)" in result.stdout
    assert sorted(p.name for p in (project / "launch").iterdir()) == ["node0.sh", "node1.sh", "node3.sh", "run-node.sh"]


def test_update_from_another_answers_file_records_those_answers(tmp_path: Path) -> None:
    project = two_node_project_with_my_model(tmp_path)
    document = yaml.safe_load((project / "answers.yaml").read_text())
    document["amp"] = "bf16"
    other = tmp_path / "bf16.yaml"
    other.write_text(yaml.safe_dump(document))

    result = update(project, "--answers", str(other))

    assert result.returncode == 0, result.stderr
    assert yaml.safe_load((project / "answers.yaml").read_text())["amp"] == "bf16"
    assert 'AMP = "bf16"' in (project / "train.py").read_text()
    assert "building my own model" in (project / "train.py").read_text()


def test_nothing_to_do_says_so_and_writes_nothing(tmp_path: Path) -> None:
    project = two_node_project_with_my_model(tmp_path)
    before = files_of(project)
    result = update(project)
    assert (result.returncode, result.stdout) == (
        0,
        f"{project} already matches {project / 'answers.yaml'}: nothing to change\n",
    )
    assert files_of(project) == before


# ---- conflicts, dry runs, bad input: nothing changes ----------------------------------


def conflicting_project(tmp_path: Path) -> Path:
    """My model, plus a hand edit of the very line that 2 -> 4 nodes changes."""
    project = two_node_project_with_my_model(tmp_path)
    train = project / "train.py"
    train.write_text(train.read_text().replace("NODES = 2\n", "NODES = 2  # two boxes in rack 7\n"))
    edit_answers(project, nodes=4, network__host_ips=["127.0.0.1"] * 4)
    return project


def test_a_conflicting_edit_exits_1_names_the_file_and_line_and_changes_nothing(tmp_path: Path) -> None:
    project = conflicting_project(tmp_path)
    before = files_of(project)
    line = (project / "train.py").read_text().splitlines().index("NODES = 2  # two boxes in rack 7") + 1

    result = update(project)

    assert result.returncode == 1
    assert f"  conflict train.py: line {line}" in result.stdout.splitlines()
    assert result.stderr.startswith("npu-wizard: 1 file(s) conflict, so nothing was changed: train.py;")
    assert files_of(project) == before


def test_write_conflicts_writes_markers_and_the_clean_merges_and_still_exits_1(tmp_path: Path) -> None:
    project = conflicting_project(tmp_path)

    result = update(project, "--write-conflicts")

    assert result.returncode == 1
    text = (project / "train.py").read_text()
    assert "<<<<<<< yours\nNODES = 2  # two boxes in rack 7\n=======\nNODES = 4\n>>>>>>> npu-wizard update\n" in text
    assert "building my own model" in text
    assert (project / "launch" / "node3.sh").is_file()
    assert not (project / ".npu-wizard" / "update").exists()


def test_dry_run_lists_the_changes_and_writes_nothing(tmp_path: Path) -> None:
    project = two_node_project_with_my_model(tmp_path)
    edit_answers(project, nodes=4, network__host_ips=["127.0.0.1"] * 4)
    before = files_of(project)

    result = update(project, "--dry-run")

    assert result.returncode == 0, result.stderr
    assert "  added    launch/node3.sh" in result.stdout.splitlines()
    assert result.stdout.splitlines()[-1] == "dry run: nothing was written"
    assert files_of(project) == before


def test_bad_new_answers_exit_1_and_change_nothing(tmp_path: Path) -> None:
    project = two_node_project_with_my_model(tmp_path)
    edit_answers(project, nodes=4)  # three host IPs short
    before = files_of(project)
    result = update(project)
    assert result.returncode == 1
    assert "network.host_ips" in result.stderr and "4 expected, 2 given" in result.stderr
    assert files_of(project) == before


def test_a_folder_without_a_pristine_copy_is_refused(tmp_path: Path) -> None:
    project = two_node_project_with_my_model(tmp_path)
    shutil.rmtree(project / ".npu-wizard")
    result = update(project)
    assert result.returncode == 1
    assert "has no .npu-wizard/pristine.json.gz" in result.stderr


# ---- an update killed part way ------------------------------------------------------


def start_paused_update(project: Path, point: str, flag: Path, *args: str) -> subprocess.Popen[bytes]:
    """Start an update (with `args`) that stops at `point` (the test hook) and wait until it is there."""
    env = {**os.environ, PAUSE_AT_ENV: point, PAUSE_FILE_ENV: str(flag)}
    process = subprocess.Popen(
        [sys.executable, "-m", "wizard", "update", str(project), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    wait_for(lambda: flag.exists() or process.poll() is not None)
    assert process.poll() is None, process.communicate()
    return process


def kill(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL, as a crash or the OOM killer would, and reap."""
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)


def test_an_update_killed_before_its_commit_leaves_the_project_as_it_was(tmp_path: Path) -> None:
    project = two_node_project_with_my_model(tmp_path)
    edit_answers(project, nodes=4, network__host_ips=["127.0.0.1"] * 4)
    control = shutil.copytree(project, tmp_path / "control" / "job")
    before = files_of(project)

    kill(start_paused_update(project, "before-commit", tmp_path / "paused"))

    # Its staging and its lock file (which names the dead process, and whose lock died with it) are left.
    assert files_of(project, skip=(".npu-wizard/update/", ".npu-wizard/update.lock")) == before
    assert (project / ".npu-wizard" / "update" / "files" / "launch" / "node3.sh").is_file()  # it was mid-way
    assert update(project).returncode == 0
    assert update(control).returncode == 0
    assert files_of(project) == files_of(control)


def test_an_update_killed_after_its_commit_is_finished_by_the_next_one(tmp_path: Path) -> None:
    project = two_node_project_with_my_model(tmp_path)
    edit_answers(project, nodes=4, network__host_ips=["127.0.0.1"] * 4)
    control = shutil.copytree(project, tmp_path / "control" / "job")

    kill(start_paused_update(project, "after-first-move", tmp_path / "paused"))

    refused = update(project, "--dry-run")
    assert refused.returncode == 1
    assert "was interrupted; run npu-wizard update without --dry-run to finish it" in refused.stderr
    finished = update(project)
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.startswith(f"finished the interrupted update of {project} first\n")
    assert update(control).returncode == 0
    assert files_of(project) == files_of(control)


def test_the_pristine_copy_holds_every_file_of_the_render_as_written(tmp_path: Path) -> None:
    from wizard.render.pristine import load

    project = render_project(tmp_path, project_raw(2))
    kept = load(project)
    assert kept.generator.startswith("npu-wizard ")
    assert {name: text.encode() for name, text in kept.files.items()} == {
        name: data for name, (data, _) in files_of(project, skip=(".npu-wizard/",)).items()
    }
    assert kept.executable == {"launch/node0.sh", "launch/node1.sh", "launch/run-node.sh", "sysctl/reserve-ports.sh"}
