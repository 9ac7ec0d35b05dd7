"""The thin adapter from a spec Question to a widget: text, choice, or one address per node."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.events import DescendantFocus
from textual.message import Message
from textual.timer import Timer
from textual.widgets import Input, Label, OptionList, Static
from textual.widgets.option_list import Option

from wizard.answers.script import is_foreign
from wizard.answers.spec import Question
from wizard.tui.repository import scripts_in
from wizard.tui.state import WizardState, as_rows, as_text

MAX_ROWS = 256
# Typing is checked after this pause (and at once on leaving the field or pressing Next): checking every
# answer per key made a pasted argument line take half a minute.
CHECK_AFTER_S = 0.3
PASTE_HINT = "or paste them all: addresses or ranges (10.0.0.11-10.0.0.74), or give a hostfile"


class Field(Vertical):
    """One question: its prompt, its input and the shared checks' verdict."""

    class Edited(Message):
        """The person changed a question's raw answer."""

        def __init__(self, name: str, raw: Any) -> None:
            self.name = name
            self.raw = raw
            super().__init__()

    class Focused(Message):
        """A question got the focus; its help should show."""

        def __init__(self, question: Question) -> None:
            self.question = question
            super().__init__()

    def __init__(self, question: Question, state: WizardState, *, blink: bool = True) -> None:
        super().__init__(id="field-" + question.name.replace(".", "-"), classes="field")
        self.question = question
        self.state = state
        self.blink = blink
        self._pending: tuple[Any] | None = None  # typed, not yet checked: (raw,)
        self._check_timer: Timer | None = None

    def compose(self) -> ComposeResult:
        """The prompt, the input widget and the problem line."""
        yield Label(self.question.prompt, classes="prompt")
        yield from self.compose_input()
        yield Static("", classes="problem")

    def compose_input(self) -> ComposeResult:
        """The widget that takes the answer; each kind of field yields its own."""
        raise NotImplementedError

    def on_mount(self) -> None:
        """Show the current answer once the widgets exist."""
        self.show()

    def show(self) -> None:
        """Bring the field in line with the state: value, visibility, problems."""
        self.display = self.state.applies(self.question.name) and not self.state.replaced(self.question.name)
        self.show_value()
        problems = self.state.problems_at(self.question.name)
        line = self.query_one(".problem", Static)
        line.set_classes("problem " + (problems[0].severity if problems else "none"))
        mark = {"error": "x ", "warning": "! "}
        line.update(Text("\n".join(mark[p.severity] + p.message for p in problems)))

    def show_value(self) -> None:
        """Show the entered answer, or the default while nothing was entered."""

    def edited(self, raw: Any) -> None:
        """Tell the screen the person changed the answer."""
        self.take_pending()
        self.post_message(self.Edited(self.question.name, raw))

    def typed_later(self, raw: Any) -> None:
        """Tell the screen of typed text once the typing pauses (or the field is left)."""
        self._pending = (raw,)
        if self._check_timer is not None:
            self._check_timer.stop()
        self._check_timer = self.set_timer(CHECK_AFTER_S, self.check_now)

    def take_pending(self) -> tuple[Any] | None:
        """The typed answer not yet told to the screen, as (raw,), and forget it; None when there is none."""
        pending, self._pending = self._pending, None
        if self._check_timer is not None:
            self._check_timer.stop()
            self._check_timer = None
        return pending

    def check_now(self) -> None:
        """Tell the screen of typed text now: the typing paused or the field was left."""
        pending = self.take_pending()
        if pending is not None:
            self.post_message(self.Edited(self.question.name, pending[0]))

    @on(Input.Blurred)
    def left(self, event: Input.Blurred) -> None:
        """Leaving an input checks what was typed in it at once."""
        self.check_now()

    def on_descendant_focus(self, event: DescendantFocus) -> None:
        """Ask for this question's help to be shown."""
        self.post_message(self.Focused(self.question))


class TextField(Field):
    """A question answered by typing: numbers, names, paths, versions."""

    def compose_input(self) -> ComposeResult:
        """One text input."""
        yield Input(placeholder=self.question.allowed(), classes="answer")

    def show_value(self) -> None:
        """Fill the input once, then follow the default only while nothing was typed."""
        name = self.question.name
        entry = self.query_one(Input)
        entry.cursor_blink = self.blink
        # Once typed in, the input holds the answer: resetting it from the state would drop
        # keys typed while earlier changes were being checked.
        if (name in self.state.raw or self._pending is not None) and getattr(self, "_filled", False):
            return
        self._filled = True
        with entry.prevent(Input.Changed):
            entry.value = as_text(self.question, self.state.shown(name))

    @on(Input.Changed)
    def typed(self, event: Input.Changed) -> None:
        """Record what was typed, once the typing pauses."""
        event.stop()
        self.typed_later(event.value)


