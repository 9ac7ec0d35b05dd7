"""What the screens ask of the wizard application, as a protocol: the screens import it, not wizard.tui.app.

`WizardApp` (app.py) builds the screens and fits this protocol, so app -> screens is the only direction.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from wizard.tui.state import WizardState

if TYPE_CHECKING:
    from wizard.render.render import RenderResult


class WizardHost(Protocol):
    """The wizard application as its screens see it: the answers so far, where to render, what comes next."""

    state: WizardState
    output_dir: Path
    answers_path: Path | None
    into: bool
    blink: bool
    show_help: bool

    def go_forward(self, step: str) -> None:
        """Open the step after `step`, or the review after the last."""

    def rendered(self, result: RenderResult, headline: str | None = None) -> None:
        """Show what was written."""

    def push_screen(self, screen: Any, callback: Any = None) -> Any:
        """Textual's App.push_screen."""

    def pop_screen(self) -> Any:
        """Textual's App.pop_screen."""

    def call_from_thread(self, callback: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Textual's App.call_from_thread."""
