"""The wizard's rules as a person meets them: refused Next, disabled options, Back, replacing."""

from __future__ import annotations

from pathlib import Path

from textual.pilot import Pilot
from textual.widgets import Input, OptionList, Static

from tests.factories import answers
from tests.tui_driver import answer, answer_all, field, next_step, pick, problem_text, render_into, run_wizard, shown
from wizard.answers.hardware import BF16_REFUSAL
from wizard.render.render import render
from wizard.tui import create_app
from wizard.tui.review import DoneScreen, ReviewScreen
from wizard.tui.screens import ConfirmScreen, StepScreen


def step_of(pilot: Pilot[int]) -> str:
    """The step the wizard shows now."""
    screen = pilot.app.screen
    assert isinstance(screen, StepScreen), screen
    return screen.step


async def go_to(pilot: Pilot[int], step: str) -> None:
    """Press Next with the defaults until the step shows."""
    while step_of(pilot) != step:
        await next_step(pilot)


async def render_and_confirm(pilot: Pilot[int]) -> None:
    """Ctrl+R on the review, which asks before replacing the folder; answer yes and let the render end."""
    await pilot.press("ctrl+r")
    await pilot.pause()
    assert isinstance(pilot.app.screen, ConfirmScreen)
    await pilot.press("y")
    await pilot.pause()
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


def test_a_count_the_series_refuses_blocks_next_with_the_series_message() -> None:
    async def scenario(pilot: Pilot[int]) -> None:
        await next_step(pilot)
        await pick(pilot, "hardware", "atlas-training")
        await next_step(pilot)
        await answer(pilot, "devices_per_node", 3)
        message = "Atlas training series (Atlas 800 training server) allows 1, 2, 4, 8"
        assert message in problem_text(pilot, "devices_per_node")
        await next_step(pilot)
        assert step_of(pilot) == "topology"
        assert pilot.app.focused is field(pilot, "devices_per_node").query_one(Input)
        await answer(pilot, "devices_per_node", 4)
        assert problem_text(pilot, "devices_per_node") == ""
        await next_step(pilot)
        assert step_of(pilot) == "cluster"

    run_wizard(scenario)


def test_text_that_does_not_parse_shows_the_spec_message_as_you_type() -> None:
    async def scenario(pilot: Pilot[int]) -> None:
        await answer(pilot, "project_name", "My Project")
        assert "must be lowercase letters, digits" in problem_text(pilot, "project_name")
        await next_step(pilot)
        assert step_of(pilot) == "project"
        await answer(pilot, "project_name", "")
        assert "a value is required" in problem_text(pilot, "project_name")
        await answer(pilot, "project_name", "mine")
        await next_step(pilot)
        assert step_of(pilot) == "hardware"

    run_wizard(scenario)


def test_cross_field_rules_show_at_their_field_and_block_next() -> None:
    async def scenario(pilot: Pilot[int]) -> None:
        await go_to(pilot, "topology")
        await answer(pilot, "network.master_port", 60005)
        assert "inside the HCCL port range 60000-60031" in problem_text(pilot, "network.master_port")
        await answer(pilot, "nodes", 2)
        await answer(pilot, "network.host_ips", ["10.0.0.1", "10.0.0.1"])
        assert "each node needs its own address; repeated: 10.0.0.1" in problem_text(pilot, "network.host_ips")
        await next_step(pilot)
        assert step_of(pilot) == "topology"

    run_wizard(scenario)


