"""Drive the wizard with keys the way a person does: type into fields, pick options, step on."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from textual import events
from textual.pilot import Pilot
from textual.widgets import Header, Input, OptionList, Static
from textual.widgets._header import HeaderTitle

from wizard.answers.questions import BY_NAME, QUESTIONS, STEPS
from wizard.tui import create_app
from wizard.tui.app import WizardApp
from wizard.tui.fields import Field
from wizard.tui.screens import StepScreen

SIZE = (80, 24)
Scenario = Callable[[Pilot[int]], Awaitable[None]]


def run_wizard(scenario: Scenario, app: WizardApp | None = None) -> WizardApp:
    """Run a scenario against a headless wizard at 80x24; return the app afterwards."""
    app = app or create_app(blink=False)

    async def main() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            await scenario(pilot)
            await until(pilot, lambda: headers_settled(pilot), "the page's header to show its title")

    asyncio.run(main())
    return app


def headers_settled(pilot: Pilot[Any]) -> bool:
    """Whether every header of the current page shows its title already.

    A page's header updates its title in a callback; an app that closes before it runs fails inside Textual
    (NoMatches for HeaderTitle), so a scenario ends only once the title is on show.
    """
    screen = pilot.app.screen
    if not screen.is_mounted:  # a page just pushed has no widgets yet: its header is still to come
        return False
    for header in screen.query(Header):
        titles = header.query(HeaderTitle)
        if not titles or str(titles.first().render()) != str(header.format_title()):
            return False
    return True


async def until(pilot: Pilot[Any], condition: Callable[[], object], what: str, timeout: float = 60.0) -> None:
    """Let the app run until `condition()` holds; fail after `timeout` seconds (a loaded machine is slow)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await pilot.pause(0.05)


def field(pilot: Pilot[int], name: str) -> Field:
    """The field of a question on the current screen."""
    return pilot.app.screen.query_one("#field-" + name.replace(".", "-"), Field)


def shown(pilot: Pilot[int], name: str) -> bool:
    """Whether a question's field shows on the current screen: a step mounts a field only once its question applies."""
    return any(found.display for found in pilot.app.screen.query("#field-" + name.replace(".", "-")).results(Field))


def problem_text(pilot: Pilot[int], name: str) -> str:
    """The problem line shown at a question."""
    return str(field(pilot, name).query_one(".problem", Static).render())


PASTED_FROM = 17
"""A value this long (a path, an argument line) is pasted, as a person pastes it; a shorter one is typed key by key."""


async def type_into(pilot: Pilot[int], entry: Input, text: str) -> None:
    """Focus an input, clear it with keys and type or paste the text, then pause as a person does (the field checks it).

    A paste is the terminal's bracketed paste, delivered to the app as a real terminal delivers it. Typing a long
    value key by key re-draws the page at each key: most of a wizard test's time, for nothing the test asks
    (tests/test_tui_inputs.py types long values key by key on purpose).
    """
    entry.focus()
    if len(text) >= PASTED_FROM:
        await pilot.press("home", "ctrl+k")
        pilot.app.post_message(events.Paste(text))
    else:
        await pilot.press("home", "ctrl+k", *text)
    await pilot.pause()
    owner = next((node for node in entry.ancestors if isinstance(node, Field)), None)
    if owner is not None:  # the pause after typing, without waiting for it
        owner.check_now()
        await pilot.pause()


async def pick(pilot: Pilot[int], name: str, value: str) -> None:
    """Highlight an option with the arrow keys and choose it with Enter."""
    options = field(pilot, name).query_one(OptionList)
    options.focus()
    await pilot.press("home")
    for _ in range(options.option_count):
        if options.highlighted is not None and options.get_option_at_index(options.highlighted).id == value:
            break
        await pilot.press("down")
    await pilot.press("enter")
    await pilot.pause()


async def answer(pilot: Pilot[int], name: str, raw: Any) -> None:
    """Give one question its answer through its widget."""
    question = BY_NAME[name]
    widget = field(pilot, name)
    if question.choices:
        await pick(pilot, name, str(raw))
    elif question.kind == "ip_list" and not question.optional:  # a row per node (an optional list is one line)
        await pilot.pause()
        for entry, ip in zip(widget.query(".row-input").results(Input), raw, strict=True):
            await type_into(pilot, entry, ip)
    else:
        await type_into(pilot, widget.query_one(Input), "" if raw is None else str(raw))


async def answer_all(pilot: Pilot[int], raw: Mapping[str, Any]) -> None:
    """Answer every step's questions that the raw answers name, pressing Next after each step."""
    for step in STEPS:
        screen = pilot.app.screen
        assert isinstance(screen, StepScreen) and screen.step == step, f"expected step {step}, at {screen}"
        for name in [q.name for q in QUESTIONS if q.step == step and q.name in raw]:
            await answer(pilot, name, raw[name])
        await next_step(pilot)


async def next_step(pilot: Pilot[int]) -> None:
    """Press Next and let the new screen settle."""
    await pilot.press("ctrl+n")
    await pilot.pause()


async def render_into(pilot: Pilot[int], output: Path) -> None:
    """On the review page: set the output folder and render, waiting for the render to finish."""
    await type_into(pilot, pilot.app.screen.query_one("#output", Input), str(output))
    await pilot.app.workers.wait_for_complete()
    await pilot.press("ctrl+r")
    await pilot.pause()
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


def snapshot_of(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under root: its bytes and permission bits, by relative path."""
    return {
        path.relative_to(root).as_posix(): (path.read_bytes(), path.stat().st_mode & 0o777)
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }
