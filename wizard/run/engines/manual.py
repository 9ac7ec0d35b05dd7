"""The manual engine: this node's launch script, or every node's when all are simulated on this host."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass

from wizard.answers.addresses import is_loopback
from wizard.answers.model import Answers
from wizard.errors import TargetError
from wizard.monitor import procs
from wizard.run.engines.base import ENDED, RUNNING, Description, Engine, EngineError, Launch, StatusPlan
from wizard.run.engines.common import ENV_SPARE_ADDR
from wizard.run.engines.interpreter import interpreter, launcher_problem
from wizard.stopping import deferred_signals


@dataclass
class NodeProcess:
    """One node's launch script, started in its own process group."""

    node: int
    process: subprocess.Popen[bytes]

    def stop(self, sig: int) -> None:
        """Send `sig` to every process of this node's group."""
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass


class ManualEngine(Engine):
    """Runs launch/nodeK.sh here, each in a process group of its own."""

    name = "manual"

    def __init__(self) -> None:
        self.processes: list[NodeProcess] = []
        self.launch: Launch | None = None

    def nodes_to_start(self, answers: Answers, node: int | None, all_nodes: bool) -> tuple[int, ...]:
        """This node, or every node when asked or when all of them are loopback (simulated here)."""
        if node is not None:
            if not 0 <= node < answers["nodes"]:
                raise TargetError(f"--node {node}: this project has nodes 0 to {answers['nodes'] - 1}")
            return (node,)
        if all_nodes or all(is_loopback(ip) for ip in answers["network.host_ips"]):
            return tuple(range(answers["nodes"]))
        raise TargetError("the nodes are separate hosts: run this on each node with --node N (node 0 on the master)")

    def status_plan(self, launch: Launch, port: int | None) -> StatusPlan:
        """Node 0's runner listens on the master address; the runners of other nodes point there."""
        answers = launch.answers
        master = answers["network.master_addr"]
        if 0 not in launch.nodes:
            return StatusPlan(None, port or answers["network.master_port"] + 1, master)
        # every node simulated here: any free port will do, the ranks learn it from the environment
        chosen = port or (0 if len(launch.nodes) > 1 else answers["network.master_port"] + 1)
        return StatusPlan(master, chosen, master)

    def check(self, launch: Launch) -> None:
        """The interpreter the launch scripts are given, and the launcher beside it, are here."""
        problem = launcher_problem(launch.answers, interpreter(launch.answers, launch.env))
        if problem is not None:
            raise EngineError(f"{problem}; nothing was started")

    def _command(self, launch: Launch, node: int) -> list[str]:
        return ["bash", str(launch.project / "launch" / f"node{node}.sh"), *launch.train_args]

    def dry_run(self, launch: Launch) -> str:
        """The command of each node started here, with the environment it adds."""
        env = " ".join(f"{key}={shlex.quote(value)}" for key, value in sorted(launch.env.items()))
        lines = [f"# manual engine: {len(launch.nodes)} node(s) started on this host, each in its own process group"]
        for node in launch.nodes:
            lines.append(
                f"cd {shlex.quote(str(launch.project))} && env {env} {shlex.join(self._command(launch, node))}"
            )
        return "\n".join(lines) + "\n"

    def submit(self, launch: Launch) -> str:
        """Start each node's launch script in a session of its own."""
        self.launch = launch
        env = {key: value for key, value in {**os.environ, **launch.env}.items() if key != ENV_SPARE_ADDR}
        # the interpreter's folder first on PATH: the torchrun beside it is the one the launch scripts start
        python = interpreter(launch.answers, launch.env)
        env["PATH"] = os.pathsep.join(filter(None, [os.path.dirname(python), env.get("PATH")]))
        for node in launch.nodes:
            # node K's script on a spare host (simulated here on loopback) takes the spare's address
            spare = {ENV_SPARE_ADDR: launch.spares[node]} if node in launch.spares else {}
            with deferred_signals():  # a signal between the fork and Popen's return would lose the node's launch
                process = subprocess.Popen(
                    self._command(launch, node),
                    env={**env, **spare},
                    start_new_session=True,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                self.processes.append(NodeProcess(node, process))
        return ",".join(str(node.process.pid) for node in self.processes)

    def describe(self) -> Description:
        """Each node's launch script's exit code (None while it runs)."""
        codes = {node.node: node.process.poll() for node in self.processes}
        state = ENDED if codes and all(code is not None for code in codes.values()) else RUNNING
        return Description(state, codes)

    def ask_to_save(self) -> bool:
        """SIGTERM each node's launch script, which passes it on once to its launcher or ranks: they save and exit.

        Only the scripts: torchrun stops its workers on the first TERM, and a second one cuts that short.
        """
        if self.launch is None:
            return False
        procs.signal_all((node.process.pid for node in self.processes), signal.SIGTERM)
        return True

    def cancel(self, prompt: bool = False) -> None:
        """TERM each node's launcher (it stops its ranks), then KILL whatever of the job is left.

        The launcher gets the stop grace (--grace), never the save grace, `prompt` or not.
        """
        if self.launch is None:
            return
        for node in self.processes:
            node.stop(signal.SIGTERM)
        deadline = time.monotonic() + self.launch.grace
        for node in self.processes:
            try:
                node.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for node in self.processes:
            node.stop(signal.SIGKILL)
        procs.kill_job(self.launch.run_dir, grace=1.0)
        for node in self.processes:
            node.process.wait()

    def host_of(self, node: int) -> str | None:
        """The address node's script ran with: its host IP, or the spare's that took its place."""
        if self.launch is None:
            return None
        return self.launch.spares.get(node) or self.launch.answers["network.host_ips"][node]

    def local_nodes(self) -> frozenset[int]:
        """Every node started here."""
        return frozenset(self.launch.nodes if self.launch else ())
