"""Saving before being stopped: SIGUSR1 or SIGTERM asks a rank to save a checkpoint and exit.

Slurm sends SIGUSR1 before a job's time limit (#SBATCH --signal), Kubernetes
and `npu-wizard run` send SIGTERM. The handler only notes the signal; the
training loop then asks, once per logged window, whether any rank got one
(`agree`: one all_reduce of a single integer, the same call on every rank), so
every rank stops at the same step, saves, and exits with PREEMPTED_EXIT. The
launch scripts and `npu-wizard run` read that code, or the ranks' `preempted`
events, as "preempted, checkpoint saved", never as a crash.

`python -m runtime.preemption RUN_DIR FIRST_RANK COUNT [--since T]` says whether
the ranks FIRST_RANK .. FIRST_RANK + COUNT - 1 all ended that way (exit 0) or not
(1). The events files grow across Slurm's requeues: with `--since T` (unix
seconds, when the calling script started) a `preempted` event written before T,
by an earlier attempt, does not count.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from . import events

PREEMPTED_EXIT = 75  # sysexits' EX_TEMPFAIL: stopped on purpose, run again to go on
SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
# the end of an events file read for its last ending event: after it come at most a few heartbeats and warnings
LAST_EVENT_BYTES = 1024 * 1024

_received: str | None = None  # the name of the first stop signal that arrived
# True once the script asked should_stop(): from then on a signal only asks
_watched = False
_only_when_watched = False
_forward: Callable[[], Iterable[int]] | None = None


def _note(signum: int, _frame: FrameType | None) -> None:
    global _received
    if _only_when_watched and not _watched:
        # nothing in this process asks: the signal ends it, as it did before the handler
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    _received = _received or signal.Signals(signum).name
    if _forward is not None:
        for pid in _forward():
            try:
                os.kill(pid, signum)
            except (ProcessLookupError, PermissionError):
                pass


def install(
    *,
    only_when_watched: bool = False,
    forward_to: Callable[[], Iterable[int]] | None = None,
) -> list[str]:
    """Note SIGUSR1 and SIGTERM instead of dying of them; return the names of the signals taken.

    A signal whose handler is not the default (the script set its own, or it
    is ignored) is left alone. With `only_when_watched`, a signal still ends
    the process as before until something called `should_stop()` (a user's
    script that never asks keeps dying of SIGTERM). `forward_to`: pids that
    get the same signal (mp-spawn's workers, from their parent).
    """
    global _only_when_watched, _forward
    _only_when_watched, _forward = only_when_watched, forward_to
    taken = []
    for signum in SIGNALS:
        if signal.getsignal(signum) in (signal.SIG_DFL, _note):
            signal.signal(signum, _note)
            taken.append(signal.Signals(signum).name)
    return taken


def requested() -> str | None:
    """The name of the stop signal that arrived (SIGUSR1, SIGTERM), or None."""
    return _received


def should_stop() -> bool:
    """True once SIGUSR1 or SIGTERM arrived: save a checkpoint and exit with PREEMPTED_EXIT."""
    global _watched
    if not _watched:
        _watched = True
        _say_asked()
    return _received is not None


def _say_asked() -> None:
    """Tell the monitor, once, that this rank asks: a stop signal now has it save rather than end it."""
    writer = events.current_writer()
    if writer is not None:  # npu-wizard run's words when it stops the job depend on it
        writer.emit("stop_asked")


def agree(device: Any) -> str | None:
    """The stop signal any rank got, by name, or None: one all_reduce (MAX) of one integer on every rank.

    A rank that learns it here notes it as its own (`requested()` names it).
    """
    import torch
    import torch.distributed as dist

    global _received
    asked = signal.Signals[_received].value if _received is not None else 0
    if (
        not (dist.is_available() and dist.is_initialized())
        or dist.get_world_size() == 1
    ):
        return _received
    flag = torch.tensor([asked], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    agreed = int(flag.item())
    if agreed:
        _received = _received or signal.Signals(agreed).name
    return signal.Signals(agreed).name if agreed else None


def barrier() -> None:
    """Wait for every rank (after the save, so none exits before the checkpoint is written)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def preempted_step(
    run_dir: Path, ranks: Iterable[int], since: float | None = None
) -> int | None:
    """The step at which every one of `ranks` ended preempted (from its events file); None otherwise.

    With `since`, a `preempted` event whose time is before it (an earlier attempt's) does not count.
    """
    steps = set()
    for rank in ranks:
        last = _last_event(events.events_path(run_dir, rank))
        if last is None or last.get("event") != "preempted":
            return None
        if since is not None and not _at_or_after(last.get("time"), since):
            return None
        steps.add(last.get("step"))
    return steps.pop() if len(steps) == 1 else None


def _at_or_after(when: object, since: float) -> bool:
    return (
        isinstance(when, (int, float)) and not isinstance(when, bool) and when >= since
    )


def _tail(path: Path, limit: int = LAST_EVENT_BYTES) -> bytes | None:
    """The last `limit` bytes of the regular file `path`; None for no file, a link or anything else."""
    try:
        fd = os.open(
            path,
            os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_NOFOLLOW | os.O_CLOEXEC,
        )
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            return None
        handle.seek(max(0, status.st_size - limit))
        return handle.read(limit)


def _last_event(path: Path) -> dict | None:
    """The last ending event (preempted, finished, error, started) in the end of an events file."""
    tail = _tail(path)
    if tail is None:
        return None
    lines = tail.decode("utf-8", errors="replace").splitlines()
    for line in reversed(lines):
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("event") in (
            "preempted",
            "finished",
            "error",
            "started",
        ):
            return event
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Print whether the node's ranks all ended preempted, and at which step; 0 if they did."""
    args = list(argv if argv is not None else sys.argv[1:])
    since = None
    if "--since" in args:
        at = args.index("--since")
        try:
            since = float(args[at + 1])
        except (IndexError, ValueError):
            print(
                "runtime.preemption: --since needs a time in unix seconds",
                file=sys.stderr,
            )
            return 2
        del args[at : at + 2]
    run_dir, first, count = args[:3]
    ranks = range(int(first), int(first) + int(count))
    step = preempted_step(Path(run_dir), ranks, since)
    if step is None:
        return 1
    print(f"ranks {ranks[0]}-{ranks[-1]} preempted at step {step}, checkpoint saved")
    return 0


if __name__ == "__main__":
    sys.exit(main())
