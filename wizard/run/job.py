"""`npu-wizard run`: start a rendered project's launch scripts and supervise the job.

A `Job` starts this node's launch script (or every node's, when all of them are
simulated on this host) in a run folder of its own, hosts the status stream
that every rank of every node reports to, and on each `tick` folds the ranks'
events into a `JobState`. The first failure (a launcher exiting non-zero, a
rank's error, a rank whose process vanished, or a hang with --abort-on-hang)
stops every process of the job and names the root cause. The plain view
(wizard.monitor.plain) and the live view (wizard.monitor.app) both drive the same `Job`.
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from runtime.events import ENV_HEARTBEAT, EventFollower
from runtime.status import ENV_STATUS_ADDR, ENV_STATUS_TOKEN, LOST, test_buffer_size
from wizard.answers.model import Answers, load_text
from wizard.errors import TargetError, WizardError
from wizard.monitor import procs
from wizard.monitor.attach import REMOTE_DIR, RUN_FILE, catch_up
from wizard.monitor.report import (
    failure_report,
    node_log_reason,
    summarize,
    write_json,
)
from wizard.monitor.state import DEFAULT_HANG_AFTER, START_MARGIN_S, Failure, JobState
from wizard.monitor.status_server import StatusServer
from wizard.run.engines import Engine, Launch, engine_for
from wizard.run.engines.base import ENDED
from wizard.stopping import STOP_SIGNALS, main_thread

GRACE_SECONDS = 4.0
RESTARTING_LAUNCHERS = ("torchrun", "torch-npu-run")


class RunFailed(WizardError):
    """The training job failed; the message names the root cause."""

    exit_code = 3


class RunInterrupted(WizardError):
    """The user stopped the job (Ctrl-C, the stop key, SIGTERM or SIGHUP); every process is gone."""

    exit_code = 130

    def __init__(self, message: str, signum: int = signal.SIGINT) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum


@dataclass(frozen=True)
class RunOptions:
    """How to run and watch the job; the defaults suit a first run."""

    node: int | None = None
    all_nodes: bool = False
    interval: float = 2.0
    hang_after: float = DEFAULT_HANG_AFTER
    start_timeout: float | None = None  # None: HCCL_CONNECT_TIMEOUT + START_MARGIN_S
    abort_on_hang: bool = False
    max_restarts: int = 0
    heartbeat: float = 2.0
    status_port: int | None = None
    grace: float = GRACE_SECONDS
    train_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)


def load_project(project: Path) -> Answers:
    """The answers a rendered project was made from."""
    answers_file = project / "answers.yaml"
    if not answers_file.is_file():
        raise TargetError(f"{project} is not an npu-wizard project (no answers.yaml); render one with --answers")
    return load_text(answers_file.read_text())


def nodes_to_start(answers: Answers, node: int | None, all_nodes: bool = False) -> list[int]:
    """The nodes a run of this project starts from here, as its engine decides."""
    return list(engine_for(answers).nodes_to_start(answers, node, all_nodes))


def restart_note(launcher: str, max_restarts: int) -> str | None:
    """What --max-restarts does with this launcher, when it cannot do what was asked."""
    if max_restarts > 0 and launcher not in RESTARTING_LAUNCHERS:
        return (
            f"note: the {launcher} launcher has no restart mechanism, so --max-restarts {max_restarts} is ignored: "
            "a failure stops the job; run again to resume from the last checkpoint "
            "(torchrun and torch-npu-run restart failed workers themselves)"
        )
    return None


def new_run_dir(project: Path) -> Path:
    """A fresh run folder under the project's runs/."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for suffix in range(1000):
        candidate = project / "runs" / (stamp if suffix == 0 else f"{stamp}-{suffix}")
        try:
            candidate.mkdir(parents=True)
        except FileExistsError:
            continue
        return candidate
    raise TargetError(f"cannot make a run folder under {project / 'runs'}")


