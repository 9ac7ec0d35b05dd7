"""A check's outcome, shared by the launch-time preflight and `npu-wizard doctor`."""

from __future__ import annotations

from dataclasses import dataclass

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"


@dataclass(frozen=True)
class Result:
    """One check's outcome: PASS, WARN, FAIL or SKIP, what was found, and the fix."""

    name: str
    status: str
    detail: str
    fix: str = ""