class ChoiceField(Field):
    """A question answered by picking one option; options the checks refuse are disabled."""

    def compose_input(self) -> ComposeResult:
        """A list of the options."""
        yield OptionList(classes="answer")

    def show_value(self) -> None:
        """Rebuild the options when what they say has changed."""
        options = self.query_one(OptionList)
        chosen = as_text(self.question, self.state.shown(self.question.name))
        states = self.state.choices(self.question.name)
        key = (chosen, tuple(states))
        if getattr(self, "_shown_key", None) == key:
            return
        self._shown_key = key
        highlighted = options.highlighted
        options.clear_options()
        options.add_options(
            Option(
                _option_text(s.choice.label, s.choice.help, s.choice.value == chosen, s.refusal, s.note),
                id=s.choice.value,
                disabled=s.refusal is not None,
            )
            for s in states
        )
        values = [s.choice.value for s in states]
        if highlighted is None and chosen in values and states[values.index(chosen)].refusal is None:
            highlighted = values.index(chosen)
        options.highlighted = highlighted

    @on(OptionList.OptionSelected)
    def picked(self, event: OptionList.OptionSelected) -> None:
        """Record the picked option and move on to the next field."""
        event.stop()
        self.edited(event.option.id)
        self.screen.focus_next()


def _option_text(label: str, help: str, chosen: bool, refusal: str | None, note: str | None) -> Table:
    body = Text(label, style="bold" if chosen else "")
    if help:
        body.append("\n" + help, style="dim" if refusal else "")
    if refusal:
        body.append("\nnot available: " + refusal.removeprefix("refused: "), style="italic")
    elif note:
        body.append("\nnote: " + note, style="italic")
    grid = Table.grid()
    grid.add_column(width=4, no_wrap=True)
    grid.add_column(ratio=1)
    grid.add_row(Text("(*)" if chosen else "( )", style="bold" if chosen else ""), body)
    return grid


class ListField(Field):
    """A list question with one row per node: it grows and shrinks with the node count."""

    def compose_input(self) -> ComposeResult:
        """A box to paste a whole list into, and the rows' container (rows are added in show_value)."""
        paste = Input(placeholder=PASTE_HINT, compact=True, classes="answer paste-input")
        paste.cursor_blink = self.blink
        yield paste
        yield Vertical(classes="rows")

    def show_value(self) -> None:
        """Show one row per node, keeping rows typed earlier."""
        name = self.question.name
        pasted = isinstance(self.state.raw.get(name), str)
        # a pasted list shows as the addresses it stands for, once it parses
        rows = (
            list(self.state.values[name]) if pasted and name in self.state.values else as_rows(self.state.shown(name))
        )
        count = self.state.values.get("nodes") or len(self.query(".row")) or len(rows) or 1
        count = min(count, MAX_ROWS)
        container = self.query_one(".rows", Vertical)
        existing = list(self.query(".row").results(Horizontal))
        for row in existing[count:]:
            row.remove()
        for index in range(len(existing), count):
            entry = Input(placeholder="IP address", compact=True, classes="answer row-input")
            entry.cursor_blink = self.blink
            container.mount(Horizontal(Label(f"node {index}", classes="row-label"), entry, classes="row"))
            with entry.prevent(Input.Changed):
                entry.value = rows[index] if index < len(rows) else self._new_row(rows)
        if (name not in self.state.raw or pasted) and self._pending is None:  # never drop rows being typed
            for index, row in enumerate(existing[:count]):
                entry = row.query_one(Input)
                with entry.prevent(Input.Changed):
                    entry.value = rows[index] if index < len(rows) else ""
        elif len(existing) != count and existing and not pasted:
            self.call_after_refresh(self._report)  # a pasted list stays as pasted: rows show at most MAX_ROWS

    def _new_row(self, rows: list[str]) -> str:
        """A new node's row: loopback while every node is simulated here, else empty to fill in."""
        return "127.0.0.1" if rows and all(r == "127.0.0.1" for r in rows) else ""

    def _report(self) -> None:
        """Record the rows as the answer."""
        self.edited(tuple(entry.value.strip() for entry in self.query(".row-input").results(Input)))

    @on(Input.Changed)
    def typed(self, event: Input.Changed) -> None:
        """Record a pasted list as it is, or the rows after any of them changed."""
        event.stop()
        if event.input.has_class("paste-input"):
            if event.value.strip():
                self.typed_later(event.value)
            return
        self.typed_later(tuple(entry.value.strip() for entry in self.query(".row-input").results(Input)))