class Job:
    """One run of a project on this host: its node processes, its state and its end."""

    def __init__(self, project: Path, options: RunOptions, *, clock: Callable[[], float] = time.time) -> None:
        self.project = project.resolve()
        self.options = options
        self.answers = load_project(self.project)
        self.engine: Engine = engine_for(self.answers)
        self.nodes = list(self.engine.nodes_to_start(self.answers, options.node, options.all_nodes))
        self.clock = clock
        start_deadline = options.start_timeout or self.answers["network.connect_timeout"] + START_MARGIN_S
        self.state = JobState(
            self.answers.world_size,
            hang_after=options.hang_after,
            clock=clock,
            nodes=self.answers["nodes"],
            start_deadline=start_deadline,
        )
        # the ranks present it to node 0's status stream; every node's runner must hand its ranks the same one
        self.status_token = {**os.environ, **options.env}.get(ENV_STATUS_TOKEN) or secrets.token_hex(16)
        self.run_dir = new_run_dir(self.project)
        self.notes: list[str] = []
        self.engine_lines: list[str] = []
        self.job_id: str | None = None
        self.engine_reason: str | None = None
        self.server: StatusServer | None = None
        self.submitted = False
        self.started_at = clock()
        self.ended_at: float | None = None
        self.outcome: str | None = None  # finished, failed, hung, interrupted
        self.stop_signal: int = signal.SIGINT  # what interrupted the job, for the exit code
        self.failure: Failure | None = None
        self.summary: dict | None = None
        self._followers = [EventFollower(self.run_dir), EventFollower(self.run_dir / REMOTE_DIR)]
        self._local_ranks: set[int] = set()  # the engine says which nodes run here, once started
        if 0 not in self.nodes:  # no status stream here: only this node's ranks can be heard
            self.state.expected = {r for n in self.nodes for r in self._ranks_of(n)}
        note = restart_note(self.answers["launcher"], options.max_restarts)
        if note:
            self.notes.append(note)
        if ENV_STATUS_TOKEN not in {**os.environ, **options.env} and len(self.nodes) < self.answers["nodes"]:
            self.notes.append(
                f"note: the other nodes' ranks may report here only with this run's token: on each, "
                f"export {ENV_STATUS_TOKEN}={self.status_token} before npu-wizard run --node N"
                if 0 in self.nodes
                else f"warning: {ENV_STATUS_TOKEN} is not set, so node 0's monitor will refuse this node's ranks: "
                "export the token node 0's runner printed"
            )

    # ---- start ---------------------------------------------------------------------

    def launch(self) -> Launch:
        """What the engine is asked to start: the nodes, the run folder, the ranks' extra environment."""
        return _launch(self.project, self.answers, self.nodes, self.run_dir, self.options)

    def start(self) -> None:
        """Check the engine can start the job, open the status stream, and have the engine start every node."""
        launch = self.launch()
        self.engine.check(launch)
        status_addr = self._open_status_stream(launch)
        if status_addr:
            launch = replace(
                launch, env={**launch.env, ENV_STATUS_ADDR: status_addr, ENV_STATUS_TOKEN: self.status_token}
            )
        info = {
            "project": str(self.project),
            "runner_pid": os.getpid(),
            "engine": self.engine.name,
            "nodes": self.nodes,
            "world_size": self.answers.world_size,
            "node_count": self.answers["nodes"],
            "launcher": self.answers["launcher"],
            "started_at": self.started_at,
            "hang_after": self.options.hang_after,
            "status_addr": status_addr,
        }
        write_json(self.run_dir / RUN_FILE, info)
        self.job_id = self.engine.submit(launch)
        self.submitted = True  # from here on the job's processes exist: whatever ends the runner must stop them
        write_json(self.run_dir / RUN_FILE, {**info, "job_id": self.job_id})
        self._local_ranks = {r for n in self.engine.local_nodes() for r in self._ranks_of(n)}

    def _open_status_stream(self, launch: Launch) -> str | None:
        plan = self.engine.status_plan(launch, self.options.status_port)
        if plan.listen is None:
            return _address(plan.advertise, plan.port) if plan.advertise else None
        try:
            buffer = test_buffer_size({**os.environ, **self.options.env})
            self.server = StatusServer(
                plan.listen, plan.port, self.status_token, clock=self.clock, receive_buffer=buffer
            )
        except OSError as error:
            self.notes.append(
                f"warning: cannot listen on {plan.listen}:{plan.port} for the ranks' status ({error}); "
                "this monitor sees only this node's ranks (choose another --status-port)"
            )
            return None
        return _address(plan.advertise, self.server.bound_port)

    def _ranks_of(self, node: int) -> range:
        per_node = self.answers["devices_per_node"]
        return range(node * per_node, (node + 1) * per_node)

    # ---- supervise -----------------------------------------------------------------

    def tick(self) -> str | None:
        """Read what happened since the last tick; return the outcome once the job ended."""
        if self.outcome is not None:
            return self.outcome
        now = self.clock()
        gone = [rank for rank in self._local_ranks if self._pid_gone(rank)]
        self._ingest()
        for rank in gone:
            self.state.vanished(rank, now)
        description = self.engine.describe()
        self._note_launchers(description.exit_codes)
        self.engine_lines.extend(self.engine.stream())
        self.engine_reason = description.reason or self.engine_reason
        codes = description.exit_codes
        failed_node = next((node for node, code in sorted(codes.items()) if code not in (None, 0)), None)
        if failed_node is not None:
            return self._fail(self._settled_root_cause() or self._launcher_failure(failed_node, codes[failed_node]))
        if self.options.max_restarts == 0 and self.state.root_cause() is not None:
            return self._fail(self._settled_root_cause())
        if self.options.abort_on_hang and (self.state.hung() or self.state.stalled() or self.state.late()):
            return self._end("hung", self._hang_failure())
        if description.state == ENDED:
            self._ingest()
            if codes and all(code == 0 for code in codes.values()):
                return self._end("finished", None)
            return self._fail(self._settled_root_cause() or self._engine_failure())
        return None

    def _note_launchers(self, codes: Mapping[int, int | None]) -> None:
        """Tell the state what became of each node's launch script this runner started or submitted, with its log."""
        if self.job_id is None:
            return
        launch = self.launch()
        for node, code in codes.items():
            log = self.engine.node_log(launch, node)
            if code is None:
                said = f"its launch script is running but its ranks never connected to this runner; see {log}"
            else:
                said = f"its launch script exited (code {code}); see {log}"
            self.state.launchers[node] = said

    def _ingest(self) -> None:
        for follower in self._followers:
            catch_up(self.state, follower)
        if self.server is None:
            return
        for event in self.server.drain():
            if event["event"] == LOST and self._still_running_here(event):
                continue  # its connection did not come back, but the process is alive: the hang check watches it
            self.state.ingest(event)
            if event["rank"] not in self._local_ranks:
                self._record_remote(event)

    def _settled_root_cause(self) -> Failure | None:
        """The root cause once the job is known to fail: a rank whose connection dropped counts as lost now."""
        if self.server is not None:
            self.server.settle_losses()
            self._ingest()
        return self.state.root_cause()

    def _record_remote(self, event: dict) -> None:
        path = self.run_dir / REMOTE_DIR / "events" / f"rank-{event['rank']}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as handle:
            handle.write(_json_line(event))

    def _still_running_here(self, event: dict) -> bool:
        pid = event.get("pid")
        return event["rank"] in self._local_ranks and isinstance(pid, int) and procs.is_alive(pid)

    def _pid_gone(self, rank: int) -> bool:
        view = self.state.ranks.get(rank)
        return view is not None and view.pid is not None and view.outcome is None and not procs.is_alive(view.pid)

    def _launcher_failure(self, node: int, code: int | None) -> Failure:
        # on another host (ssh) the log is there, not in this run folder: HOST:PATH
        log = self.engine.node_log(self.launch(), node)
        said = node_log_reason(self.run_dir, node)
        stopped = "stopped in its preflight" if any("preflight FAIL:" in line for line in said) else "exited"
        summary = f"its launch script {stopped} (exit code {code}) before any rank reported an error"
        if said:
            summary += f"; from {log}:\n" + "\n".join(f"  | {line}" for line in said)
        else:
            summary += f"; see {log}"
        return Failure(None, node, self.clock(), "launcher", summary)

    def _engine_failure(self) -> Failure:
        reason = self.engine_reason or "no reason given"
        return Failure(None, None, self.clock(), "engine", f"the {self.engine.name} job ended early: {reason}")

    def _hang_failure(self) -> Failure:
        now = self.clock()
        hung = self.state.hung(now)
        if not hung and self.state.late(now):
            return Failure(None, None, now, "missing", f"start-up deadline passed: {self.state.late_report(now)}")
        if not hung:
            return Failure(None, None, now, "hung", f"the job stalled: {self.state.hang_report(now)}")
        view = self.state.ranks[hung[0]]
        silent = now - (view.last_seen or now)
        others = f"; also hung: ranks {', '.join(map(str, hung[1:]))}" if hung[1:] else ""
        summary = (
            f"hung: no heartbeat or step for {silent:.0f}s at step {view.step} "
            f"(process {view.pid} stopped, frozen or unreachable?){others}"
        )
        return Failure(view.rank, view.node, now, "hung", summary, device=view.device, pid=view.pid)

    def _fail(self, failure: Failure | None) -> str:
        return self._end("failed", failure)

    # ---- stop ----------------------------------------------------------------------

    def stop(self, outcome: str = "interrupted", signum: int = signal.SIGINT) -> str:
        """Stop every process of the job now (the user or a signal asked); return the outcome."""
        if self.outcome is None:
            self.stop_signal = signum
        return self._end(outcome, None)

    def interrupted(self, signum: int) -> None:
        """A signal reached the runner: stop the job if it was submitted; before that there is nothing to stop."""
        if self.submitted:
            self.stop("interrupted", signum)
            return
        if self.server is not None:
            self.server.close()
        self.outcome, self.stop_signal = self.outcome or "interrupted", signum

    def abandon(self, error: BaseException) -> None:
        """The runner itself failed (`error`): stop every process of the job rather than leave it unsupervised.

        Only a job this runner submitted is stopped: a refused start (a check,
        an apply the cluster refused) has nothing of its own to stop, and
        cancelling could reach a job of the same name it never started.
        """
        if self.outcome is not None:
            return
        if self.server is not None:
            self.server.close()  # first: its connections' descriptors are what stopping needs
        if not self.submitted:
            return
        summary = f"npu-wizard run itself failed ({type(error).__name__}: {error}); the job was stopped"
        try:
            self._end("failed", Failure(None, None, self.clock(), "runner", summary))
        except BaseException:
            self.engine.cancel()  # the summary could not be written; the processes must still go
            raise

    def _end(self, outcome: str, failure: Failure | None) -> str:
        if self.outcome is not None:
            return self.outcome
        if outcome != "finished":
            self.state.stopping()
            self._stop_processes()
            self._ingest()
            self.engine_reason = self.engine.describe().reason or self.engine_reason
        self.engine_lines.extend(self.engine.stream())
        self.outcome, self.failure, self.ended_at = outcome, failure, self.clock()
        if self.server is not None:
            self.server.close()
        self.summary = summarize(
            self.state, started_at=self.started_at, ended_at=self.ended_at, outcome=outcome, failure=failure
        )
        visible = self.state.ranks if self.server is not None else self._local_ranks
        self.summary["never_reported"] = sorted(r for r in visible if self.state.ranks[r].last_seen is None)
        if self.server is not None:
            self.summary["status_stream"] = dict(vars(self.server.counts))
        write_json(self.run_dir / "summary.json", self.summary)
        return outcome

    def _stop_processes(self) -> None:
        """Have the engine stop every process of the job on every node."""
        # a second Ctrl-C, TERM or HUP must not cut the stopping short and orphan what is left
        stoppers = (signal.SIGINT, *STOP_SIGNALS)
        previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in stoppers} if main_thread() else {}
        try:
            self.engine.cancel()
        finally:
            for sig, action in previous.items():
                signal.signal(sig, action)

    # ---- words ---------------------------------------------------------------------

    def report(self) -> str:
        """The failure report, or the hang report, for the end of a failed run."""
        if self.failure is None:
            return "the job was stopped"
        report = failure_report(self.failure, self.run_dir)
        if self.engine_reason and self.engine_reason not in report:
            report += f"\n{self.engine.name}: {self.engine_reason}"
        return report

    def raise_for_outcome(self) -> None:
        """Raise RunFailed or RunInterrupted unless the job finished."""
        if self.outcome in ("failed", "hung"):
            raise RunFailed(f"the training run failed; {self.report()}\nevents, logs and summary in {self.run_dir}")
        if self.outcome == "interrupted":
            name = signal.Signals(self.stop_signal).name
            how = "interrupted" if self.stop_signal == signal.SIGINT else f"stopped by {name}"
            message = f"{how}: every process of the job was stopped; logs in {self.run_dir}"
            if not self.submitted:
                message = f"{how} before the job started: nothing of it is running"
            raise RunInterrupted(message, self.stop_signal)


