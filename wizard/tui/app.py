"""The wizard application: one state, the steps in spec order, the review and the result."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from textual.app import App
from textual.binding import Binding

from wizard.answers.questions import STEPS
from wizard.tui.review import DoneScreen, ReviewScreen
from wizard.tui.screens import StepScreen
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
    ) -> None:
        super().__init__()
        self.state = state
        self.state.output_dir = output_dir
        self.answers_path = answers_path
        self.into = into
        """Render into output_dir itself (the user's repository, as --into) instead of output_dir/<project_name>."""
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

    def on_mount(self) -> None:
        """Fix the theme and open the first step."""
        self.theme = "textual-dark"
        self.push_screen(StepScreen(STEPS[0]))
        if self.state.file_problems:
            count = len(self.state.file_problems)
            self.notify(
                f"{count} problem(s) in the answers file: unknown keys are left out; the review page lists them",
                severity="warning",
            )

    def go_forward(self, step: str) -> None:
        """Open the step after `step`, or the review after the last."""
        index = STEPS.index(step)
        self.push_screen(StepScreen(STEPS[index + 1]) if index + 1 < len(STEPS) else ReviewScreen())

    def rendered(self, result: RenderResult, headline: str | None = None) -> None:
        """Show what was written."""
        self.result = result
        self.push_screen(DoneScreen(result, headline))
