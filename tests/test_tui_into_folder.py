"""The wizard's folder inside the repository (as --into REPO --folder NAME): shown on the review page when rendering
into the repository, `npu` by default, changed there, used by the preview and the render; --edit of such a
project updates it in its folder."""

from __future__ import annotations

from pathlib import Path

from textual.pilot import Pilot
from textual.widgets import Checkbox, Input, Static

from tests.test_tui_into import RAW, USER_FILES, tick_into, user_repo
from tests.tui_driver import answer_all, render_into, run_wizard, snapshot_of, type_into, until
from wizard.answers.model import resolve
from wizard.answers.source import answers_to_edit
from wizard.render.into import render_into as cli_render_into
from wizard.tui import create_app
from wizard.tui.review import DoneScreen, ReviewScreen
from wizard.tui.screens import StepScreen


def shown(pilot: Pilot[int], widget: str) -> str:
    """The text of the review page's Static `widget`."""
    return str(pilot.app.screen.query_one(f"#{widget}", Static).render())


def test_the_review_page_shows_the_folder_only_into_a_repository_and_renders_into_the_one_typed(
    tmp_path: Path,
) -> None:
    repo = user_repo(tmp_path, USER_FILES)

    async def scenario(pilot: Pilot[int]) -> None:
        await answer_all(pilot, {})
        assert isinstance(pilot.app.screen, ReviewScreen)
        row = pilot.app.screen.query_one("#folder-row")
        assert not row.display  # a new project folder: no folder to choose
        await type_into(pilot, pilot.app.screen.query_one("#output", Input), str(repo))
        await tick_into(pilot)
        assert row.display
        folder = pilot.app.screen.query_one("#folder", Input)
        assert folder.value == "npu"
        await until(pilot, lambda: shown(pilot, "files").startswith("npu/\n"), "the preview of npu/")
        await type_into(pilot, folder, "tools/npu")
        await until(
            pilot,
            lambda: f"adds npu-wizard's files to {repo / 'tools' / 'npu'}" in shown(pilot, "target"),
            "tools/npu as the target",
        )
        await until(pilot, lambda: shown(pilot, "files").startswith("tools/npu/\n"), "the preview of tools/npu/")
        await pilot.app.workers.wait_for_complete()
        await pilot.press("ctrl+r")
        await until(pilot, lambda: isinstance(pilot.app.screen, DoneScreen), "the done page")
        assert f"npu-wizard run {repo / 'tools' / 'npu'}" in shown(pilot, "next")
        await pilot.app.workers.wait_for_complete()

    run_wizard(scenario, create_app(RAW, blink=False))
    project = repo / "tools" / "npu"
    assert (project / ".npu-wizard" / "repository").read_text() == "tools/npu\n"
    assert not (repo / "npu").exists() and not (repo / "launch").exists()
    assert {name: (repo / name).read_text() for name in USER_FILES} == USER_FILES
    cli = user_repo(tmp_path / "cli", USER_FILES)  # the very files --into --folder tools/npu writes
    cli_render_into(resolve(RAW), cli, subfolder="tools/npu")
    assert {name for name in snapshot_of(repo) if not name.startswith(".git/")} == {
        name for name in snapshot_of(cli) if not name.startswith(".git/")
    }


def test_a_folder_outside_the_repository_or_none_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    repo = user_repo(tmp_path, USER_FILES)
    before = snapshot_of(tmp_path)

    async def scenario(pilot: Pilot[int]) -> None:
        await answer_all(pilot, {})
        await type_into(pilot, pilot.app.screen.query_one("#output", Input), str(repo))
        await tick_into(pilot)
        folder = pilot.app.screen.query_one("#folder", Input)
        for typed, said in (("../out", "name a folder inside the repository"), ("", "name the project's folder")):
            await type_into(pilot, folder, typed)
            await until(pilot, lambda said=said: said in shown(pilot, "target"), f"the refusal of {typed!r}")
            await pilot.pause(0.6)
            assert said in shown(pilot, "files")  # the preview says why too, after the pause
            await pilot.press("ctrl+r")
            await pilot.app.workers.wait_for_complete()
            await pilot.pause()
            assert isinstance(pilot.app.screen, ReviewScreen)

    run_wizard(scenario, create_app(RAW, blink=False))
    assert snapshot_of(tmp_path) == before


def test_the_folder_dot_renders_the_older_layout(tmp_path: Path) -> None:
    repo = user_repo(tmp_path, USER_FILES)

    async def scenario(pilot: Pilot[int]) -> None:
        await answer_all(pilot, {})
        await type_into(pilot, pilot.app.screen.query_one("#output", Input), str(repo))
        await tick_into(pilot)
        await type_into(pilot, pilot.app.screen.query_one("#folder", Input), ".")
        await render_into(pilot, repo)
        await until(pilot, lambda: isinstance(pilot.app.screen, DoneScreen), "the done page")
        await pilot.app.workers.wait_for_complete()

    run_wizard(scenario, create_app(RAW, blink=False))
    assert (repo / "NPU-WIZARD.md").is_file() and (repo / ".npu-wizard" / "repository").read_text() == ".\n"


def test_started_in_a_repository_the_wizard_renders_into_its_npu_folder(tmp_path: Path) -> None:
    repo = user_repo(tmp_path, {**USER_FILES, "mytrain.py": "import torch.distributed\n"})

    async def scenario(pilot: Pilot[int]) -> None:
        await pilot.press("enter")  # "Into this repository"
        await until(pilot, lambda: isinstance(pilot.app.screen, StepScreen), "the Project step")
        await answer_all(pilot, {"device": "cpu"})
        assert pilot.app.screen.query_one("#into", Checkbox).value
        assert pilot.app.screen.query_one("#folder", Input).value == "npu"
        await pilot.app.workers.wait_for_complete()
        await pilot.press("ctrl+r")
        await until(pilot, lambda: isinstance(pilot.app.screen, DoneScreen), "the done page")
        await pilot.app.workers.wait_for_complete()

    run_wizard(scenario, create_app(blink=False, repository=repo))
    assert (repo / "npu" / ".npu-wizard" / "repository").read_text() == "npu\n"


def test_editing_a_project_in_a_folder_of_a_repository_updates_it_there(tmp_path: Path) -> None:
    repo = user_repo(tmp_path, USER_FILES)
    cli_render_into(resolve(RAW), repo, subfolder="npu")
    project = repo / "npu"
    raw, problems, source = answers_to_edit(str(project / "answers.yaml"))
    app = create_app(raw, tmp_path / "elsewhere", file_problems=problems, answers_path=source, blink=False)

    async def scenario(pilot: Pilot[int]) -> None:
        await answer_all(pilot, {"devices_per_node": 4})
        assert pilot.app.screen.query_one("#into", Checkbox).value
        assert pilot.app.screen.query_one("#folder", Input).value == "npu"
        assert f"updates (a three-way merge that keeps your edits) {project}" in shown(pilot, "target")
        await pilot.press("ctrl+r")
        await until(pilot, lambda: isinstance(pilot.app.screen, DoneScreen), "the done page")
        assert pilot.app.screen.headline.startswith(f"Updated {project}: ")
        await pilot.app.workers.wait_for_complete()

    run_wizard(scenario, app)
    assert "devices_per_node: 4\n" in (project / "answers.yaml").read_text()
    assert not (repo / "answers.yaml").exists() and not (tmp_path / "elsewhere").exists()
    assert (project / ".npu-wizard" / "repository").read_text() == "npu\n"
    assert {name: (repo / name).read_text() for name in USER_FILES} == USER_FILES
