"""The question steps and the replace-confirmation dialog."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widget import Widget
from textual.widgets import Button, Header, Input, Label, OptionList, Static
from textual.widgets.option_list import Option

from wizard.answers.questions import STEPS
from wizard.answers.spec import Question
from wizard.tui.fields import Field, field_for
from wizard.tui.footer import KeysFooter
from wizard.tui.host import WizardHost
from wizard.tui.state import questions_of, step_title


def help_text(question: Question) -> Text:
    """A question's help panel: its prompt, the spec's help and what it accepts."""
    text = Text(question.prompt, style="bold")
    text.append("  (" + question.allowed() + ("; may be left empty" if question.optional else "") + ")", style="dim")
    text.append("\n" + question.help)
    return text


HINTS = {"training.lr": "#lr-hint", "project_name": "#name-hint"}
"""The questions with a hint under their field, and the hint's id."""


class StepScreen(Screen[None]):
    """One step of questions; Next is refused while the step has errors."""

    BINDINGS = [
        Binding("ctrl+n", "next", "Next"),
        Binding("escape", "back", "Back"),
        Binding("f1", "toggle_help", "Help"),
    ]

    app: WizardHost  # the WizardApp (wizard.tui.app), as wizard.tui.host describes it

    def __init__(self, step: str) -> None:
        super().__init__(name=step)
        self.step = step

    def compose(self) -> ComposeResult:
        """Header, the fields of the step's questions that apply now, the help panel and the footer.

        A question that does not apply is mounted once an answer makes it apply (`refresh_fields`), not
        before: each widget costs its share of every restyle, and a step can ask three times the questions
        that apply to a given project (the cluster step asks 16; a manual launch needs 2).
        """
        yield Header()
        with VerticalScroll(id="fields"):
            for question in questions_of(self.step):
                if self.app.state.applies(question.name):
                    yield from self.widgets_of(question)
        yield Static("", id="help")
        yield KeysFooter()

    def widgets_of(self, question: Question) -> list[Widget]:
        """A question's field, with the hint that goes under it where it has one."""
        widgets: list[Widget] = [field_for(question, self.app.state, blink=self.app.blink)]
        if question.name == "training.lr":
            widgets.append(Static("", id="lr-hint"))
        if question.name == "project_name" and self.app.into:
            folder = self.app.output_dir.resolve().name
            widgets.append(Static(f"(named after the repository's folder, {folder})", id="name-hint"))
        return widgets

    def mount_applying(self) -> None:
        """Mount the fields of questions that apply now and have none yet, each in its place in spec order."""
        container = self.query_one("#fields")
        mounted = {field.question.name: field for field in self.query(Field).results(Field)}
        anchor: Widget | None = None  # the last widget before the question at hand
        batch: list[Widget] = []
        for question in questions_of(self.step):
            if question.name in mounted:
                self._mount_after(container, batch, anchor)
                batch = []
                anchor = mounted[question.name]
                if question.name in HINTS:  # the hint under the field goes before the next field
                    anchor = next(iter(self.query(HINTS[question.name])), anchor)
            elif self.app.state.applies(question.name):
                batch.extend(self.widgets_of(question))
        self._mount_after(container, batch, anchor)

    @staticmethod
    def _mount_after(container: Widget, widgets: list[Widget], anchor: Widget | None) -> None:
        if not widgets:
            return
        if anchor is not None:
            container.mount(*widgets, after=anchor)
        elif container.children:
            container.mount(*widgets, before=0)
        else:
            container.mount(*widgets)

    def on_mount(self) -> None:
        """Title the step and show the first question's help."""
        self.sub_title = step_title(self.step)
        self.query_one("#help", Static).display = self.app.show_help
        self.show_help(questions_of(self.step)[0])
        self.refresh_fields()
        self.query(".answer").first().focus()

    def on_screen_resume(self) -> None:
        """Answers on later steps may have changed defaults here; show them again."""
        self.query_one("#help", Static).display = self.app.show_help
        if self.is_mounted:
            self.refresh_fields()

    def refresh_fields(self) -> None:
        """Show every field's value and problems as the state has them now; mount those that came to apply."""
        self.mount_applying()
        for field in self.query(Field).results(Field):
            if field.is_mounted:
                field.show()
        for hint in self.query("#lr-hint").results(Static):
            hint.display = self.app.state.applies("training.lr")  # not for a script of the user's own
            hint.update(Text(self.app.state.lr_hint()))

    @on(Field.Edited)
    def record(self, event: Field.Edited) -> None:
        """Store the new raw answer and check the step again."""
        self.app.state.set(event.name, event.raw)
        self.refresh_fields()

    def check_typed(self) -> None:
        """Record what was typed but not yet checked (Next and Enter do not wait for the pause)."""
        typed = [(f.question.name, f.take_pending()) for f in self.query(Field).results(Field)]
        for name, pending in typed:
            if pending is not None:
                self.app.state.set(name, pending[0])
        if any(pending is not None for _, pending in typed):
            self.refresh_fields()

    @on(Field.Focused)
    def field_focused(self, event: Field.Focused) -> None:
        """Show the focused question's help."""
        self.show_help(event.question)

    def show_help(self, question: Question) -> None:
        """Put a question's help in the help panel."""
        self.query_one("#help", Static).update(help_text(question))

    @on(Input.Submitted)
    def submitted(self, event: Input.Submitted) -> None:
        """Enter moves to the next field, and past the last one to the next step."""
        event.stop()
        inputs = [w for w in self.focus_chain if w.display]
        if inputs and self.focused is inputs[-1]:
            self.action_next()
        else:
            self.focus_next()

    def action_next(self) -> None:
        """Go to the next step, or to the review, when this step has no errors."""
        self.check_typed()
        errors = self.app.state.step_errors(self.step)
        if errors:
            first = errors[0]
            self.notify(f"{first.field}: {first.message}", title="Fix this step first", severity="error")
            # a field mounted by check_typed just now has no widgets yet: it takes no focus
            for field in self.query("#field-" + first.field.replace(".", "-")).results(Field):
                for answer in field.query(".answer")[:1]:
                    answer.focus()
            return
        self.app.go_forward(self.step)

    def action_back(self) -> None:
        """Go to the previous step; what was entered stays."""
        if STEPS.index(self.step) > 0:
            self.app.pop_screen()

    def action_toggle_help(self) -> None:
        """Show or hide the help panel."""
        self.app.show_help = not self.app.show_help
        self.query_one("#help", Static).display = self.app.show_help


