"""Between two attempts of `run --restarts`: which hosts the next attempt runs on.

A spare host (network.spare_hosts) takes a failed node's rank when that node's
host fails its health check (ssh cannot reach it, the run's processes are left
there) or the same host fails twice in a row. Node K's launch script then runs
on the spare with NPU_WIZARD_SPARE_ADDR, its HCCL_IF_IP (launch/nodeK.sh); the
ssh engine copies the project to the spare's remote_dir before it starts
anything, and the port plan is the job's, the same on every host. Node 0 is
never replaced: its address is the master address every node's script names,
so it is restarted in place. Spares are taken in the order given, each once.

Under Slurm the host of the failed node is kept off the resubmitted job
(`sbatch --exclude`) while the partition still has enough usable nodes
without it; where it has not, the job is resubmitted as it was, and the
summary says why.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from wizard.answers.model import Answers
from wizard.run.engines.base import Engine, EngineError, Launch
from wizard.run.engines.common import run_command

USABLE_STATES = frozenset({"idle", "mixed", "mix", "allocated", "alloc", "completing", "comp", "planned", "plnd"})
"""sinfo node states a job can still be placed on (a suffix such as * or ~ is stripped first)."""


@dataclass(frozen=True)
class Replacement:
    """One node rank moved to a spare host, or one node kept off a resubmitted job."""

    node: int
    replaced: str
    by: str | None  # the spare's address; None for a Slurm exclusion
    attempt: int  # the attempt that starts with it
    why: str

    def record(self) -> dict[str, Any]:
        """As summary.json lists it."""
        return dataclasses.asdict(self)

    def line(self) -> str:
        """One line for the plain output and the summary."""
        if self.by is None:
            return f"attempt {self.attempt}: node {self.node}'s host {self.replaced} kept off the job ({self.why})"
        moved = f"node {self.node} moved from {self.replaced} to spare host {self.by}"
        return f"attempt {self.attempt}: {moved} ({self.why})"


@dataclass
class HostPlan:
    """The hosts of each attempt: spares that took failed nodes' ranks, Slurm nodes kept off the job."""

    answers: Answers
    spares_left: list[str] = field(default_factory=list)
    taken: dict[int, str] = field(default_factory=dict)
    excluded: list[str] = field(default_factory=list)
    changes: list[Replacement] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    failures: list[tuple[int, str | None]] = field(default_factory=list)
    """(node, its host) of each failed attempt that named a node."""
    said: list[str] = field(default_factory=list)
    """The changes the last `start_on` made, as lines."""

    @classmethod
    def for_answers(cls, answers: Answers) -> HostPlan:
        """A plan with every spare host of the answers still free."""
        return cls(answers, spares_left=list(answers.get("network.spare_hosts") or ()))

    def next_launch(
        self, launch: Launch, engine: Engine, node: int | None, health: Mapping[int, list[str]], attempt: int
    ) -> Launch:
        """The launch of attempt `attempt`, after `node` (None: no node named) failed.

        `health` holds each remote node's problems (engine.node_health); `engine` is the one that ran the
        failed attempt: it says which host each node ran on.
        """
        host = engine.host_of(node) if node is not None else None
        twice = node is not None and bool(self.failures) and self.failures[-1] == (node, host)
        if node is not None:
            self.failures.append((node, host))
        if engine.recovery == "exclude":
            if node is not None:
                self._exclude(node, host, attempt)
        elif engine.recovery == "spares" and self.answers.get("network.spare_hosts"):
            unhealthy = {n: problems for n, problems in sorted(health.items()) if problems}
            for sick, problems in unhealthy.items():
                self._replace(engine, launch, sick, engine.host_of(sick), problems, False, attempt)
            if node is not None and node not in unhealthy and twice:
                self._replace(engine, launch, node, host, [], True, attempt)
        return dataclasses.replace(launch, spares=dict(self.taken), excluded=tuple(self.excluded))

    def start_on(
        self, old: Engine, new: Engine, launch: Launch, node: int | None, health: Mapping[int, list[str]], attempt: int
    ) -> Launch:
        """The launch `new` submits for attempt `attempt`, its new spares checked and given the checkpoints.

        Raises EngineError where a spare cannot be reached, holds another project's files, or cannot be given
        the checkpoints: the job then ends, saying so, rather than start without them.
        """
        before = len(self.changes)
        planned = self.next_launch(launch, old, node, health, attempt)
        newly = {n: spare for n, spare in planned.spares.items() if launch.spares.get(n) != spare}
        if newly:
            new.check(planned)  # every host of the attempt answers; the spare's folder is free or this project's
            problems = new.seed_spares(planned, newly, donor=0)  # node 0 is never replaced: it holds the newest
            if problems:
                raise EngineError("a spare host could not take its node's place: " + "; ".join(problems))
        self.said = [change.line() for change in self.changes[before:]]
        return planned

    def remote_health(self, engine: Engine, launch: Launch) -> dict[int, list[str]]:
        """Each node of the job on another host: what keeps it from taking part again (engine.node_health)."""
        remote = [node for node in launch.nodes if node not in engine.local_nodes()]
        if not remote or not self.answers.get("network.spare_hosts"):
            return {}
        return engine.node_health(launch, remote)

    def can_replace(self, health: Mapping[int, list[str]]) -> bool:
        """Whether a spare is left for every unhealthy node, so the restart need not wait for them to recover."""
        sick = [node for node, problems in health.items() if problems]
        return bool(sick) and 0 not in sick and len(sick) <= len(self.spares_left)

    def _replace(
        self, engine: Engine, launch: Launch, node: int, host: str | None, health: list[str], twice: bool, attempt: int
    ) -> None:
        if not health and not twice:
            return  # a first failure on a healthy host: restarted in place
        why = f"failed its health check: {'; '.join(health)}" if health else "failed twice in a row"
        where = f"node {node} ({host or '?'}) {why}"
        if node == 0:
            self.notes.append(
                f"{where}: node 0 holds the master address every node's script names, so it is restarted in place"
            )
            return
        spare = self._checked_spare(engine, launch, node)
        if spare is None:
            self.notes.append(f"{where}: no spare host left (network.spare_hosts), so it is restarted in place")
            return
        self.taken[node] = spare
        self.changes.append(Replacement(node, host or "?", spare, attempt, why))

    def _checked_spare(self, engine: Engine, launch: Launch, node: int) -> str | None:
        """The first spare left whose device network passes the engine's check; each that fails is skipped (and
        used no more), its reason noted."""
        while self.spares_left:
            spare = self.spares_left.pop(0)
            problems = engine.spare_problems(launch, spare)
            if not problems:
                return spare
            self.notes.append(f"spare host {spare} skipped for node {node}: {'; '.join(problems)}")
        return None

    def _exclude(self, node: int, host: str | None, attempt: int) -> None:
        if host is None:
            self.notes.append(f"node {node} failed; Slurm no longer names its host, so none is excluded")
            return
        if host in self.excluded:
            return
        usable = usable_nodes(self.answers.get("cluster.partition"))
        if usable is None:
            self.notes.append(f"{host} (node {node}) not excluded: sinfo cannot say which nodes are left")
            return
        left = sorted(set(usable) - {*self.excluded, host})
        needed = self.answers["nodes"]
        if len(left) < needed:
            self.notes.append(
                f"{host} (node {node}) not excluded: without it the partition has {len(left)} usable node(s) "
                f"({', '.join(left) or 'none'}) and the job needs {needed}; resubmitted on any node"
            )
            return
        self.excluded.append(host)
        self.changes.append(Replacement(node, host, None, attempt, f"sbatch --exclude={','.join(self.excluded)}"))

    def lines(self) -> list[str]:
        """Every change and note, in order, for the summary."""
        return [change.line() for change in self.changes] + self.notes

    def summary_fields(self) -> dict[str, Any]:
        """What summary.json keeps of the plan (nothing when no host changed and nothing was said)."""
        if not self.changes and not self.notes:
            return {}
        return {"hosts_changed": [change.record() for change in self.changes], "hosts_notes": list(self.notes)}


def usable_nodes(partition: str | None) -> list[str] | None:
    """The nodes of the partition (the default one where None) a job can still be placed on; None if sinfo fails."""
    command = ["sinfo", "--noheader", "--Node", "--format=%N %t"] + ([f"--partition={partition}"] if partition else [])
    result = run_command(command, timeout=30)
    if result.returncode != 0:
        return None
    usable = set()
    for line in result.stdout.splitlines():
        name, _, state = line.strip().partition(" ")
        if name and state.strip().rstrip("*~#!%$@^-").lower() in USABLE_STATES:
            usable.add(name)
    return sorted(usable)
