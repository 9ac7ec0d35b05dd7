"""The wizard's key footer: rebuilt when the keys it shows change, never only because the focus moved."""

from __future__ import annotations

import asyncio

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.pilot import Pilot
from textual.widgets import Input
from textual.widgets._footer import FooterKey

from tests.tui_driver import SIZE, next_step, run_wizard, until
from wizard.tui.footer import KeysFooter


class Zoomable(Input):
    """An input with a key of its own in the footer while it has the focus."""

    BINDINGS = [Binding("ctrl+z", "zoom", "Zoom")]

    def action_zoom(self) -> None:
        self.value = "zoomed"


class Page(App[None]):
    BINDINGS = [Binding("ctrl+n", "next", "Next")]

    def compose(self) -> ComposeResult:
        yield Input(id="first")
        yield Input(id="second")
        yield Zoomable(id="zoom")
        yield KeysFooter()

    def action_next(self) -> None:
        pass


def shown(app: App[None]) -> list[str]:
    """The labels of the keys the footer shows."""
    return [key.description for key in app.screen.query(FooterKey)]


def test_moving_between_fields_keeps_the_footer_and_a_field_with_a_key_of_its_own_adds_it() -> None:
    rebuilt: list[tuple[str, ...]] = []

    async def main() -> None:
        app = Page()
        async with app.run_test(size=SIZE) as pilot:
            footer = app.query_one(KeysFooter)
            recompose = footer.recompose

            async def counted() -> None:
                await recompose()
                rebuilt.append(tuple(shown(app)))

            footer.recompose = counted  # type: ignore[method-assign]
            app.query_one("#first").focus()
            await until(pilot, lambda: shown(app) == ["Next", "palette"], "the footer's keys")
            before = len(rebuilt)
            for _ in range(6):  # first, second, first, second...
                await pilot.press("tab") if app.focused is app.query_one("#first") else await pilot.press("shift+tab")
                await pilot.pause()
            assert len(rebuilt) == before, rebuilt  # Textual's own: 12 rebuilds, 2 a move
            app.query_one("#zoom").focus()
            # the whole footer, not one key of it: while it is rebuilt it shows none (a loaded run saw [] here)
            await until(pilot, lambda: shown(app) == ["Zoom", "Next", "palette"], "the zoom key in the footer")
            app.query_one("#second").focus()
            await until(pilot, lambda: shown(app) == ["Next", "palette"], "the zoom key to leave the footer")

    asyncio.run(main())
    assert rebuilt[-2:] == [("Zoom", "Next", "palette"), ("Next", "palette")]


def test_each_step_of_the_wizard_shows_its_keys() -> None:
    seen: list[list[str]] = []

    async def scenario(pilot: Pilot[int]) -> None:
        seen.append(shown(pilot.app))
        await next_step(pilot)
        await until(pilot, lambda: shown(pilot.app), "the next step's footer")
        seen.append(shown(pilot.app))

    run_wizard(scenario)
    assert seen == [["Next", "Back", "Help", "Quit"]] * 2


class Shown(Input):
    BINDINGS = [Binding("ctrl+z", "zoom", "Zoom", key_display="Z1")]


class ShownOtherwise(Input):
    BINDINGS = [Binding("ctrl+z", "zoom", "Zoom", key_display="Z2")]


class TwoDisplays(App[None]):
    def compose(self) -> ComposeResult:
        yield Shown(id="one")
        yield ShownOtherwise(id="two")
        yield KeysFooter()


def test_a_key_shown_otherwise_on_the_next_field_is_shown_so() -> None:
    async def main() -> None:
        app = TwoDisplays()
        async with app.run_test(size=SIZE) as pilot:

            def displays() -> list[str]:
                return [key.key_display for key in app.screen.query(FooterKey) if key.description == "Zoom"]

            app.query_one("#one").focus()
            await until(pilot, lambda: displays() == ["Z1"], "Z1 in the footer")
            app.query_one("#two").focus()
            await until(pilot, lambda: displays() == ["Z2"], "Z2 in the footer", timeout=10)

    asyncio.run(main())
