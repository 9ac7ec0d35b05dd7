"""The Training step asks "Generated model script or your own?" and, for your own, its path and arguments."""

from __future__ import annotations

from pathlib import Path

from textual.pilot import Pilot
from textual.widgets import Input, Label, OptionList

from tests.tui_driver import answer, field, next_step, problem_text, run_wizard, shown, type_into, until
from wizard.tui import create_app
from wizard.tui.review import ReviewScreen
from wizard.tui.screens import StepScreen


async def to_training_step(pilot: Pilot[int]) -> None:
    """Step on with the defaults (a CPU project named own) until the Training step shows."""
    await answer(pilot, "project_name", "own")
    while not (isinstance(pilot.app.screen, StepScreen) and pilot.app.screen.step == "training"):
        if pilot.app.screen.step == "hardware":
            await answer(pilot, "device", "cpu")
        if pilot.app.screen.step == "topology":
            await answer(pilot, "devices_per_node", "2")
        await next_step(pilot)


async def choose_own(pilot: Pilot[int]) -> None:
    """Pick "Your own" in the either-or question with the arrow keys and Enter."""
    options = field(pilot, "training.script").query_one(OptionList)
    options.focus()
    await pilot.press("home", "down", "enter")
    await pilot.pause()


def visible(pilot: Pilot[int], name: str) -> bool:
    """Whether a question's field shows on the current step."""
    return shown(pilot, name)


def test_your_own_script_is_checked_on_disk_skips_model_and_dataset_and_takes_quoted_arguments(
    tmp_path: Path,
) -> None:
    project = tmp_path / "own"

    async def scenario(pilot: Pilot[int]) -> None:
        await to_training_step(pilot)
        asked = field(pilot, "training.script").query_one(".prompt", Label)
        assert str(asked.render()) == "Generated model script or your own?"
        assert visible(pilot, "training.model") and visible(pilot, "training.dataset")
        assert not visible(pilot, "training.script_args")
        await choose_own(pilot)
        path = field(pilot, "training.script").query_one(".script-path", Input)
        assert path.display
        await type_into(pilot, path, "src/main.txt")
        assert "not a Python file" in problem_text(pilot, "training.script")
        await type_into(pilot, path, "../main.py")
        assert "leaves the project folder" in problem_text(pilot, "training.script")
        await type_into(pilot, path, "src/main.py")
        assert f"no file src/main.py in {project}" in problem_text(pilot, "training.script")
        assert not visible(pilot, "training.model") and not visible(pilot, "training.dataset")
        assert visible(pilot, "training.script_args")
        await next_step(pilot)
        assert pilot.app.screen.step == "training"  # refused: the script is not there
        (project / "src").mkdir(parents=True)
        (project / "src" / "main.py").write_text("print('mine')\n")
        await type_into(pilot, path, "src/main.py")
        assert "no file" not in problem_text(pilot, "training.script")
        args = field(pilot, "training.script_args").query_one(Input)
        await type_into(pilot, args, "--data '/data/my set' -v")
        await next_step(pilot)
        await until(pilot, lambda: pilot.app.screen.step != "training", "the step after Training")
        values = pilot.app.state.answers()
        assert values["training.script"] == "src/main.py"
        assert values["training.script_args"] == ("--data", "/data/my set", "-v")
        assert values.get("training.model") is None

    run_wizard(scenario, create_app(output_dir=tmp_path, blink=False))


def test_loaded_arguments_are_shown_back_quoted_and_generated_hides_the_path(tmp_path: Path) -> None:
    raw = {"training.script": "src/main.py", "training.script_args": ["--name", "it's", "a b"]}
    (tmp_path / "ddp-npu" / "src").mkdir(parents=True)
    (tmp_path / "ddp-npu" / "src" / "main.py").write_text("")

    async def scenario(pilot: Pilot[int]) -> None:
        while not (isinstance(pilot.app.screen, StepScreen) and pilot.app.screen.step == "training"):
            await next_step(pilot)
        args = field(pilot, "training.script_args").query_one(Input)
        assert args.value == "--name 'it'\"'\"'s' 'a b'"
        options = field(pilot, "training.script").query_one(OptionList)
        options.focus()
        await pilot.press("home", "enter")
        await pilot.pause()
        assert not field(pilot, "training.script").query_one(".script-path", Input).display
        assert visible(pilot, "training.model") and not visible(pilot, "training.script_args")
        assert pilot.app.state.values["training.script"] is None
        while not isinstance(pilot.app.screen, ReviewScreen):
            await next_step(pilot)

    run_wizard(scenario, create_app(raw, output_dir=tmp_path, blink=False))
