"""Rehearsing a failure: NPU_WIZARD_REHEARSE makes chosen ranks hang, or the compiler fail, on purpose.

Before a long job, a user can see how the cluster, the runner and the monitor react to a hang (who is named,
where each rank's stack is, what --abort-on-hang and --restarts do) or to a model that will not compile.
NPU_WIZARD_REHEARSE (docs/rehearse.md) is a comma-separated list of:

- `hang:RANK:STEP[:HOW]`: rank RANK (or `*`, every rank) hangs at its STEP-th step (from 1, counted in this
  process), HOW one of
  - `sleep` (the default): after the forward, sleep instead of going on to the backward: the rank never
    enters that step's gradient all_reduce, as a rank stuck in its own code does;
  - `barrier`: after the forward, call a barrier where the others all_reduce the gradients (for good: the
    collectives no longer match), as a rank on another code path does;
  - `data`: sleep while fetching that step's batch, as a stuck data loader does;
- `compile-fails`: the compiler backend raises, as for a model it cannot compile (training.compile: the step
  runs eagerly, and the rank says why);
- `release=FOLDER`: a sleep ends when FOLDER holds a file `step-STEP`, so that one run can rehearse several
  hangs (without it a sleep lasts an hour, or until the job is stopped).

Unset, nothing is planned and the step timer (runtime/timing.py) calls nothing. A value that is none of these
is refused, in one line that says what is allowed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .errors import SetupError

ENV_REHEARSE = "NPU_WIZARD_REHEARSE"
HANG_S = (
    3600.0  # a rehearsed sleep with no release: the runner stops the job long before
)
HOWS = ("sleep", "barrier", "data")
COMPILE_FAILS = "compile-fails"
FORMS = f"hang:RANK:STEP[:{'|'.join(HOWS)}], {COMPILE_FAILS} or release=FOLDER, separated by commas"


class RehearsalError(SetupError):
    """NPU_WIZARD_REHEARSE holds something that is no rehearsal."""


@dataclass(frozen=True)
class Hang:
    """One planned hang: which rank (None: every rank), at which step, and how."""

    rank: int | None
    step: int
    how: str


@dataclass(frozen=True)
class Rehearsal:
    """What NPU_WIZARD_REHEARSE asks for."""

    hangs: tuple[Hang, ...] = ()
    compile_fails: bool = False
    release: Path | None = None


@dataclass(frozen=True)
class Hangs:
    """Where this rank hangs on purpose: {step: how}, and where a sleep's release appears."""

    at: Mapping[int, str] = field(default_factory=dict)
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


def parse(value: str) -> Rehearsal:
    """The rehearsal `value` asks for; RehearsalError naming the first item that is none."""
    hangs, compile_fails, release = [], False, None
    for item in (part.strip() for part in value.split(",")):
        if not item:
            continue
        if item == COMPILE_FAILS:
            compile_fails = True
        elif item.startswith("release="):
            release = Path(item.removeprefix("release="))
        elif item.startswith("hang:"):
            hangs.append(_hang(item))
        else:
            raise _refused(item, f"expected {FORMS}")
    return Rehearsal(tuple(hangs), compile_fails, release)


def from_env(env: Mapping[str, str] = os.environ) -> Rehearsal:
    """The rehearsal NPU_WIZARD_REHEARSE asks for (none where it is unset)."""
    return parse(env.get(ENV_REHEARSE, ""))


def planned(env: Mapping[str, str] = os.environ) -> Hangs | None:
    """This rank's planned hangs, from NPU_WIZARD_REHEARSE and RANK; None where it has none."""
    rehearsal = from_env(env)
    rank = env.get("RANK")
    at = {
        h.step: h.how for h in rehearsal.hangs if h.rank is None or str(h.rank) == rank
    }
    return Hangs(at, rehearsal.release) if at else None


def compile_fails(env: Mapping[str, str] = os.environ) -> bool:
    """Whether NPU_WIZARD_REHEARSE asks the compiler backend to fail."""
    return from_env(env).compile_fails


def _hang(item: str) -> Hang:
    parts = item.split(":")
    if len(parts) not in (3, 4):
        raise _refused(
            item,
            f"expected hang:RANK:STEP or hang:RANK:STEP:HOW, HOW one of {', '.join(HOWS)}",
        )
    _, rank, step, *how = parts
    if rank != "*" and not (rank.isascii() and rank.isdigit()):
        raise _refused(item, "RANK is a rank's number (from 0) or * for every rank")
    if not (step.isascii() and step.isdigit()) or int(step) < 1:
        raise _refused(item, "STEP is a step of the rank, from 1")
    if how and how[0] not in HOWS:
        raise _refused(item, f"HOW is one of {', '.join(HOWS)}")
    return Hang(
        None if rank == "*" else int(rank), int(step), how[0] if how else "sleep"
    )


def _refused(item: str, why: str) -> RehearsalError:
    return RehearsalError(
        f"{ENV_REHEARSE}: {item!r} is no rehearsal: {why} (see docs/rehearse.md)"
    )
