"""training.tensorboard: rank 0 of the generated train.py writes loss, lr and throughput for TensorBoard."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import Input, Label, OptionList

from tests.factories import answers, answers_yaml
from tests.runs import RunEnded, events_of, kinds, render_cpu, run_project
from tests.tui_driver import field, next_step, pick, problem_text, run_wizard, shown, type_into, until
from wizard.answers.model import dump, from_context, load_text, resolve, to_context
from wizard.errors import AnswersError
from wizard.render.render import render
from wizard.tui import create_app
from wizard.tui.screens import StepScreen

BASE = {"project_name": "board", "device": "cpu", "nodes": 1, "devices_per_node": 2, "amp": "off"}
TAGS = ("train/loss", "train/lr", "train/samples_per_s")


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


def test_requirements_name_tensorboard_only_when_it_is_on(tmp_path: Path) -> None:
    off = render(answers(), tmp_path / "off").project_dir
    on = render(answers(training__tensorboard=True), tmp_path / "on").project_dir
    assert "tensorboard" not in (off / "requirements.txt").read_text()
    assert "\ntensorboard\n" in (on / "requirements.txt").read_text()
    assert "SummaryWriter" not in (off / "train.py").read_text()
    assert "SummaryWriter(" in (on / "train.py").read_text()


@pytest.mark.slow
@pytest.mark.xdist_group("finished-2x2-run")
def test_rank_0_writes_loss_lr_and_throughput_of_each_logged_step_into_the_run_folder(
    finished_2x2_run: RunEnded,
) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = finished_2x2_run  # tests/conftest.py: npu-wizard run of a 2 x 2 torchrun project, TensorBoard on
    assert run.code == 0, run.stdout + run.stderr
    project, run_dir = run.project, run.run_dir
    (event_file,) = project.rglob("events.out.tfevents.*")  # one writer of the 4 ranks in the whole project: rank 0's
    assert event_file.parent == run_dir / "tensorboard"
    events = events_of(run_dir)
    assert event_file.name.split(".")[-2] == str(kinds(events[0], "started")[-1]["pid"])
    logged = kinds(events[0], "step")
    assert [event["step"] for event in logged] == list(range(4, 33, 4))  # 2 epochs x 16 steps, every 4th

    board = EventAccumulator(str(event_file.parent))
    board.Reload()
    assert set(TAGS) <= set(board.Tags()["scalars"])
    for tag, key in zip(TAGS, ("loss", "lr", "samples_per_s"), strict=True):
        scalars = board.Scalars(tag)
        assert [s.step for s in scalars] == [event["step"] for event in logged], tag
        assert [s.value for s in scalars] == pytest.approx([event[key] for event in logged], rel=1e-6), tag


@pytest.mark.slow
def test_a_run_resumed_from_an_earlier_checkpoint_draws_each_step_once(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    project = render_cpu(tmp_path, "shell", tensorboard=True)  # a checkpoint every 8 steps, logs every 4
    run_dir = tmp_path / "run"
    for code, output in run_project(project, run_dir):
        assert code == 0, output[-3000:]
    (project / "checkpoints" / "step-000000064.pt").unlink()  # as if the job died after logging step 64
    for code, output in run_project(project, run_dir):
        assert code == 0, output[-3000:]
    assert kinds(events_of(run_dir)[0], "started")[-1]["resumed_step"] == 56
    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 2
    last = {event["step"]: event["loss"] for event in kinds(events_of(run_dir)[0], "step")}  # the rerun's win

    board = EventAccumulator(str(run_dir / "tensorboard"))
    board.Reload()
    scalars = board.Scalars("train/loss")
    assert [s.step for s in scalars] == list(range(4, 65, 4))  # 60 and 64 once: the first run's are purged
    assert [s.value for s in scalars] == pytest.approx([last[s.step] for s in scalars], rel=1e-6)


def test_the_training_step_asks_for_tensorboard_and_refuses_it_for_the_users_own_script(tmp_path: Path) -> None:
    (tmp_path / "ddp-npu" / "src").mkdir(parents=True)
    (tmp_path / "ddp-npu" / "src" / "main.py").write_text("")

    async def scenario(pilot: Pilot[int]) -> None:
        while not (isinstance(pilot.app.screen, StepScreen) and pilot.app.screen.step == "training"):
            await next_step(pilot)
        assert shown(pilot, "training.tensorboard")
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
