"""The wizard end to end under Pilot: typed answers give the very project `--answers` gives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from textual.pilot import Pilot

from tests.tui_driver import answer_all, render_into, run_wizard, snapshot_of
from wizard.answers.model import flatten
from wizard.cli import main
from wizard.tui import create_app
from wizard.tui.review import DoneScreen, ReviewScreen

EXAMPLES = Path(__file__).parent.parent / "examples"

CONFIGURATIONS: dict[str, dict[str, Any]] = {
    "training-2x4-shell-fp16": {
        "project_name": "t910-shell",
        "hardware": "atlas-training",
        "nodes": 2,
        "devices_per_node": 4,
        "network.host_ips": ["10.0.0.1", "10.0.0.2"],
        "network.master_addr": "10.0.0.1",
        "network.master_port": 29600,
        "launcher": "shell",
        "amp": "fp16",
        "training.batch_size": 16,
        "training.base_batch_size": 64,
        "training.base_lr": 0.1,
    },
    "a3-1x16-torch-npu-run-bf16-imagefolder": {
        "project_name": "a3-solo",
        "hardware": "atlas-a3",
        "devices_per_node": 16,
        "launcher": "torch-npu-run",
        "amp": "bf16",
        "training.model": "resnet18",
        "training.dataset": "imagefolder",
        "training.data_dir": "/data/imagenet",
        "training.lr": 0.2,
        "training.epochs": 7,
        "environment.cann_set_env": "/usr/local/Ascend/cann/set_env.sh",
    },
    "cpu-2x2-torch-launch-mnist-nic": {
        "project_name": "cpu-sim",
        "device": "cpu",
        "nodes": 2,
        "devices_per_node": 2,
        "network.host_ips": ["127.0.0.1", "127.0.0.1"],
        "network.nic": "eth0",
        "network.hccl_base_port": 61000,
        "launcher": "torch-launch",
        "amp": "off",
        "training.model": "convnet",
        "training.dataset": "mnist",
        "training.checkpoint_every": 0,
        "environment.torch_npu_version": "2.5.1",
        "environment.torch_version": "2.5.1",
        "network.connect_timeout": 300,
        "network.exec_timeout": 1800,
    },
}


def answers_file(tmp_path: Path, raw: dict[str, Any]) -> Path:
    """The nested answers file of dotted raw answers, written by hand (not by the wizard)."""
    document: dict[str, Any] = {"schema": 1}
    for name, value in raw.items():
        if "." in name:
            section, key = name.split(".", 1)
            document.setdefault(section, {})[key] = value
        else:
            document[name] = value
    path = tmp_path / "answers.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def render_with_answers_file(path: Path, output: Path) -> None:
    """The non-interactive render of the same answers."""
    assert main(["--answers", str(path), "-o", str(output)]) == 0


@pytest.mark.parametrize("name", sorted(CONFIGURATIONS))
def test_typed_answers_render_the_same_project_as_the_answers_file(tmp_path: Path, name: str) -> None:
    raw = CONFIGURATIONS[name]
    out = tmp_path / "tui"

    async def scenario(pilot: Pilot[int]) -> None:
        await answer_all(pilot, raw)
        assert isinstance(pilot.app.screen, ReviewScreen)
        await render_into(pilot, out)
        assert isinstance(pilot.app.screen, DoneScreen)

    run_wizard(scenario)
    render_with_answers_file(answers_file(tmp_path, raw), tmp_path / "cli")
    project = raw["project_name"]
    tui_files = snapshot_of(out / project)
    assert tui_files == snapshot_of(tmp_path / "cli" / project)
    assert "launch/node0.sh" in tui_files


def test_editing_an_example_and_rendering_unchanged_gives_the_example_project(tmp_path: Path) -> None:
    example = EXAMPLES / "a3-two-nodes-torch-npu-run.yaml"
    raw, problems = flatten(yaml.safe_load(example.read_text()))
    assert problems == []

    async def scenario(pilot: Pilot[int]) -> None:
        await answer_all(pilot, {})
        await render_into(pilot, tmp_path / "tui")

    run_wizard(scenario, create_app(raw, blink=False))
    render_with_answers_file(example, tmp_path / "cli")
    assert snapshot_of(tmp_path / "tui" / "a3-cluster") == snapshot_of(tmp_path / "cli" / "a3-cluster")


def test_the_done_page_saves_the_answers_file_and_shows_the_run_command(tmp_path: Path) -> None:
    saved = tmp_path / "mine.yaml"

    async def scenario(pilot: Pilot[int]) -> None:
        await answer_all(pilot, {"device": "cpu", "devices_per_node": 2})
        await render_into(pilot, tmp_path / "out")
        screen = pilot.app.screen
        assert f"npu-wizard run {tmp_path / 'out' / 'ddp-npu'}" in str(screen.query_one("#next").render())
        from textual.widgets import Input

        from tests.tui_driver import type_into

        await type_into(pilot, screen.query_one("#save-path", Input), str(saved))
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert "Saved" in str(screen.query_one("#saved").render())

    run_wizard(scenario)
    assert saved.read_text() == (tmp_path / "out" / "ddp-npu" / "answers.yaml").read_text()
    render_with_answers_file(saved, tmp_path / "again")
    assert snapshot_of(tmp_path / "again" / "ddp-npu") == snapshot_of(tmp_path / "out" / "ddp-npu")
