"""The interactive wizard: screens that ask the questions of wizard.answers.

Takes prior answers (or none) and gives a rendered project through wizard.render, or nothing when the user
quits; `create_app` is the one place the CLI and the tests build it from.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wizard.errors import Problem
    from wizard.tui.app import WizardApp


def create_app(
    raw: Mapping[str, Any] | None = None,
    output_dir: Path = Path("."),
    *,
    file_problems: Iterable[Problem] = (),
    answers_path: Path | None = None,
    blink: bool = True,
    into: bool = False,
    repository: Path | None = None,
) -> WizardApp:
    """Build the wizard, pre-filled with raw answers (dotted names) when editing a file.

    `into`: render into `output_dir` itself, as --into does. `repository`: the git repository the wizard was
    started in; the first page offers to render into it. Editing the answers.yaml of a folder rendered
    --into always does: the wizard updates that folder.
    """
    from wizard.render.pristine import is_into
    from wizard.tui.app import WizardApp
    from wizard.tui.into_folder import where_rendered
    from wizard.tui.state import WizardState

    state = WizardState(raw, file_problems)
    if answers_path is not None and is_into(Path(answers_path).parent):  # the repository around it, and its folder
        output_dir, state.folder = where_rendered(Path(answers_path).parent)
        into = True
    return WizardApp(state, Path(output_dir), answers_path=answers_path, blink=blink, into=into, repository=repository)
