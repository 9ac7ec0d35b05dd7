"""Whole-job restarts (run --restarts): the part of `Job` between a failure and the next attempt.

After a failure a restart can fix, the job stops every node, waits until the failed node is free of the old
processes (wizard/run/attempts.py: no process of the job, npu-smi listing none of its pids, the master port
free; checked at every tick from the stop on, with a deadline as a safety net) and starts the whole job again
in the same run folder, its hosts chosen by wizard/run/hosts.py (a spare in a failed node's place, a Slurm node
kept off).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from wizard.atomic_files import write_json
from wizard.monitor.attach import RUN_FILE
from wizard.monitor.ranks import Failure
from wizard.monitor.run_files import RunFileError, read_json_object
from wizard.monitor.summary_text import launcher_exit
from wizard.run.attempts import keep_logs, node_health
from wizard.run.engines import EngineError, engine_for
from wizard.run.resuming import attempt_env

if TYPE_CHECKING:
    from wizard.answers.model import Answers
    from wizard.monitor.state import JobState
    from wizard.run.attempts import Attempts
    from wizard.run.engines import Engine, Launch
    from wizard.run.hosts import HostPlan
    from wizard.run.intake import Intake


class RestartsOfJob(Protocol):
    """What `JobRestarts` uses of `Job` (wizard.run.job), and all it uses: Job sets or defines each of these."""

    run_dir: Path
    answers: Answers
    clock: Callable[[], float]
    ticker: Callable[[], float]  # the monotonic clock: the wait between two attempts
    attempts: Attempts
    hosts: HostPlan
    intake: Intake
    state: JobState  # a restart gives the job a new one
    engine: Engine  # likewise
    nodes: list[int]  # the nodes started: a restart may choose others
    engine_lines: list[str]  # lines for the user: JobRestarts adds to them
    failed_node: int | None  # JobRestarts writes it
    submitted_launch: Launch | None  # what the engine was given: JobRestarts writes it
    job_id: str | None  # the engine's id of the job: JobRestarts writes it

    def launch(self) -> Launch:
        """What the engine is asked to start."""
        ...

    def _new_state(self) -> JobState:
        """An empty state for an attempt of the job."""
        ...

    def _stop_processes(self) -> None:
        """Stop every node's processes."""
        ...

    def _end(self, outcome: str, failure: Failure | None) -> str:
        """End the job with `outcome`; the outcome."""
        ...


class JobRestarts(RestartsOfJob):
    """`Job`'s restarts of the whole job (a part of wizard.run.job.Job, using what RestartsOfJob names)."""

    def _failed(self, outcome: str, failure: Failure | None) -> str | None:
        """End the job, or, where --restarts allows and a restart can fix it, stop it to start it again."""
        ended = launcher_exit(self.run_dir, failure) if failure is not None and failure.kind == "vanished" else None
        refusal = self.attempts.refusal(outcome, failure, self.state, ended)
        if refusal is not None:
            self.attempts.current.refused = refusal or None
            return self._end(outcome, failure)
        # at a hang, tick's _collect_at_hang has collected every rank's stacks (RUN/hang/) before this stop
        self.state.stopping()
        self._stop_processes(prompt=True)  # a dead or hung rank: no rank can save, the restart resumes from the last
        self.intake.settled_root_cause(self.clock())  # what the stopped ranks said last, into this attempt's state
        now = self.clock()
        wait = self.attempts.failed(failure, self.state, now)
        self.failed_node = self._node_of(failure)
        attempt = self.attempts.current
        kept = keep_logs(self.run_dir, attempt.number)
        self.engine_lines.append(
            f"RESTART {attempt.number} of {self.attempts.allowed}: attempt {attempt.number} failed at step "
            f"{attempt.failed_at_step}: {attempt.cause}; every node stopped"
            f"{f', its logs kept in {kept}' if kept else ''}; starting the whole job again from the newest "
            f"checkpoint every rank can load once the failed node is free of its processes (at most {wait:g}s)"
        )
        return None

    def _restart_when_healthy(self) -> str | None:
        """Between two attempts: as soon as the failed node is free of the old processes, start the job again."""
        tick = self.ticker()
        attempts = self.attempts
        if attempts.restart_at is None or tick < attempts.restart_at:
            return None
        failed = self.attempts.current
        pids = [view.pid for view in self.state.ranks.values() if view.pid is not None]
        # what this host can see: every node the manual engine ran; the master port where node 0 runs here
        problems = node_health(self.run_dir, self.answers, pids, master_here=0 in self.engine.local_nodes())
        launch = self.submitted_launch or self.launch()
        remote = self.hosts.remote_health(self.engine, launch)  # only where a spare may take a node's place
        if not problems and any(remote.values()) and not self.hosts.can_replace(remote):
            problems = [f"node {n}: {p}" for n, found in sorted(remote.items()) for p in found]
        if problems:
            if attempts.deadline is not None and tick >= attempts.deadline:
                said = f"node {failed.node}'s host" if failed.node is not None else "this host"
                failure = Failure(
                    None,
                    failed.node,
                    self.clock(),
                    "restart",
                    f"{said} was not healthy again in time: {'; '.join(problems)}",
                )
                self.attempts.current.refused = f"not restarted: {failure.summary}"
                return self._end("failed", failure)
            return None
        return self._start_again(failed.number + 1, remote)

    def _node_of(self, failure: Failure | None) -> int | None:
        """The node a failure names: its own, else its rank's."""
        if failure is None:
            return None
        if failure.node is not None:
            return failure.node
        return self.state.node_of(failure.rank) if failure.rank is not None else None

    def _start_again(self, number: int, health: Mapping[int, list[str]]) -> str | None:
        """Start attempt `number`: a fresh state and engine, the same run folder, status stream and token.

        The hosts may change (wizard/run/hosts.py): a spare in a failed node's place, a Slurm node kept off.
        """
        old_pids = {view.pid for view in self.state.ranks.values() if view.pid is not None}
        self.nodes = self.attempts.next_nodes(self.nodes, self.state.root_cause())
        old_engine, self.engine = self.engine, engine_for(self.answers)
        launch = self.submitted_launch or self.launch()
        # every rank of a later attempt resumes (training.resume_args): its number and NPU_WIZARD_RESUMING=1
        launch = replace(launch, nodes=tuple(self.nodes), env={**launch.env, **attempt_env(number, resuming=True)})
        try:
            launch = self.hosts.start_on(old_engine, self.engine, launch, self.failed_node, health, number)
        except EngineError as error:
            failure = Failure(None, self.failed_node, self.clock(), "restart", str(error))
            self.attempts.current.refused = f"not restarted: {error}"
            return self._end("failed", failure)
        self.engine_lines.extend(self.hosts.said)
        self.submitted_launch = launch
        # what the last attempt's ranks said is read into its own state first: a remote rank's lost connection,
        # recorded in the run folder as it ended, would otherwise be read again as the new attempt's rank vanishing
        self.intake.ingest()
        self.state = self._new_state()
        self.intake.state = self.state
        self.intake.stale_pids |= old_pids
        self.attempts.started_again(self.clock())
        self.engine_lines.append(f"attempt {number}: starting node(s) {', '.join(map(str, self.nodes))} again")
        self.job_id = self.engine.submit(launch)
        with contextlib.suppress(OSError, RunFileError):  # run.json names the first attempt's job otherwise
            info = read_json_object(self.run_dir / RUN_FILE)
            if info is not None:
                write_json(self.run_dir / RUN_FILE, {**info, "job_id": self.job_id, "attempt": number})
        return None