def test_the_host_ip_rows_follow_the_node_count() -> None:
    async def scenario(pilot: Pilot[int]) -> None:
        await go_to(pilot, "topology")
        rows = lambda: [i.value for i in field(pilot, "network.host_ips").query(".row-input").results(Input)]  # noqa: E731
        assert rows() == ["127.0.0.1"]
        await answer(pilot, "nodes", 3)
        assert rows() == ["127.0.0.1"] * 3
        await answer(pilot, "network.host_ips", ["10.0.0.1", "10.0.0.2", "10.0.0.3"])
        await answer(pilot, "nodes", 4)
        await pilot.pause()
        assert rows() == ["10.0.0.1", "10.0.0.2", "10.0.0.3", ""]
        assert "not an IPv4 or IPv6 address" in problem_text(pilot, "network.host_ips")
        await answer(pilot, "nodes", 2)
        await pilot.pause()
        assert rows() == ["10.0.0.1", "10.0.0.2"]
        assert pilot.app.state.values["network.host_ips"] == ("10.0.0.1", "10.0.0.2")
        assert field(pilot, "network.master_addr").query_one(Input).value == "10.0.0.1"

    run_wizard(scenario)


def test_bf16_is_shown_disabled_with_the_reason_and_cannot_be_chosen() -> None:
    async def scenario(pilot: Pilot[int]) -> None:
        await next_step(pilot)
        await pick(pilot, "hardware", "atlas-training")
        await go_to(pilot, "precision")
        options = field(pilot, "amp").query_one(OptionList)
        bf16 = options.get_option("bf16")
        assert bf16.disabled
        assert BF16_REFUSAL in str(options.get_option_at_index(2).prompt.columns[1]._cells[0])
        options.focus()
        await pilot.press("home")
        for _ in range(4):
            await pilot.press("down")
            assert options.highlighted != 2
        await pilot.press("end", "enter")
        await pilot.pause()
        assert pilot.app.state.values["amp"] == "fp16"
        row = next(y for y, (index, line) in enumerate(options._lines) if index == 2 and line == 0)
        await pilot.click(options, offset=(6, row + 1 - int(options.scroll_y)))
        await pilot.pause()
        assert pilot.app.state.values["amp"] == "fp16"
        assert "amp" not in pilot.app.state.raw or pilot.app.state.raw["amp"] != "bf16"

    run_wizard(scenario)


def test_back_and_forward_keep_what_was_entered() -> None:
    async def scenario(pilot: Pilot[int]) -> None:
        await answer(pilot, "project_name", "kept")
        await next_step(pilot)
        await pick(pilot, "hardware", "atlas-a3")
        await next_step(pilot)
        await answer(pilot, "nodes", 2)
        await answer(pilot, "network.host_ips", ["10.1.0.1", "10.1.0.2"])
        await pilot.press("escape")
        await pilot.pause()
        assert step_of(pilot) == "hardware"
        assert field(pilot, "hardware").query_one(OptionList).get_option("atlas-a3").id == "atlas-a3"
        await pilot.press("escape")
        await pilot.pause()
        assert field(pilot, "project_name").query_one(Input).value == "kept"
        await next_step(pilot)
        await next_step(pilot)
        assert field(pilot, "nodes").query_one(Input).value == "2"
        rows = [i.value for i in field(pilot, "network.host_ips").query(".row-input").results(Input)]
        assert rows == ["10.1.0.1", "10.1.0.2"]
        assert field(pilot, "devices_per_node").query_one(Input).value == "8"
        assert pilot.app.state.values["hardware"] == "atlas-a3"

    run_wizard(scenario)


def test_replacing_an_existing_project_needs_confirmation_and_keeps_the_users_files(tmp_path: Path) -> None:
    target = render(answers(project_name="ddp-npu"), tmp_path).project_dir  # an earlier render of the project
    (target / "mine.txt").write_text("keep me")
    (target / "launch" / "run-node.sh").write_text("edited")

    async def scenario(pilot: Pilot[int]) -> None:
        await answer_all(pilot, {"device": "cpu"})
        await render_into(pilot, tmp_path)
        assert isinstance(pilot.app.screen, ConfirmScreen)
        await pilot.press("n")
        await pilot.pause()
        assert isinstance(pilot.app.screen, ReviewScreen)
        assert (target / "launch" / "run-node.sh").read_text() == "edited"
        await render_and_confirm(pilot)
        assert isinstance(pilot.app.screen, DoneScreen)

    run_wizard(scenario)
    assert (target / "mine.txt").read_text() == "keep me"  # --force's rule: the user's files move over
    assert (target / "launch" / "run-node.sh").read_text() != "edited"