class ScriptField(Field):
    """training.script: the generated train.py or the user's own file, then its path (suggested from the folder)."""

    ASK = "Generated model script or your own?"
    GENERATED, OWN = "generated", "own"
    MAX_SUGGESTIONS = 50

    def compose(self) -> ComposeResult:
        """The either-or question, the path of the user's script (shown for "your own") and the problem line."""
        where = "in this repository" if self.state.into else "inside the project folder"
        yield Label(self.ASK, classes="prompt")
        yield OptionList(
            Option("Generated: npu-wizard writes train.py (model and dataset asked next)", id=self.GENERATED),
            Option(f"Your own: a .py file {where}", id=self.OWN),
            classes="answer script-choice",
        )
        relative = "the repository" if self.state.into else "the project folder"
        yield Label(f"{self.question.prompt} (relative to {relative})", classes="prompt script-path-label")
        yield Input(placeholder="e.g. src/main.py", classes="answer script-path")
        yield OptionList(classes="script-suggestions")
        yield Static("", classes="problem")

    def on_mount(self) -> None:
        """Offer the folder's scripts, those that start a process group first, then show the answer."""
        folder = self.state.project_dir
        scripts = scripts_in(folder)[: self.MAX_SUGGESTIONS] if folder is not None and folder.is_dir() else []
        suggestions = self.query_one(".script-suggestions", OptionList)
        suggestions.add_options(Option(script, id=script) for script in scripts)
        super().on_mount()

    def show_value(self) -> None:
        """Highlight the choice; show the path input and the suggestions only for the user's own script."""
        own = self.state.script_is_own()
        self.query_one(".script-choice", OptionList).highlighted = 1 if own else 0
        entry = self.query_one(".script-path", Input)
        entry.cursor_blink = self.blink
        entry.display = own
        self.query_one(".script-path-label", Label).display = own
        suggestions = self.query_one(".script-suggestions", OptionList)
        suggestions.display = own and suggestions.option_count > 0
        if not getattr(self, "_filled", False):
            self._filled = True
            entered = self.state.raw.get(self.question.name)
            shown = self.state.shown(self.question.name)
            with entry.prevent(Input.Changed):  # the path as entered, even one the answers took for the generated
                entry.value = entered if own and isinstance(entered, str) else shown if is_foreign(shown) else ""

    @on(OptionList.OptionSelected, ".script-choice")
    def picked(self, event: OptionList.OptionSelected) -> None:
        """Generated goes back to the default script; your own asks for the path."""
        event.stop()
        self.state.own_script = event.option.id == self.OWN
        if self.state.own_script:
            self.edited(self.query_one(".script-path", Input).value)
            self.call_after_refresh(self.query_one(".script-path", Input).focus)
        else:
            self.edited(None)
            self.screen.focus_next()

    @on(OptionList.OptionSelected, ".script-suggestions")
    def suggested(self, event: OptionList.OptionSelected) -> None:
        """A suggested script becomes the path."""
        event.stop()
        entry = self.query_one(".script-path", Input)
        with entry.prevent(Input.Changed):
            entry.value = str(event.option.id)
        self.edited(str(event.option.id))

    @on(Input.Changed, ".script-path")
    def typed(self, event: Input.Changed) -> None:
        """Record the typed path, once the typing pauses."""
        event.stop()
        self.typed_later(event.value)


def field_for(question: Question, state: WizardState, *, blink: bool = True) -> Field:
    """The widget for a question, chosen by its kind."""
    if question.kind == "script":
        return ScriptField(question, state, blink=blink)
    if question.choices:
        return ChoiceField(question, state, blink=blink)
    if question.kind == "ip_list" and not question.optional:  # one address per node: a row each
        return ListField(question, state, blink=blink)
    return TextField(question, state, blink=blink)
