"""Key screens of the wizard at 80x24, fixed theme, no cursor blink (pytest-textual-snapshot).

Re-record after a deliberate change: pytest tests/test_tui_snapshots.py --snapshot-update
"""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.pilot import Pilot

from tests.tui_driver import SIZE, answer, answer_all, next_step, pick, until
from wizard.tui import create_app
from wizard.tui.screens import ConfirmScreen


@pytest.fixture(autouse=True)
def _fixed_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Relative output paths, so the screens do not show a per-run temporary folder."""
    monkeypatch.chdir(tmp_path)


def dialog_has_focus(pilot: Pilot[int]) -> bool:
    """The confirmation dialog is the screen and one of its widgets has the focus."""
    screen = pilot.app.screen
    return isinstance(screen, ConfirmScreen) and screen.focused is not None


def test_hardware_step(snap_compare) -> None:  # noqa: ANN001
    async def before(pilot: Pilot[int]) -> None:
        await next_step(pilot)

    assert snap_compare(create_app(blink=False), run_before=before, terminal_size=SIZE)


def test_topology_step_with_a_refused_device_count(snap_compare) -> None:  # noqa: ANN001
    async def before(pilot: Pilot[int]) -> None:
        await next_step(pilot)
        await pick(pilot, "hardware", "atlas-training")
        await next_step(pilot)
        await answer(pilot, "devices_per_node", 6)

    assert snap_compare(create_app(blink=False), run_before=before, terminal_size=SIZE)


def test_precision_step_with_bf16_disabled(snap_compare) -> None:  # noqa: ANN001
    async def before(pilot: Pilot[int]) -> None:
        await next_step(pilot)
        await pick(pilot, "hardware", "atlas-training")
        for _ in range(3):
            await next_step(pilot)

    assert snap_compare(create_app(blink=False), run_before=before, terminal_size=SIZE)


def test_review_page(snap_compare) -> None:  # noqa: ANN001
    async def before(pilot: Pilot[int]) -> None:
        await answer_all(pilot, {"device": "cpu", "launcher": "torch-launch"})
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()

    assert snap_compare(create_app(blink=False, output_dir=Path("out")), run_before=before, terminal_size=SIZE)


def test_replace_confirmation(snap_compare) -> None:  # noqa: ANN001
    async def before(pilot: Pilot[int]) -> None:
        Path("out/ddp-npu").mkdir(parents=True)
        await answer_all(pilot, {"device": "cpu"})
        await pilot.app.workers.wait_for_complete()
        await pilot.press("ctrl+r")
        await until(pilot, lambda: dialog_has_focus(pilot), "the replace dialog to open and take focus")
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()

    assert snap_compare(create_app(blink=False, output_dir=Path("out")), run_before=before, terminal_size=SIZE)


def test_the_wizard_runs_with_animations_off_in_tests() -> None:
    # a fade caught half-way made snapshots fail on a busy machine (conftest turns them off)
    assert create_app(blink=False).animation_level == "none"
