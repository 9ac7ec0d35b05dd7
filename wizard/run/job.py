"""`npu-wizard run`: supervise a rendered project's job from its start to its end.

A `Job` has the engine start this node's launch script (or every node's, when
all of them are simulated on this host) in a run folder of its own (launch.py),
hosts the status stream that every rank of every node reports to, and on each
`tick` folds the ranks' events into a `JobState` (intake.py). The first failure
(a launcher exiting non-zero, a rank's error, a rank whose process vanished, or
a hang with --abort-on-hang) stops every process of the job and names the root
cause (verdict.py). The plain view (wizard.monitor.plain) and the live view
(wizard.monitor.app) both drive the same `Job`, through the `RunningJob`
protocol wizard.monitor defines.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TextIO

from runtime.preemption import PREEMPTED_EXIT
from runtime.status import ENV_STATUS_ADDR, ENV_STATUS_TOKEN
from wizard.answers.script import is_foreign
from wizard.atomic_files import write_json
from wizard.errors import TargetError, cannot_write
from wizard.memory.estimate import ModelUnknown, with_model_folder
from wizard.memory.fit import advise, run_capacity, to_record
from wizard.monitor.attach import RUN_FILE
from wizard.monitor.hang_verdict import HangVerdict, hang_summary
from wizard.monitor.ranks import Failure, where
from wizard.monitor.state import START_MARGIN_S, JobState
from wizard.monitor.status_server import StatusServer
from wizard.monitor.stop_text import stop_words
from wizard.monitor.summary_text import launcher_exit, launcher_log, summarize
from wizard.run.attempts import Attempts
from wizard.run.bandwidth import print_bandwidth_report
from wizard.run.checkpoints import checkpoint_dir, epochs_asked, max_steps_asked, nothing_to_train
from wizard.run.engines import Engine, Launch, engine_for
from wizard.run.engines.base import ENDED
from wizard.run.hosts import HostPlan
from wizard.run.intake import Intake
from wizard.run.job_restarts import JobRestarts
from wizard.run.job_stacks import JobStacks
from wizard.run.launch import RunOptions, address, launch_for, load_project, new_run_dir, restart_note
from wizard.run.profile_asks import StragglerProfiles, straggler_profiles
from wizard.run.resuming import Unfinished, resuming_note, unfinished_run
from wizard.run.secret_marks import record_secret_marks
from wizard.run.smoke import print_smoke_report
from wizard.run.teardown import Teardown, no_save_reason
from wizard.run.verdict import engine_failure, failure_words, hang_failure, launcher_failure, outcome_error
from wizard.stopping import STOP_SIGNALS, main_thread, stop_signals_raise


class Job(JobStacks, JobRestarts):
    """One run of a project on this host: its node processes, its state and its end."""

    def __init__(
        self,
        project: Path,
        options: RunOptions,
        *,
        fresh: bool = False,
        clock: Callable[[], float] = time.time,
        ticker: Callable[[], float] = time.monotonic,
    ) -> None:
        """`clock`: wall time, for what is shown and written; `ticker`: every duration judged (hangs, deadlines)."""
        self.project = project.resolve()
        self.options = options
        self.answers = load_project(self.project)
        self.engine: Engine = engine_for(self.answers)
        self.nodes = list(self.engine.nodes_to_start(self.answers, options.node, options.all_nodes))
        self.clock = clock
        self.ticker = ticker
        self.state = self._new_state()
        # the ranks present it to node 0's status stream; every node's runner must hand its ranks the same one
        self.status_token = {**os.environ, **options.env}.get(ENV_STATUS_TOKEN) or secrets.token_hex(16)
        self.run_dir = new_run_dir(self.project)
        self.notes: list[str] = []
        # the project's last training run, where it did not finish: this run's first attempt resumes (not --fresh)
        self.resumes: Unfinished | None = None
        if not fresh and "--smoke" not in options.train_args:
            self.resumes = unfinished_run(self.project, self.run_dir)
        if self.resumes is not None:
            resume_args = self.answers.get("training.resume_args") or ()
            manifest = None if self.engine.passes_env else f"k8s/{self.engine.name}.yaml"
            self.notes.append(resuming_note(self.resumes, resume_args, manifest))
        self.engine_lines: list[str] = []
        self.job_id: str | None = None
        self.engine_reason: str | None = None
        self.submitted = False
        self.started_at = clock()
        self.ended_at: float | None = None
        self.outcome: str | None = None  # finished, failed, hung, interrupted, preempted (every rank saved)
        self.stop_signal: int = signal.SIGINT  # what interrupted the job, for the exit code
        self.stopped = False  # the user or a signal stopped the runner (not the ranks' own preemption)
        self.say: Callable[[str], None] = lambda line: None  # a line for the user now (the plain view prints it)
        self.failure: Failure | None = None
        self.summary: dict | None = None
        self.unwritten: list[str] = []  # records of the run a full or read-only disk refused
        self.teardown = Teardown(options.save_grace)  # how the job was stopped (summary.json's teardown)
        self.intake = Intake(self.state, self.run_dir)
        restarts = self.answers["run.restarts"] if options.restarts is None else options.restarts
        if restarts and self.engine.recovery == "operator":  # its manifest carries run.restarts as rendered
            rendered = self.answers["run.restarts"]
            manifest = f"k8s/{self.engine.name}.yaml"
            self.notes.append(
                f"note: --restarts {restarts}: under {self.engine.name} the operator restarts the job, as its "
                + (
                    f"manifest says (runPolicy.backoffLimit {rendered} in {manifest}, from run.restarts)"
                    if rendered
                    else f"manifest says, and {manifest} asks for no restart (run.restarts 0)"
                )
                + "; npu-wizard run does not start it again on top (set run.restarts and render again to change it)"
            )
            restarts = 0
        self.attempts = Attempts(restarts, clock=clock, ticker=ticker)
        self.hosts = HostPlan.for_answers(self.answers)  # spares taking failed nodes' ranks, Slurm exclusions
        self.failed_node: int | None = None
        self.submitted_launch: Launch | None = None  # what the engine was given, status stream included
        self.stacks: dict[int, dict] | None = None  # where each rank was at the last collection (RUN/hang/)
        self.hang_verdict: HangVerdict | None = None  # wizard.monitor.hang_verdict's judgement of them
        self._hang_seen = False  # within one hang episode the stacks are collected once
        self.profiles: StragglerProfiles | None = straggler_profiles(options.profile, options.profile_ranks)
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

    def _new_state(self) -> JobState:
        """An empty state for an attempt of the job."""
        options = self.options
        start_deadline = options.start_timeout or self.answers["network.connect_timeout"] + START_MARGIN_S
        state = JobState(
            self.answers.world_size,
            hang_after=options.hang_after,
            clock=self.clock,
            ticker=self.ticker,
            nodes=self.answers["nodes"],
            start_deadline=start_deadline,
        )
        if 0 not in self.nodes:  # no status stream here: only this node's ranks can be heard
            state.expected = {r for n in self.nodes for r in self._ranks_of(n)}
        return state

    # ---- start ---------------------------------------------------------------------

    def launch(self) -> Launch:
        """What the engine is asked to start: the nodes, the run folder, the ranks' extra environment."""
        resuming = self.resumes is not None
        return launch_for(self.project, self.answers, self.nodes, self.run_dir, self.options, resuming=resuming)

    def _memory_estimate(self) -> dict | None:
        """The estimate per rank against the device (wizard/memory): an out-of-memory root cause quotes it."""
        if is_foreign(self.answers["training.script"]):
            return None
        ranks_here = len(self.nodes) * self.answers["devices_per_node"]
        values = with_model_folder(self.answers.values, self.project)
        try:
            return to_record(advise(values, run_capacity(values, ranks_here)))
        except ModelUnknown:  # an hf model folder not on this machine: the ranks check it at start-up
            return None

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
            "smoke": "--smoke" in self.options.train_args,
            "resumes": None if self.resumes is None else self.resumes.run_dir.name,
            "memory_estimate": self._memory_estimate(),
        }
        try:
            write_json(self.run_dir / RUN_FILE, info)
            record_secret_marks(self.run_dir, {**os.environ, **launch.env})  # for a bundle made from any shell
        except OSError as error:  # nothing started yet: the run folder goes, empty but for what failed
            shutil.rmtree(self.run_dir, ignore_errors=True)
            raise TargetError(cannot_write(self.run_dir / RUN_FILE, error, ", so nothing was started")) from None
        self.submitted_launch = launch
        self.job_id = self.engine.submit(launch)
        self.submitted = True  # from here on the job's processes exist: whatever ends the runner must stop them
        try:
            write_json(self.run_dir / RUN_FILE, {**info, "job_id": self.job_id})
        except OSError as error:
            raise TargetError(cannot_write(self.run_dir / RUN_FILE, error, ", so the job was stopped")) from None
        self.intake.local_ranks = {r for n in self.engine.local_nodes() for r in self._ranks_of(n)}

    def _open_status_stream(self, launch: Launch) -> str | None:
        plan = self.engine.status_plan(launch, self.options.status_port)
        if plan.listen is None:
            return address(plan.advertise, plan.port) if plan.advertise else None
        try:
            self.intake.server = StatusServer(
                plan.listen, plan.port, self.status_token, clock=self.clock, ticker=self.ticker
            )
        except OSError as error:
            self.notes.append(
                f"warning: cannot listen on {plan.listen}:{plan.port} for the ranks' status ({error}); "
                "this monitor sees only this node's ranks (choose another --status-port)"
            )
            return None
        return address(plan.advertise, self.intake.server.bound_port)

    def _ranks_of(self, node: int) -> range:
        per_node = self.answers["devices_per_node"]
        return range(node * per_node, (node + 1) * per_node)

    # ---- supervise -----------------------------------------------------------------

    def tick(self) -> str | None:
        """Read what happened since the last tick; return the outcome once the job ended."""
        if self.outcome is not None:
            return self.outcome
        if self.attempts.waiting:
            return self._restart_when_healthy()
        self.intake.look(self.clock())
        if self.profiles is not None:  # --profile-ranks straggler: ask a flagged rank and a median one
            for line in self.profiles.look(self.state, self.intake, self.clock()):
                self.say(line)
        self.attempts.note_progress(self.state)
        description = self.engine.describe()
        self._note_launchers(description.exit_codes)
        self.engine_lines.extend(self.engine.stream())
        self.engine_reason = description.reason or self.engine_reason
        codes = description.exit_codes
        for node in (node for node, code in codes.items() if code == 0):
            self.state.launcher_succeeded(node)
        if codes and all(code is not None for code in codes.values()):
            self.intake.ingest()  # each rank's last word, before its launcher's code is judged
            if self.state.preempted() is not None:
                return self._end("preempted", None)
        # a node whose ranks saved on a stop signal exits PREEMPTED_EXIT: no failure, the others follow
        ended = (None, 0, PREEMPTED_EXIT)
        failed_node = next((node for node, code in sorted(codes.items()) if code not in ended), None)
        ended_well = [node for node, code in codes.items() if code == 0]
        if failed_node is not None:
            failure = self.intake.settled_root_cause(self.clock(), ended_well)
            return self._fail(failure or self._launcher_failure(failed_node, codes[failed_node]))
        self._collect_at_hang()
        self._collect_when_asked()
        cause = self.state.root_cause()
        if self.options.max_restarts == 0 and cause is not None and not self._launcher_yet_to_say(cause, codes):
            return self._fail(self.intake.settled_root_cause(self.clock(), ended_well))
        if self._hang_ends_attempt():
            return self._failed("hung", hang_failure(self.state, self.clock(), self.hang_verdict))
        if description.state == ENDED:
            self.intake.ingest()
            if codes and all(code == 0 for code in codes.values()):
                return self._end("finished", None)
            failure = self.intake.settled_root_cause(self.clock(), ended_well)
            return self._fail(failure or engine_failure(self.engine.name, self.engine_reason, self.clock()))
        return None

    def _launcher_yet_to_say(self, cause: Failure, codes: Mapping[int, int | None]) -> bool:
        """True while a vanished rank's launcher runs and has not logged how the rank's process ended.

        torchrun logs a worker's exit code or signal only after it has stopped the other workers:
        stopping torchrun before then loses the signal from the report. And a rank that ended with
        exit code 0 without a word (os._exit(0), a C library's exit) is no failure: its launcher
        says nothing of it and, once its other ranks are done, exits 0 (seconds later on a busy
        host). Its word is waited for, for as long as it runs; --abort-on-hang still ends the job
        meanwhile when the ranks left hang (they may wait on the vanished one: its launcher never exits).
        """
        if cause.kind != "vanished" or cause.node not in codes or codes[cause.node] is not None:
            return False
        if cause.node is None or launcher_log(self.run_dir, cause.node) is None:
            return False  # no log of that launcher here to wait for
        return launcher_exit(self.run_dir, cause) is None

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

    def _launcher_failure(self, node: int, code: int | None) -> Failure:
        # on another host (ssh) the log is there, not in this run folder: HOST:PATH
        return launcher_failure(self.run_dir, self.engine.node_log(self.launch(), node), node, code, self.clock())

    def _fail(self, failure: Failure | None) -> str | None:
        return self._failed("failed", failure)

    def _hang_ends_attempt(self) -> bool:
        """True at a hang that --abort-on-hang ends, or that --restarts restarts.

        --restarts takes a hung or stalled rank for a failure only once a rank of the attempt
        reported a step: before that, a slow start (imports, data, a loaded host) looks the same.
        In the last attempt too: `_failed` then ends the job, hung, its restarts used up.
        """
        if self.options.abort_on_hang and (self.state.hung() or self.state.stalled() or self.state.late()):
            return True
        stepped = any(view.steps_reported for view in self.state.ranks.values())
        return self.attempts.allowed > 0 and stepped and bool(self.state.hung() or self.state.stalled())

    # ---- stop ----------------------------------------------------------------------

    def stop(self, outcome: str = "interrupted", signum: int = signal.SIGINT) -> str:
        """Stop every process of the job (the user or a signal asked); return the outcome.

        The ranks are first sent SIGTERM and given --save-grace seconds to save a
        checkpoint at their next logged step and exit: the outcome is then
        "preempted". Whatever still runs after that is killed. A job with a rank
        dead or hung is stopped at once: no rank can save (wizard/run/teardown.py).
        """
        if self.outcome is None:
            self.stop_signal, self.stopped = signum, True
            self.teardown.began()
            blocked = no_save_reason(self.state) if self.submitted else None
            if blocked is not None:
                self.teardown.no_save_because = blocked
                self.say(
                    f"stopping: no rank can save a checkpoint ({blocked}: the others wait for it in a collective); "
                    f"stopping every process now, without the {self.options.save_grace:g} s save grace"
                )
            elif outcome == "interrupted" and self._saved_on_stop():
                outcome = "preempted"
        return self._end(outcome, None)

    def _saved_on_stop(self) -> bool:
        """Ask every rank to save and exit; wait up to the save grace for the job to end; True if all saved."""
        grace = self.options.save_grace
        if not self.submitted or grace <= 0 or not self.engine.ask_to_save():
            return False
        self.state.stopping()
        self.say(stop_words(self.state, own_script=is_foreign(self.answers["training.script"]), grace=grace))
        asked = time.monotonic()
        deadline = asked + grace
        try:
            with stop_signals_raise():
                while time.monotonic() < deadline and self.engine.describe().state != ENDED:
                    self.intake.look(self.clock())
                    time.sleep(0.2)
        except KeyboardInterrupt:
            self.say("stopping: asked again: killing the job now")
        self.teardown.waited_for_saves_s = time.monotonic() - asked
        self.intake.ingest()
        return self.state.preempted() is not None

    def interrupted(self, signum: int) -> None:
        """A signal reached the runner: stop the job if it was submitted; before that there is nothing to stop."""
        if self.submitted:
            self.stop("interrupted", signum)
            return
        self.intake.close()
        self.outcome, self.stop_signal, self.stopped = self.outcome or "interrupted", signum, True

    def abandon(self, error: BaseException) -> None:
        """The runner itself failed (`error`): stop every process of the job rather than leave it unsupervised.

        Only a job this runner submitted is stopped: a refused start (a check,
        an apply the cluster refused) has nothing of its own to stop, and
        cancelling could reach a job of the same name it never started.
        """
        if self.outcome is not None:
            return
        self.intake.close()  # first: its connections' descriptors are what stopping needs
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
            self.teardown.began()
            self.state.stopping()
            self._stop_processes(self._prompt_stop(outcome, failure))
            self.teardown.done()
            self.intake.ingest()
            self.engine_reason = self.engine.describe().reason or self.engine_reason
        self.engine_lines.extend(self.engine.stream())
        self.outcome, self.failure, self.ended_at = outcome, failure, self.clock()
        self.intake.close()
        if not self.attempts.waiting:
            self.attempts.ended(outcome, failure, self.state, self.ended_at)
        self.attempts.restart_at = None
        self.summary = summarize(
            self.state,
            started_at=self.started_at,
            ended_at=self.ended_at,
            outcome=outcome,
            failure=failure,
            run_dir=self.run_dir,
        )
        server = self.intake.server
        visible = self.state.ranks if server is not None else self.intake.local_ranks
        self.summary["never_reported"] = sorted(r for r in visible if self.state.ranks[r].last_seen is None)
        self.summary.update(self.engine.summary_fields())  # what the engine's scheduler did (restarts, exclusions)
        self.summary.update(self.hosts.summary_fields())  # spares that took a node's place, nodes kept off
        if server is not None:
            self.summary["status_stream"] = dict(vars(server.counts))
        self.attempts.cover_summary(self.summary, self.state, started_at=self.started_at)
        self.summary["job_restarts"] = self.attempts.restarts
        if self.profiles is not None and not self.state.profile_asks:  # --profile-ranks straggler, none flagged
            self.summary["profile"] = {**(self.summary.get("profile") or {}), "no_straggler": True}
        self.summary["attempts"] = self.attempts.records()
        if outcome != "finished":
            self.summary["teardown"] = self.teardown.record()
        hang = hang_summary(self.run_dir)  # the ranks' stacks, where they were collected at a hang
        if hang is not None:
            self.summary["hang"] = hang
        try:
            write_json(self.run_dir / "summary.json", self.summary)
        except OSError as error:  # the summary is still printed; the run folder lacks it
            self.unwritten.append(cannot_write(self.run_dir / "summary.json", error))
        return outcome

    def _prompt_stop(self, outcome: str, failure: Failure | None) -> bool:
        """True when no rank can save: the job fails for a dead or hung rank, or was stopped with one."""
        if self.teardown.no_save_because is not None:
            return True
        if outcome not in ("failed", "hung") or (failure is not None and failure.kind == "runner"):
            return False  # the runner's own failure: the ranks may be healthy, and the engine's stop lets them save
        self.teardown.no_save_because = (
            no_save_reason(self.state) or f"{where(failure.rank, failure.node) if failure else 'the job'} failed"
        )
        return True

    def _stop_processes(self, prompt: bool = False) -> None:
        """Have the engine stop every process of the job on every node (`prompt`: no rank can save)."""
        # a second Ctrl-C, TERM or HUP must not cut the stopping short and orphan what is left
        stoppers = (signal.SIGINT, *STOP_SIGNALS)
        previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in stoppers} if main_thread() else {}
        try:
            self.engine.cancel(prompt=prompt)
        finally:
            for sig, action in previous.items():
                signal.signal(sig, action)

    # ---- words ---------------------------------------------------------------------

    @property
    def interval(self) -> float:
        """Seconds between two progress lines of the plain view."""
        return self.options.interval

    @property
    def attempt_words(self) -> str:
        """Which attempt of the job runs (run --restarts), for the live view; empty for a job started once."""
        return self.attempts.words(self.clock())

    def report(self) -> str:
        """The failure report, or the hang report, for the end of a failed run."""
        return failure_words(self.failure, self.run_dir, self.engine.name, self.engine_reason)

    def raise_for_outcome(self) -> None:
        """Raise RunFailed or RunInterrupted unless the job finished."""
        preempted = (self.summary or {}).get("preempted")
        error = outcome_error(
            self.outcome,
            self.report(),
            self.run_dir,
            self.stop_signal if self.stopped else None,
            self.submitted,
            preempted_step=preempted["step"] if preempted else None,
        )
        if error is not None:
            raise error

    def finished_note(self) -> str | None:
        """The words for a finished job that trained nothing (its checkpoint already completed the epochs)."""
        if self.outcome != "finished" or self.answers.get("training.epochs") is None:  # a script of the user's own
            return None
        epochs = epochs_asked(self.options.train_args, self.answers["training.epochs"])
        folder = checkpoint_dir(self.project, {**os.environ, **self.options.env})
        args = (*self.options.train_args, *self.options.extra_args)  # the last --max-steps is the script's
        max_steps = max_steps_asked(args, self.answers.get("training.max_steps") or 0)
        return nothing_to_train(self.state, epochs, folder, max_steps)

    def print_smoke_report(self, out: TextIO) -> None:
        """The per-rank smoke report of a --smoke run (wizard/run/smoke.py) and its network check (bandwidth.py)."""
        if "--smoke" in self.options.train_args:
            print_smoke_report(self.run_dir, self.answers.world_size, out)
        if "--bandwidth" not in self.options.train_args or self.outcome != "finished":
            return
        if 0 in self.nodes:
            print_bandwidth_report(self.run_dir, self.answers, out)
        else:  # rank 0 reports to node 0's runner, through the status stream
            print("bandwidth: measured by rank 0: node 0's runner prints the table and writes bandwidth.json", file=out)