class ConfirmScreen(ModalScreen[bool]):
    """Ask a yes/no question; dismisses with True only on an explicit yes."""

    BINDINGS = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n", "answer(False)", "No"),
        Binding("escape", "answer(False)", "Cancel"),
    ]

    def __init__(self, question: str, yes: str = "Replace") -> None:
        super().__init__()
        self.question = question
        self.yes = yes

    def compose(self) -> ComposeResult:
        """The question and two buttons, No focused."""
        with Vertical(id="dialog"):
            yield Label(Text(self.question), id="question")
            with Horizontal(id="buttons"):
                yield Button(f"{self.yes} (y)", variant="error", id="yes")
                yield Button("Cancel (n)", variant="primary", id="no")

    def on_mount(self) -> None:
        """Focus the safe answer."""
        self.query_one("#no", Button).focus()

    @on(Button.Pressed)
    def pressed(self, event: Button.Pressed) -> None:
        """Answer with the button pressed."""
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        """Answer from the keyboard."""
        self.dismiss(yes)


class WhereScreen(Screen[bool]):
    """Started in a git repository: into this repository, or a new project folder? Dismisses with True for into."""

    def __init__(self, repository: Path, name: str) -> None:
        super().__init__()
        self.repository = repository
        self.project_name = name

    def compose(self) -> ComposeResult:
        """The question and its two answers, into first."""
        yield Header()
        with Vertical(id="where"):
            yield Label(f"You started npu-wizard in the git repository {self.repository}.", classes="prompt")
            yield OptionList(
                Option(
                    Text.assemble(
                        ("Into this repository", "bold"),
                        "\nnpu-wizard puts its files into one folder here (npu/; the review page changes it) and "
                        f"runs your own script from here; project name {self.project_name} (from the folder "
                        f"{self.repository.name})",
                    ),
                    id="into",
                ),
                Option(
                    Text.assemble(
                        ("A new project folder", "bold"),
                        f"\n{self.repository}/<project name>/, with the generated model script or yours",
                    ),
                    id="new",
                ),
                id="where-choice",
            )
        yield KeysFooter()

    def on_mount(self) -> None:
        """Title the page and focus the choice."""
        self.sub_title = "Where should the project go?"
        choice = self.query_one(OptionList)
        choice.highlighted = 0
        choice.focus()

    @on(OptionList.OptionSelected)
    def picked(self, event: OptionList.OptionSelected) -> None:
        """Answer with the picked option."""
        self.dismiss(event.option.id == "into")