def _launch(project: Path, answers: Answers, nodes: Sequence[int], run_dir: Path, options: RunOptions) -> Launch:
    env = {
        **options.env,
        "NPU_WIZARD_RUN_DIR": str(run_dir),
        "NPU_WIZARD_MAX_RESTARTS": str(options.max_restarts),
    }
    env.setdefault(ENV_HEARTBEAT, os.environ.get(ENV_HEARTBEAT, str(options.heartbeat)))
    return Launch(project, answers, tuple(nodes), run_dir, env, tuple(options.train_args), options.grace)


def dry_run(project: Path, options: RunOptions) -> str:
    """Exactly what a run would submit or execute (commands, batch script), without creating or starting anything."""
    project = project.resolve()
    answers = load_project(project)
    engine = engine_for(answers)
    nodes = engine.nodes_to_start(answers, options.node, options.all_nodes)
    launch = _launch(project, answers, nodes, project / "runs" / time.strftime("%Y%m%d-%H%M%S"), options)
    plan = engine.status_plan(launch, options.status_port)
    host = f"[{plan.advertise}]" if ":" in plan.advertise else plan.advertise
    port = str(plan.port) if plan.port else "<a free port, chosen at start>"
    token = "<this run's token>"
    launch = replace(launch, env={**launch.env, ENV_STATUS_ADDR: f"{host}:{port}", ENV_STATUS_TOKEN: token})
    return engine.dry_run(launch)


def manual_steps(project: Path, options: RunOptions) -> str | None:
    """The commands to run by hand where this machine cannot submit the job (no kubectl); None where it can."""
    project = project.resolve()
    answers = load_project(project)
    engine = engine_for(answers)
    nodes = engine.nodes_to_start(answers, options.node, options.all_nodes)
    launch = _launch(project, answers, nodes, project / "runs" / time.strftime("%Y%m%d-%H%M%S"), options)
    return engine.manual_steps(launch)


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _json_line(event: dict) -> str:
    import json

    return json.dumps(event, default=str) + "\n"


__all__: Sequence[str] = ["Job", "RunFailed", "RunInterrupted", "RunOptions"]
