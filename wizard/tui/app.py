"""The wizard application: one state, the steps in spec order, the review and the result."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from textual.app import App
from textual.binding import Binding

from wizard.answers.questions import STEPS
from wizard.tui.repository import project_name_from
from wizard.tui.review import DoneScreen, ReviewScreen
from wizard.tui.screens import StepScreen, WhereScreen
from wizard.tui.state import WizardState

if TYPE_CHECKING:
    from wizard.render.render import RenderResult


class WizardApp(App[int]):
    """npu-wizard's interactive wizard."""

    CSS_PATH = "wizard.tcss"
    TITLE = "npu-wizard"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [Binding("ctrl+q", "quit", "Quit", priority=True)]

    def __init__(
        self,
        state: WizardState,
        output_dir: Path,
        *,
        answers_path: Path | None = None,
        blink: bool = True,
        into: bool = False,
        repository: Path | None = None,
    ) -> None:
        super().__init__()
        self.state = state
        self.state.output_dir = output_dir
        self.answers_path = answers_path
        self.state.into = into
        self.repository = repository
        """The git repository the wizard was started in: the first page offers to render into it."""
        self.blink = blink
        self.show_help = True
        self.result: RenderResult | None = None

    @property
    def output_dir(self) -> Path:
        """Where the project is rendered (the review page changes it); the state checks the user's script there."""
        return self.state.output_dir or Path(".")

    @output_dir.setter
    def output_dir(self, folder: Path) -> None:
        self.state.output_dir = folder

    @property
    def into(self) -> bool:
        """Render into output_dir itself (the user's repository, as --into) instead of output_dir/<project_name>."""
        return self.state.into

    @into.setter
    def into(self, into: bool) -> None:
        self.state.into = into

    def on_mount(self) -> None:
        """Fix the theme and open the first step."""
        self.theme = "textual-dark"
        if self.repository is not None:
            self.push_screen(WhereScreen(self.repository, project_name_from(self.repository.name)), self.where_chosen)
        else:
            self.push_screen(StepScreen(STEPS[0]))
        if self.state.file_problems:
            count = len(self.state.file_problems)
            self.notify(
                f"{count} problem(s) in the answers file: unknown keys are left out; the review page lists them",
                severity="warning",
            )

    def where_chosen(self, into: bool | None) -> None:
        """Into the repository: render there, check the script there, name the project after its folder."""
        if into and self.repository is not None:
            self.into = True
            self.output_dir = self.repository
            if "project_name" not in self.state.raw:
                self.state.set("project_name", project_name_from(self.repository.name))
        self.push_screen(StepScreen(STEPS[0]))

    def go_forward(self, step: str) -> None:
        """Open the step after `step`, or the review after the last."""
        index = STEPS.index(step)
        self.push_screen(StepScreen(STEPS[index + 1]) if index + 1 < len(STEPS) else ReviewScreen())

    def rendered(self, result: RenderResult, headline: str | None = None) -> None:
        """Show what was written."""
        self.result = result
        self.push_screen(DoneScreen(result, headline))
