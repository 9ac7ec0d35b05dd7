"""Which start of the job this is and whether it resumes: what every rank finds in its environment.

`NPU_WIZARD_ATTEMPT` is the start's number: 1 for the first, counted on by `run --restarts`.
`NPU_WIZARD_RESUMING` is 1 where the start resumes: an attempt after the first, or the first attempt
of a run after the project's last training run did not finish (failed, hung, interrupted, preempted,
or its runner killed). A run that finished, a `--smoke` run and a run whose ranks never started say
nothing of a checkpoint: the first is a fresh start after it, the others are passed over. Where a
start resumes, launch/run-node.sh adds `training.resume_args` to a user's own script. Under the
Kubernetes engines neither reaches the pods, which start as their manifest says.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from pathlib import Path

from wizard.monitor.attach import REMOTE_DIR, RUN_FILE
from wizard.monitor.run_files import RunFileError, read_json_object

ENV_ATTEMPT = "NPU_WIZARD_ATTEMPT"
ENV_RESUMING = "NPU_WIZARD_RESUMING"
RUN_NAME = re.compile(r"([0-9]{8}-[0-9]{6})(?:-([0-9]{1,4}))?")
UNFINISHED = "did not finish"
ENDED_WORDS = {
    UNFINISHED: "did not finish (its runner left no summary)",
    "failed": "failed",
    "hung": "hung",
    "interrupted": "was interrupted",
    "preempted": "was stopped after its ranks saved",
}
MOST_RUNS_READ = 200  # older runs than these say nothing a newer one does not


@dataclass(frozen=True)
class Unfinished:
    """The project's last training run, which did not finish."""

    run_dir: Path
    outcome: str  # failed, hung, interrupted, preempted, or UNFINISHED where no summary was written


def attempt_env(number: int, resuming: bool) -> dict[str, str]:
    """The ranks' environment for attempt `number`."""
    return {ENV_ATTEMPT: str(number), ENV_RESUMING: "1" if resuming or number > 1 else "0"}


def unfinished_run(project: Path, this_run: Path | None = None) -> Unfinished | None:
    """The project's newest earlier training run whose ranks started, where it did not finish; None otherwise."""
    runs = sorted(
        (key, path)
        for path in _children(project / "runs")
        if path != this_run and (key := _run_key(path.name)) is not None
    )
    for _key, run_dir in reversed(runs[-MOST_RUNS_READ:]):
        info = _json(run_dir / RUN_FILE) or {}
        if info.get("smoke"):
            continue
        summary = _json(run_dir / "summary.json")
        if summary is None:  # the runner was killed, or the run folder is another host's
            if _ranks_wrote(run_dir):
                return Unfinished(run_dir, UNFINISHED)
            continue
        world_size = summary.get("world_size")
        if not isinstance(world_size, int) or isinstance(world_size, bool):  # a malformed summary says nothing
            continue
        never = summary.get("never_reported")
        started = not isinstance(never, list) or len(never) < world_size
        if not started:
            continue
        outcome = str(summary.get("outcome"))
        return None if outcome == "finished" else Unfinished(run_dir, outcome)
    return None


def resuming_note(previous: Unfinished, resume_args: tuple[str, ...], manifest: str | None = None) -> str:
    """What the runner says of a run that resumes after `previous`; `manifest`: the ranks start as it says."""
    ended = ENDED_WORDS.get(previous.outcome, f"ended {previous.outcome}")
    if manifest is not None:  # nothing of this runner's environment reaches the pods
        return (
            f"note: the last run ({previous.run_dir.name}) {ended}; the pods start as {manifest} says, so "
            "they resume only where your script finds its checkpoint by itself"
        )
    added = ""
    if resume_args:
        added = f" and training.resume_args ({' '.join(resume_args)}) after your script's arguments and those after --"
    return (
        f"resuming: the last run ({previous.run_dir.name}) {ended}, so every rank gets {ENV_RESUMING}=1{added} "
        "(with --fresh it does not)"
    )


def _children(folder: Path) -> list[Path]:
    try:
        return [path for path in folder.iterdir() if path.is_dir() and not path.is_symlink()]
    except OSError:
        return []


def _run_key(name: str) -> tuple[str, int] | None:
    """A run folder's place in time (its stamp, then its suffix); None for another folder."""
    match = RUN_NAME.fullmatch(name)
    return None if match is None else (match.group(1), int(match.group(2) or 0))


def _json(path: Path) -> dict | None:
    with contextlib.suppress(OSError, RunFileError):
        return read_json_object(path)
    return None


def _ranks_wrote(run_dir: Path) -> bool:
    """Whether any rank of the run wrote an event (here, or a remote rank's kept here)."""
    for events in (run_dir / "events", run_dir / REMOTE_DIR / "events"):
        with contextlib.suppress(OSError):
            if any(path.stat().st_size > 0 for path in events.glob("rank-*.jsonl")):
                return True
    return False
