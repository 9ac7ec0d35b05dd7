"""`npu-wizard --answers FILE --edit`: a file, even one with problems, opens pre-filled."""

from __future__ import annotations

from pathlib import Path

from wizard.answers.source import answers_to_edit
from wizard.cli import main
from wizard.tui.state import WizardState


def test_a_file_with_problems_opens_with_every_problem_at_its_field(tmp_path: Path) -> None:
    path = tmp_path / "a.yaml"
    path.write_text("schema: 1\nhardware: atlas-training\namp: bf16\nepochz: 3\n")
    raw, problems, source = answers_to_edit(str(path))
    assert raw == {"hardware": "atlas-training", "amp": "bf16"}
    assert [(p.field, p.message) for p in problems] == [("epochz", "unknown key; did you mean 'training.epochs'?")]
    assert source == path
    state = WizardState(raw, problems)
    assert "bf16" in str(state.problems_at("amp")[0])
    assert next(c for c in state.choices("amp") if c.choice.value == "bf16").refusal is not None


def test_edit_needs_a_file_not_stdin(capsys) -> None:  # noqa: ANN001
    assert main(["--answers", "-", "--edit"]) == 1
    assert "--edit needs an answers file" in capsys.readouterr().err


def test_edit_of_a_missing_file_says_so(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    assert main(["--answers", str(tmp_path / "nope.yaml"), "--edit"]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_editing_a_rendered_project_ends_in_an_update_that_keeps_my_edits(tmp_path: Path) -> None:
    from textual.pilot import Pilot

    from tests.test_update import USER_MODEL, project_raw, render_project, replace_build_model
    from tests.tui_driver import answer_all, render_into, run_wizard
    from wizard.tui import create_app
    from wizard.tui.review import DoneScreen

    project = render_project(tmp_path, project_raw(2))
    (project / "train.py").write_text(replace_build_model((project / "train.py").read_text()))
    raw, problems, source = answers_to_edit(str(project / "answers.yaml"))
    app = create_app(raw, tmp_path, file_problems=problems, answers_path=source, blink=False)

    async def scenario(pilot: Pilot[int]) -> None:
        await answer_all(pilot, {"nodes": 4})
        await render_into(pilot, tmp_path)
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        assert isinstance(pilot.app.screen, DoneScreen)
        assert pilot.app.screen.headline == f"Updated {project}: 8 file(s) changed, your edits kept."

    run_wizard(scenario, app)
    assert (project / "launch" / "node3.sh").is_file()
    train = (project / "train.py").read_text()
    assert USER_MODEL in train and "NODES = 4\n" in train
    assert "nodes: 4\n" in (project / "answers.yaml").read_text()
