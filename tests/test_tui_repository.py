"""Started inside a git repository: into it up front, named after it, its scripts offered, train.py kept as yours."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

from textual.pilot import Pilot
from textual.widgets import Input, Label, OptionList, Static

from tests.test_tui_user_script import choose_own, visible
from tests.tui_driver import field, next_step, problem_text, run_wizard, type_into, until
from wizard.answers.model import dump, resolve
from wizard.answers.script import is_foreign
from wizard.tui import create_app
from wizard.tui.repository import project_name_from, scripts_in
from wizard.tui.screens import StepScreen, WhereScreen

DDP = "import torch.distributed as dist\ndist.init_process_group('gloo')\n"


def repository(root: Path, files: dict[str, str], name: str = "My_Repo") -> Path:
    """A git repository (a folder with .git) holding `files`."""
    repo = root / name
    for relative, text in files.items():
        (repo / relative).parent.mkdir(parents=True, exist_ok=True)
        (repo / relative).write_text(text)
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    return repo


async def to_training(pilot: Pilot[int]) -> None:
    """Step on (a CPU node of two) until the Training step shows."""
    while not (isinstance(pilot.app.screen, StepScreen) and pilot.app.screen.step == "training"):
        step = pilot.app.screen.step
        if step == "hardware":
            pilot.app.state.set("device", "cpu")
        if step == "topology":
            pilot.app.state.set("devices_per_node", "2")
        await next_step(pilot)


def test_a_folder_name_becomes_a_valid_project_name() -> None:
    assert project_name_from("My_Repo") == "my_repo"
    assert project_name_from("nanoGPT") == "nanogpt"
    assert project_name_from("my repo (copy)") == "my-repo-copy"
    assert project_name_from("3d.models") == "repo-3d-models"
    assert project_name_from("...") == "ddp-npu"


def test_scripts_that_start_a_process_group_come_first(tmp_path: Path) -> None:
    repo = repository(tmp_path, {"a.py": "x = 1\n", "train.py": DDP, "src/main.py": DDP, ".venv/x.py": DDP})
    assert scripts_in(repo) == ["train.py", "src/main.py", "a.py"]


def test_in_a_repository_the_wizard_offers_into_it_first_and_checks_my_script_there(tmp_path: Path) -> None:
    repo = repository(tmp_path, {"train.py": DDP, "helper.py": "x = 1\n", "src/main.py": DDP})

    async def scenario(pilot: Pilot[int]) -> None:
        assert isinstance(pilot.app.screen, WhereScreen)
        await pilot.press("enter")  # "Into this repository" is highlighted first
        await until(pilot, lambda: isinstance(pilot.app.screen, StepScreen), "the Project step")
        assert pilot.app.into and pilot.app.output_dir == repo
        assert field(pilot, "project_name").query_one(Input).value == "my_repo"
        assert "My_Repo" in str(pilot.app.screen.query_one("#name-hint", Static).render())
        await to_training(pilot)
        await choose_own(pilot)
        suggestions = field(pilot, "training.script").query_one(".script-suggestions", OptionList)
        assert suggestions.display
        offered = [suggestions.get_option_at_index(i).id for i in range(suggestions.option_count)]
        assert offered == ["train.py", "src/main.py", "helper.py"]
        path = field(pilot, "training.script").query_one(".script-path", Input)
        await type_into(pilot, path, "nope.py")
        assert f"no file nope.py in {repo}" in problem_text(pilot, "training.script")
        await type_into(pilot, path, "src/main.py")
        assert problem_text(pilot, "training.script") == ""
        assert pilot.app.state.project_dir == repo
        # the label and the help panel say what the path is relative to here: the repository's root
        label = str(field(pilot, "training.script").query_one(".script-path-label", Label).render())
        assert "(relative to the repository)" in label, label
        panel = " ".join(str(pilot.app.screen.query_one("#help", Static).render()).split())
        assert "or to the repository's root when npu-wizard renders into a repository" in panel, panel
        generated_only = ("training.batch_size", "training.lr", "training.warmup_epochs", "training.epochs")
        assert not any(visible(pilot, name) for name in generated_only)
        assert not any(hint.display for hint in pilot.app.screen.query("#lr-hint"))

    run_wizard(scenario, create_app(blink=False, repository=repo))


def test_a_new_project_folder_is_the_other_answer(tmp_path: Path) -> None:
    repo = repository(tmp_path, {"train.py": DDP})

    async def scenario(pilot: Pilot[int]) -> None:
        await pilot.press("down", "enter")
        await until(pilot, lambda: isinstance(pilot.app.screen, StepScreen), "the Project step")
        assert not pilot.app.into
        assert field(pilot, "project_name").query_one(Input).value == "ddp-npu"

    run_wizard(scenario, create_app(blink=False, repository=repo))


def test_your_own_train_py_stays_your_own_and_is_never_switched_to_the_generated_one(tmp_path: Path) -> None:
    repo = repository(tmp_path, {"train.py": DDP})

    async def scenario(pilot: Pilot[int]) -> None:
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(pilot.app.screen, StepScreen), "the Project step")
        await to_training(pilot)
        await choose_own(pilot)
        path = field(pilot, "training.script").query_one(".script-path", Input)
        await type_into(pilot, path, "train.py")
        await pilot.press("escape")  # leave the step and come back: the choice is still there
        await pilot.pause()
        await next_step(pilot)
        script = field(pilot, "training.script")
        assert script.query_one(OptionList).highlighted == 1  # "Your own"
        assert script.query_one(".script-path", Input).display
        assert script.query_one(".script-path", Input).value == "train.py"
        assert not visible(pilot, "training.model") and not visible(pilot, "training.batch_size")
        state = pilot.app.state
        assert state.script_is_own()
        assert not state.step_errors("training")  # the answers take train.py as the user's script
        assert state.answers()["training.script"] == "train.py" and is_foreign(state.answers()["training.script"])

    run_wizard(scenario, create_app(blink=False, repository=repo))


def test_a_script_of_my_own_gets_no_generated_training_questions_in_its_answers() -> None:
    written = dump(resolve({"device": "cpu", "training.script": "mine.py"}))
    for key in ("batch_size", "lr:", "base_lr", "warmup_epochs", "epochs", "model", "dataset"):
        assert key not in written, key
    assert "batch_size" in dump(resolve({"device": "cpu"}))


def test_a_fifo_named_like_a_script_is_skipped_without_blocking(tmp_path: Path) -> None:
    repo = repository(tmp_path, {"train.py": DDP, "a.py": "x = 1\n"})
    os.mkfifo(repo / "x.py")
    (repo / "gone.py").symlink_to(repo / "nowhere.py")
    found: list[list[str]] = []
    reader = threading.Thread(target=lambda: found.append(scripts_in(repo)), daemon=True)
    reader.start()
    reader.join(timeout=10)
    if reader.is_alive():  # blocked opening the FIFO: a writer lets it go on, so the test can end
        os.close(os.open(repo / "x.py", os.O_WRONLY | os.O_NONBLOCK))
        reader.join(timeout=10)
    assert found == [["train.py", "a.py"]]
    assert not reader.is_alive()
