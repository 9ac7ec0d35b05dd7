"""Test-only: NPU_WIZARD_TEST_HANG makes ranks of the generated script hang on purpose.

The hang tests (tests/test_hang_stacks.py) need ranks stuck in known places.
NPU_WIZARD_TEST_HANG is a comma-separated list of RANK:STEP:HOW, RANK a rank
or `*` for every rank, STEP the rank's step (from 1, counted in this process),
HOW one of:

- `sleep`: after the forward of that step, sleep instead of going on to the
  backward: the rank never enters that step's gradient all_reduce;
- `barrier`: after the forward of that step, call a barrier where the other
  ranks all_reduce the gradients (for good: the collectives no longer match);
- `data`: sleep while fetching that step's batch, as a stuck data loader does.

A sleep ends when NPU_WIZARD_TEST_HANG_RELEASE names a folder holding a file
`step-STEP`, so that one run can hang several times. Unset (always, outside the
tests), the step timer (runtime/timing.py) holds None and calls nothing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ENV_TEST_HANG = "NPU_WIZARD_TEST_HANG"
ENV_TEST_RELEASE = "NPU_WIZARD_TEST_HANG_RELEASE"
HANG_S = 3600.0  # the test stops the job long before
HOWS = ("sleep", "barrier", "data")


@dataclass(frozen=True)
class Hangs:
    """Where this rank hangs on purpose: {step: how}, and where a sleep's release appears."""

    at: Mapping[int, str]
    release: Path | None = None

    def after_forward(self, step: int) -> None:
        """Called after each step's forward: hang at a `sleep` or `barrier` step."""
        how = self.at.get(step)
        if how == "sleep":
            self.sleep(step)
        elif how == "barrier":
            import torch.distributed as dist

            dist.barrier()

    def before_batch(self, step: int) -> None:
        """Called before each step's batch is fetched: hang at a `data` step."""
        if self.at.get(step) == "data":
            self.load_batch_stuck(step)

    def load_batch_stuck(self, step: int) -> None:
        """A data loader that does not return (the line every rank then waits on)."""
        self.sleep(step)

    def sleep(self, step: int) -> None:
        """Sleep until step's release appears, or HANG_S."""
        deadline = time.monotonic() + HANG_S
        while time.monotonic() < deadline:
            if self.release is not None and (self.release / f"step-{step}").exists():
                return
            time.sleep(0.2)


def planned(env: Mapping[str, str] = os.environ) -> Hangs | None:
    """This rank's planned hangs from NPU_WIZARD_TEST_HANG and RANK, else None."""
    at = {}
    for plan in env.get(ENV_TEST_HANG, "").split(","):
        rank, _, rest = plan.partition(":")
        step, _, how = rest.partition(":")
        if rank in ("*", env.get("RANK")) and step.isdigit() and how in HOWS:
            at[int(step)] = how
    if not at:
        return None
    release = env.get(ENV_TEST_RELEASE)
    return Hangs(at, Path(release) if release else None)
