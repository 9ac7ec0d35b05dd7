"""Checks of the project folder itself, not of this node: files an update left half done."""

from __future__ import annotations

from pathlib import Path

from runtime.checks import FAIL, PASS, Result
from wizard.render import conflict_markers


def check_conflict_markers(project: Path) -> Result:
    """FAIL when a generated file still holds the <<<<<<< markers of `npu-wizard update --write-conflicts`."""
    found = conflict_markers.unresolved(project)
    if not found:
        return Result("conflicts", PASS, "no conflict markers left by npu-wizard update")
    return Result(
        "conflicts",
        FAIL,
        conflict_markers.describe(found),
        f"{conflict_markers.fix()}; npu-wizard run and update refuse the project until then",
    )
