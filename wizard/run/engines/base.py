"""The one interface every engine that starts a job's nodes implements.

An engine turns a `Launch` (which project, which nodes, which run folder, what
environment the ranks need) into running nodes, and answers for them: `dry_run`
says exactly what `submit` would send or execute, `submit` starts the job,
`describe` reports where it stands, `stream` hands over the engine's own lines
(a job pending, a node started), `cancel` stops everything. The supervisor
(wizard.run.job) and the monitor only talk to this interface; the ranks report
through the status stream whatever started them.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wizard.answers.model import Answers
from wizard.errors import WizardError

PENDING, RUNNING, ENDED = "pending", "running", "ended"


class EngineError(WizardError):
    """The engine cannot start or reach the job; the message names what and how to fix it."""

    exit_code = 1


@dataclass(frozen=True)
class Launch:
    """What to start: the project, its nodes, the run folder and the ranks' extra environment."""

    project: Path
    answers: Answers
    nodes: tuple[int, ...]
    run_dir: Path
    env: Mapping[str, str]
    train_args: tuple[str, ...] = ()
    grace: float = 4.0
    spares: Mapping[int, str] = field(default_factory=dict)
    """Node ranks a spare host (network.spare_hosts) has taken after a failure, each with that host's address."""
    excluded: tuple[str, ...] = ()
    """Hosts the scheduler must not place the job on (Slurm's --exclude): nodes that failed an earlier attempt."""


@dataclass(frozen=True)
class StatusPlan:
    """Where the runner listens for the ranks' status stream and the address the ranks are given."""

    listen: str | None
    """The address to bind (None: another node's runner listens, nothing here)."""
    port: int
    advertise: str
    """The host the ranks connect to."""


@dataclass(frozen=True)
class Description:
    """Where a submitted job stands, in the engine's terms."""

    state: str
    """pending, running or ended."""
    exit_codes: Mapping[int, int | None] = field(default_factory=dict)
    """Each node's launcher's exit code once known (None while it runs)."""
    reason: str | None = None
    """The engine's own words on the job (Slurm's state and reason, an ssh error), if any."""


class Engine(abc.ABC):
    """Starts, follows and stops the nodes of one job."""

    name: str = ""
    recovery: str = "spares"
    """What a restart may change of the hosts: "spares" (a spare host takes a lost node's rank), "exclude"
    (the scheduler is told to keep the failed node off the job), "operator" (the operator restarts by itself)."""
    passes_env: bool = True
    """Whether every rank gets `Launch.env` (NPU_WIZARD_RESUMING among it); False where the ranks start as a
    manifest says (Kubernetes)."""

    @abc.abstractmethod
    def dry_run(self, launch: Launch) -> str:
        """Exactly what `submit` would run or send, as text; runs nothing."""

    def nodes_to_start(self, answers: Answers, node: int | None, all_nodes: bool) -> tuple[int, ...]:
        """The nodes this runner starts: every node of the job, for an engine that reaches them all."""
        if node is not None:
            raise EngineError(f"--node {node}: the {self.name} engine starts every node itself; run without --node")
        return tuple(range(answers["nodes"]))

    def manual_steps(self, launch: Launch) -> str | None:
        """What to run by hand where this machine cannot submit the job itself (no client tool); None where it can."""
        return None

    def fresh_refusal(self, project: Path, answers: Answers) -> str | None:
        """Why `run --fresh` cannot set this project's checkpoints aside from here; None where it can."""
        return None

    def check(self, launch: Launch) -> None:  # noqa: B027 - most engines have nothing to check
        """Refuse, before anything starts, a job that cannot start (an unreachable host)."""

    @abc.abstractmethod
    def status_plan(self, launch: Launch, port: int | None) -> StatusPlan:
        """Where this runner hosts the status stream so that every node's ranks reach it."""

    @abc.abstractmethod
    def submit(self, launch: Launch) -> str:
        """Start the job; return its id in the engine's terms."""

    @abc.abstractmethod
    def describe(self) -> Description:
        """Where the job stands now."""

    def stream(self) -> list[str]:
        """The engine's own lines since the last call (state changes, node starts)."""
        return []

    def ask_to_save(self) -> bool:
        """Send every rank SIGTERM, which makes it save a checkpoint and exit; False where this engine cannot."""
        return False

    @abc.abstractmethod
    def cancel(self, prompt: bool = False) -> None:
        """Stop every process of the job on every node; return once they are gone.

        `prompt`: a rank is dead or hung, so no rank can save a checkpoint: nothing waits for one
        (a stop signal the ranks would take for a request to save is not waited out).
        """

    def node_log(self, launch: Launch, node: int) -> str:
        """Where node's launch script writes its log, as the user finds it (on another host: HOST:PATH)."""
        return str(launch.run_dir / "logs" / f"node-{node}.log")

    def local_nodes(self) -> frozenset[int]:
        """Nodes whose processes run on this host (their ranks' pids can be watched here)."""
        return frozenset()

    def host_of(self, node: int) -> str | None:
        """The host node ran on in the job last submitted (None where this engine cannot tell)."""
        return None

    def node_health(self, launch: Launch, nodes: list[int]) -> dict[int, list[str]]:
        """For each node on another host: what keeps it from taking part again (unreachable, processes left)."""
        return {}

    def spare_problems(self, launch: Launch, host: str) -> list[str]:
        """What keeps spare `host` from taking a node's place (its device network); [] where fine or unchecked."""
        return []

    def seed_spares(self, launch: Launch, spares: dict[int, str], donor: int) -> list[str]:
        """Give spares that just took a node's rank what they need to resume (a checkpoint); what went wrong."""
        return []

    def summary_fields(self) -> dict[str, Any]:
        """What this engine adds to summary.json (such as the restarts its scheduler made); {} where nothing."""
        return {}

    def probe_rank(self, launch: Launch, rank: int, host: str | None, pid: int) -> tuple[str, str] | None:
        """On `host`, another host's rank that did not answer: its /proc/PID/stat line and faulthandler's stacks.

        Runs on that host, bounded in time: reads the process's state, sends it
        SIGUSR2 where it has a handler for it, and returns (stat line, the new
        end of logs/rank-N.stacks.txt); None where this engine cannot run a
        command on the rank's host.
        """
        return None