def test_replacing_a_folder_that_is_no_project_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    target = tmp_path / "ddp-npu"
    target.mkdir()
    (target / "mine.txt").write_text("keep me")

    async def scenario(pilot: Pilot[int]) -> None:
        await answer_all(pilot, {"device": "cpu"})
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        files = str(pilot.app.screen.query_one("#files", Static).render())
        assert "launch/" in files and "node0.sh" in files  # the preview lists the files all the same
        await render_and_confirm(pilot)
        assert isinstance(pilot.app.screen, ReviewScreen)

    run_wizard(scenario, create_app(blink=False, output_dir=tmp_path))
    assert [path.name for path in target.iterdir()] == ["mine.txt"]
    assert (target / "mine.txt").read_text() == "keep me"


def test_the_review_refuses_to_render_while_an_error_remains(tmp_path: Path) -> None:
    async def scenario(pilot: Pilot[int]) -> None:
        await answer_all(pilot, {})
        assert isinstance(pilot.app.screen, ReviewScreen)
        pilot.app.state.set("network.master_port", "60001")
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert isinstance(pilot.app.screen, ReviewScreen)

    run_wizard(scenario)
    assert list(tmp_path.iterdir()) == []


def test_the_mouse_picks_an_option_and_the_help_follows_the_focus() -> None:
    async def scenario(pilot: Pilot[int]) -> None:
        await next_step(pilot)
        options = field(pilot, "hardware").query_one(OptionList)
        row = next(y for y, (index, line) in enumerate(options._lines) if index == 2 and line == 0)
        await pilot.click(options, offset=(6, row + 1 - int(options.scroll_y)))
        await pilot.pause()
        assert pilot.app.state.values["hardware"] == "atlas-a3"
        help_panel = pilot.app.screen.query_one("#help")
        assert "Where the ranks run." in str(help_panel.render())
        await pilot.press("f1")
        assert not help_panel.display
        await pilot.press("f1")
        assert help_panel.display

    run_wizard(scenario)


def test_a_pasted_range_answers_every_node_at_once() -> None:
    async def scenario(pilot: Pilot[int]) -> None:
        await go_to(pilot, "topology")
        await answer(pilot, "nodes", 64)
        await pilot.pause()
        from tests.tui_driver import type_into

        paste = field(pilot, "network.host_ips").query_one(".paste-input", Input)
        await type_into(pilot, paste, "10.0.0.11-10.0.0.74")
        await answer(pilot, "network.master_addr", "10.0.0.11")
        await pilot.pause()
        assert pilot.app.state.values["network.host_ips"] == tuple(f"10.0.0.{n}" for n in range(11, 75))
        assert problem_text(pilot, "network.host_ips") == ""
        rows = [i.value for i in field(pilot, "network.host_ips").query(".row-input").results(Input)]
        assert rows == [f"10.0.0.{n}" for n in range(11, 75)]

    run_wizard(scenario)


def test_a_hostfile_path_stands_in_for_the_host_ip_rows(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("10.0.0.11 slots=8\n10.0.0.12 slots=8\n10.0.0.13 slots=8\n")

    async def scenario(pilot: Pilot[int]) -> None:
        await go_to(pilot, "topology")
        await answer(pilot, "nodes", 3)
        await answer(pilot, "network.host_ips", ["10.0.0.1", "10.0.0.2", "10.0.0.3"])
        await answer(pilot, "network.hostfile", str(hosts))
        await answer(pilot, "network.master_addr", "10.0.0.11")
        await pilot.pause()
        assert not shown(pilot, "network.host_ips")
        assert pilot.app.state.values["network.host_ips"] == ("10.0.0.11", "10.0.0.12", "10.0.0.13")
        assert "network.host_ips" not in pilot.app.state.raw
        assert problem_text(pilot, "network.hostfile") == ""

    run_wizard(scenario)
