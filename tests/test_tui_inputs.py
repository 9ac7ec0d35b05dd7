"""Inputs as a person types into them: focus selects the text, and the checks wait for a pause in the typing."""

from __future__ import annotations

from textual import events
from textual.pilot import Pilot
from textual.widgets import Input

from tests.tui_driver import field, problem_text, run_wizard, until


def project_name_input(pilot: Pilot[int]) -> Input:
    """The Project step's name input."""
    return field(pilot, "project_name").query_one(Input)


def test_typing_into_a_focused_field_replaces_its_default() -> None:
    async def scenario(pilot: Pilot[int]) -> None:
        entry = project_name_input(pilot)
        assert pilot.app.focused is entry and entry.value == "ddp-npu"
        await pilot.press(*"mine")
        assert entry.value == "mine"

    run_wizard(scenario)


def test_a_long_line_typed_key_by_key_is_checked_after_the_pause_not_per_key() -> None:
    checks: list[object] = []

    async def scenario(pilot: Pilot[int]) -> None:
        state = pilot.app.state
        refresh = state.refresh

        def counted() -> None:
            checks.append(None)
            refresh()

        state.refresh = counted  # type: ignore[method-assign]
        entry = project_name_input(pilot)
        for key in "x" * 500:  # as a terminal without bracketed paste delivers a pasted line: key after key
            entry.post_message(events.Key(key, key))
        await until(pilot, lambda: entry.value == "x" * 500, "the 500 keys")
        await pilot.pause(0.5)
        assert 1 <= len(checks) < 10, f"{len(checks)} checks for 500 keys"
        assert state.raw["project_name"] == "x" * 500
        assert "at most 64" in problem_text(pilot, "project_name")

    run_wizard(scenario)


def test_next_checks_what_was_just_typed_without_waiting_for_the_pause() -> None:
    async def scenario(pilot: Pilot[int]) -> None:
        await pilot.press(*"Bad Name", "ctrl+n")
        await pilot.pause()
        assert pilot.app.screen.step == "project"
        assert pilot.app.state.raw["project_name"] == "Bad Name"
        assert problem_text(pilot, "project_name").startswith("x ")

    run_wizard(scenario)
