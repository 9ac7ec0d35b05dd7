"""Hearing the ranks: every rank's events, from this node's event files and node 0's status stream, into a JobState."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from runtime.status import LOST
from wizard.monitor import procs
from wizard.monitor.answers import Answers
from wizard.monitor.attach import REMOTE_DIR, catch_up
from wizard.monitor.ranks import Failure
from wizard.monitor.run_files import RegularFollower
from wizard.monitor.state import JobState
from wizard.monitor.status_server import StatusServer


class Intake:
    """Folds what the ranks said since the last look into the job's state; `server`: node 0's status stream."""

    def __init__(self, state: JobState, run_dir: Path) -> None:
        self.state = state
        self.run_dir = run_dir
        self.server: StatusServer | None = None
        self.local_ranks: set[int] = set()  # the engine says which nodes run here, once started
        self.answers = Answers()  # what the ranks answered to the runner's asks (stacks, ...)
        self.stale_pids: set[int] = set()  # the ranks of an earlier attempt of the job (run --restarts)
        self._followers = [RegularFollower(run_dir), RegularFollower(run_dir / REMOTE_DIR)]

    def ingest(self) -> None:
        """Read every new event into the state; a remote rank's are kept in the run folder too."""
        for follower in self._followers:
            catch_up(self.state, follower)
        if self.server is None:
            return
        for event in self.server.drain():
            if self.answers.take(event):
                continue
            if event["event"] == LOST and (self._still_running_here(event) or event.get("pid") in self.stale_pids):
                continue  # its connection did not come back, but the process is alive: the hang check watches it
            self.state.ingest(event)
            if event["rank"] not in self.local_ranks:
                self._record_remote(event)

    def ask(self, name: str, ranks: set[int] | None = None, **fields: object) -> str | None:
        """Ask every connected rank (or `ranks`) `name` on the status stream; the ask's id, or None without one."""
        if self.server is None:
            return None
        request = self.answers.open(name, **fields)
        self.server.ask(request, ranks)
        return str(request["id"])

    def settled_root_cause(self, now: float, ended_well: Iterable[int] = ()) -> Failure | None:
        """The root cause once the job is known to fail (at `now`): a rank whose connection dropped counts as lost.

        With the status stream, this host's ranks whose process is gone are looked for again, as `look`
        does: the last look may have come just before a rank was killed, and the error its peers then
        raised ("connection reset by peer") names no cause of its own; on a loaded host the failing
        launcher can exit before the next look, and the stream may not have read the connection's end
        yet. The stream tells when each connection ended, so a rank its launcher stopped after another
        rank's failure is not taken for the first. Without the stream this runner hears no other node:
        a local rank found gone now may have been stopped by its launcher after a remote rank died, and
        is left to `look`. `ended_well`: the nodes whose launcher exited 0 (their ranks all ended so).
        """
        gone = self.gone_ranks() if self.server is not None else []
        if self.server is not None:
            self.server.settle_losses()
        self.ingest()
        for rank, died in self.death_times(gone, now).items():
            self.state.vanished(rank, died)
        for node in ended_well:
            self.state.launcher_succeeded(node)
        return self.state.root_cause()

    def gone_ranks(self) -> list[int]:
        """This host's ranks whose process is gone without their saying how they ended."""
        return [rank for rank in self.local_ranks if self._pid_gone(rank)]

    def look(self, now: float) -> None:
        """Read every new event; this host's ranks whose process is gone without a word vanished.

        Several found gone in one look: each is stamped with when its status connection ended,
        so the first to die (a kill -9, say) is told from those its launcher stopped after it.
        """
        gone = self.gone_ranks()
        self.ingest()
        for rank, died in self.death_times(gone, now).items():
            self.state.vanished(rank, died)

    def death_times(self, ranks: list[int], default: float) -> dict[int, float]:
        """When each of this host's `ranks` died, as its status connection's end tells; else `default`."""
        ended = self.server.ended() if self.server is not None and ranks else {}
        times = {}
        for rank in ranks:
            view = self.state.ranks.get(rank)
            times[rank] = ended.get((rank, view.pid if view else None), default)
        return times

    def close(self) -> None:
        """Stop listening on the status stream."""
        if self.server is not None:
            self.server.close()

    def _record_remote(self, event: dict) -> None:
        path = self.run_dir / REMOTE_DIR / "events" / f"rank-{event['rank']}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as handle:
            handle.write(json.dumps(event, default=str) + "\n")

    def _still_running_here(self, event: dict) -> bool:
        pid = event.get("pid")
        return event["rank"] in self.local_ranks and isinstance(pid, int) and procs.is_alive(pid)

    def _pid_gone(self, rank: int) -> bool:
        view = self.state.ranks.get(rank)
        return view is not None and view.pid is not None and view.outcome is None and not procs.is_alive(view.pid)
