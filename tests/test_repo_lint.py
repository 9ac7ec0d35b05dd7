"""npu-wizard's own code passes ruff (its settings in pyproject.toml, the runtime's in runtime/ruff.toml)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.test_lint_rendered import tool

ROOT = Path(__file__).parent.parent


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["check", "format"])
def test_the_code_base_passes_ruff(command: list[str]) -> None:
    result = subprocess.run([tool("ruff"), *command, "--no-cache", "."], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
