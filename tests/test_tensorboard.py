"""training.tensorboard: rank 0 of the generated train.py writes loss, lr and throughput for TensorBoard."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import Input, Label, OptionList

from tests.factories import answers, answers_yaml
from tests.tui_driver import field, next_step, pick, problem_text, run_wizard, type_into, until
from wizard.answers.model import dump, from_context, load_text, resolve, to_context
from wizard.errors import AnswersError
from wizard.tui import create_app
from wizard.tui.screens import StepScreen

BASE = {"project_name": "board", "device": "cpu", "nodes": 1, "devices_per_node": 2, "amp": "off"}


def problems_of(raw: dict) -> list[str]:
    """The error lines resolve() reports for BASE updated with `raw`."""
    with pytest.raises(AnswersError) as caught:
        resolve({**BASE, **raw})
    return [str(p) for p in caught.value.problems]


def test_tensorboard_is_off_by_default_and_recorded_in_answers_yaml() -> None:
    plain = answers()
    assert plain["training.tensorboard"] is False
    assert "  tensorboard: false\n" in dump(plain)
    assert to_context(plain)["tensorboard"] == "false"


@pytest.mark.parametrize(("raw", "value"), [(True, True), (False, False), ("true", True), ("No", False)])
def test_tensorboard_takes_yaml_booleans_and_their_words(raw: object, value: bool) -> None:
    assert resolve({**BASE, "training.tensorboard": raw})["training.tensorboard"] is value


def test_a_yes_in_an_answers_file_turns_tensorboard_on_and_survives_the_round_trip() -> None:
    loaded = load_text(answers_yaml({**BASE, "training": {"tensorboard": "yes"}}).replace("'yes'", "yes"))
    assert loaded["training.tensorboard"] is True
    assert "  tensorboard: true\n" in dump(loaded)
    assert load_text(dump(loaded)).values == loaded.values
    assert from_context(to_context(loaded))["training.tensorboard"] is True


@pytest.mark.parametrize("raw", ["maybe", 1, 0, ["true"]])
def test_anything_but_true_or_false_is_refused(raw: object) -> None:
    (line,) = problems_of({"training.tensorboard": raw})
    assert line.startswith("training.tensorboard: ") and "must be true or false" in line


def test_tensorboard_with_the_users_own_script_is_refused_in_one_line() -> None:
    (line,) = problems_of({"training.script": "src/main.py", "training.tensorboard": True})
    assert line == (
        "training.tensorboard: True: TensorBoard logging is a feature of the generated train.py; src/main.py can "
        "write its own with torch.utils.tensorboard.SummaryWriter: set training.tensorboard to false"
    )
    own = resolve({**BASE, "training.script": "src/main.py", "training.tensorboard": False})
    assert own["training.tensorboard"] is False


def test_the_training_step_asks_for_tensorboard_and_refuses_it_for_the_users_own_script(tmp_path: Path) -> None:
    (tmp_path / "ddp-npu" / "src").mkdir(parents=True)
    (tmp_path / "ddp-npu" / "src" / "main.py").write_text("")

    async def scenario(pilot: Pilot[int]) -> None:
        while not (isinstance(pilot.app.screen, StepScreen) and pilot.app.screen.step == "training"):
            await next_step(pilot)
        assert field(pilot, "training.tensorboard").display
        assert str(field(pilot, "training.tensorboard").query_one(".prompt", Label).render()) == "TensorBoard"
        await pick(pilot, "training.tensorboard", "true")
        assert pilot.app.state.values["training.tensorboard"] is True
        scripts = field(pilot, "training.script").query_one(OptionList)
        scripts.focus()
        await pilot.press("home", "down", "enter")  # "Your own"
        await pilot.pause()
        await type_into(pilot, field(pilot, "training.script").query_one(".script-path", Input), "src/main.py")
        assert "can write its own with torch.utils.tensorboard.SummaryWriter" in problem_text(
            pilot, "training.tensorboard"
        )
        assert field(pilot, "training.tensorboard").query_one(OptionList).get_option("true").disabled
        await pick(pilot, "training.tensorboard", "false")
        assert pilot.app.state.values["training.tensorboard"] is False
        assert problem_text(pilot, "training.tensorboard") == ""
        await next_step(pilot)
        await until(pilot, lambda: pilot.app.screen.step != "training", "the step after Training")

    run_wizard(scenario, create_app(output_dir=tmp_path, blink=False))
