"""The wizard renders into the user's own repository (as --into), and --edit of such a folder updates it there."""

from __future__ import annotations

import subprocess
from pathlib import Path

from textual.pilot import Pilot
from textual.widgets import Checkbox, Input, Static

from tests.tui_driver import answer_all, render_into, run_wizard, snapshot_of, type_into, until
from wizard.answers.model import resolve
from wizard.answers.source import answers_to_edit
from wizard.render.into import render_into as cli_render_into
from wizard.tui import create_app
from wizard.tui.review import DoneScreen, ReviewScreen

USER_FILES = {
    "README.md": "# my model\n",
    "requirements.txt": "numpy\n",
    "mytrain.py": "print('my own loop')\n",
}
RAW = {"project_name": "mine", "device": "cpu", "nodes": 1, "devices_per_node": 2, "amp": "off"}


def user_repo(root: Path, files: dict[str, str]) -> Path:
    """A git repository holding `files`, committed."""
    repo = root / "repo"
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    author = ["-c", "user.name=Test", "-c", "user.email=test@example.com", "-c", "commit.gpgsign=false"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "mine"]):
        subprocess.run(["git", *author, *args], cwd=repo, check=True, capture_output=True)
    return repo


async def tick_into(pilot: Pilot[int]) -> None:
    """On the review page: tick 'Into this folder'."""
    box = pilot.app.screen.query_one("#into", Checkbox)
    box.focus()
    await pilot.press("space")
    await pilot.pause()
    assert box.value


def test_the_wizard_renders_into_my_repository_like_into_and_leaves_my_files(tmp_path: Path) -> None:
    repo = user_repo(tmp_path, USER_FILES)
    before = snapshot_of(repo / ".git")

    async def scenario(pilot: Pilot[int]) -> None:
        await answer_all(pilot, {})
        assert isinstance(pilot.app.screen, ReviewScreen)
        await tick_into(pilot)
        await render_into(pilot, repo)
        await until(pilot, lambda: isinstance(pilot.app.screen, DoneScreen), "the done page")
        headline = pilot.app.screen.query_one("#done").query(Static).first().render()
        assert str(headline).startswith(f"Added npu-wizard's files to {repo / 'npu'} ")
        await pilot.app.workers.wait_for_complete()

    run_wizard(scenario, create_app(RAW, blink=False))
    assert not (repo / "mine").exists()
    assert {name: (repo / name).read_text() for name in USER_FILES} == USER_FILES
    project = repo / "npu"  # the default folder, as --into REPO
    assert (project / ".npu-wizard" / "into").is_file() and (project / "NPU-WIZARD.md").is_file()
    assert (project / "launch" / "node0.sh").is_file()
    assert (project / ".npu-wizard" / "repository").read_text() == "npu\n"
    # the very files --into writes from the same answers
    cli = user_repo(tmp_path / "cli", USER_FILES)
    cli_render_into(resolve(RAW), cli, subfolder="npu")
    ours = {name for name in snapshot_of(cli) if not name.startswith(".git/")}
    assert {name for name in snapshot_of(repo) if not name.startswith(".git/")} == ours
    assert snapshot_of(repo / ".git") == before


def test_the_wizard_refuses_into_a_folder_with_my_launch_script_and_writes_nothing(tmp_path: Path) -> None:
    repo = user_repo(tmp_path, {**USER_FILES, "npu/launch/run-node.sh": "#!/bin/sh\necho mine\n"})
    before = snapshot_of(repo)

    async def scenario(pilot: Pilot[int]) -> None:
        await answer_all(pilot, {})
        await type_into(pilot, pilot.app.screen.query_one("#output", Input), str(repo))
        await tick_into(pilot)
        target = pilot.app.screen.query_one("#target", Static)
        await until(pilot, lambda: "launch/run-node.sh" in str(target.render()), "the clash named on the page")
        assert "npu-wizard never overwrites a file it did not generate" in str(target.render())
        await pilot.press("ctrl+r")
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        assert isinstance(pilot.app.screen, ReviewScreen)

    run_wizard(scenario, create_app(RAW, blink=False))
    assert snapshot_of(repo) == before


def test_editing_a_folder_rendered_into_updates_it_there(tmp_path: Path) -> None:
    repo = user_repo(tmp_path, USER_FILES)
    cli_render_into(resolve(RAW), repo)
    raw, problems, source = answers_to_edit(str(repo / "answers.yaml"))
    app = create_app(raw, tmp_path / "elsewhere", file_problems=problems, answers_path=source, blink=False)

    async def scenario(pilot: Pilot[int]) -> None:
        await answer_all(pilot, {"devices_per_node": 4})
        assert pilot.app.screen.query_one("#into", Checkbox).value
        assert "updates" in str(pilot.app.screen.query_one("#target", Static).render())
        await pilot.press("ctrl+r")
        await until(pilot, lambda: isinstance(pilot.app.screen, DoneScreen), "the done page")
        assert pilot.app.screen.headline.startswith(f"Updated {repo}: ")
        await pilot.app.workers.wait_for_complete()

    run_wizard(scenario, app)
    assert "devices_per_node: 4\n" in (repo / "answers.yaml").read_text()
    assert not (repo / "mine").exists() and not (tmp_path / "elsewhere").exists()
    assert {name: (repo / name).read_text() for name in USER_FILES} == USER_FILES
