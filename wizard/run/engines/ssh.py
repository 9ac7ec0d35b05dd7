"""The ssh engine: copy the project to every host, start each node there, stop them all together.

What is copied is what a rank needs, as git sees the project (ssh_copy): not .git/,
runs/, checkpoints/ or ignored files, unless `.npu-wizardignore` keeps them.

Every remote step goes through one ssh command: `ssh -o BatchMode=yes` (a missing
key fails at once instead of prompting), or the whole of NPU_WIZARD_SSH_COMMAND,
so the user's ~/.ssh/config, keys, jump hosts and ports apply. rsync copies the
project over that same ssh. Each node's launch script runs in a session (process
group) of its own on its host; stopping a node signals that group and then any
process left whose environment names the run folder (torchrun puts its workers
in sessions of their own, and a dropped ssh connection alone stops nothing).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

from runtime.events import ENV_RUN_DIR
from runtime.status import ENV_STATUS_TOKEN
from wizard.answers.model import Answers
from wizard.render.pristine import repository_folder, repository_root
from wizard.run.engines.base import ENDED, RUNNING, Description, Engine, EngineError, Launch, StatusPlan
from wizard.run.engines.common import ENV_SPARE_ADDR, ENV_STATUS_HOST, node_environment, route_source
from wizard.run.engines.interpreter import ENV_PYTHON, fix, launcher_check, remote_problems
from wizard.run.engines.ssh_copy import copy_list
from wizard.run.engines.ssh_folder import folder_check, project_line, refuse_foreign, refuse_system_folder
from wizard.run.engines.ssh_run import run_all
from wizard.run.engines.ssh_spare import spare_device_network
from wizard.run.hang_stacks import NOT_THIS_RUN
from wizard.stopping import deferred_signals

ENV_SSH_COMMAND = "NPU_WIZARD_SSH_COMMAND"
# a host that stops answering ends its session within about a minute (exit 255) instead of never
DEFAULT_SSH = (
    *("ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=15"),
    *("-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4"),
)
PASSED_PREFIXES = ("NPU_WIZARD_", "HCCL_", "ASCEND_")
PASSED_NAMES = ("MASTER_PORT", "CANN_SET_ENV")
NOT_PASSED = (ENV_SSH_COMMAND, ENV_STATUS_HOST, ENV_SPARE_ADDR)
PGID_MARK = "npu-wizard-pgid "
CHECK_S = 60.0
COPY_S = 600.0
ROUND_S = 10.0
"""The most one round of stopping (TERM, KILL, the last sweep) waits for a host."""
PROBE_S = 15.0  # one ssh to probe a rank that did not answer at a hang: its state and its stacks
MAX_PROBE_BYTES = 64 * 1024
HEALTH_S = 20.0  # the most the health check of a node's host between two attempts waits for ssh


def ssh_command() -> list[str]:
    """The ssh client command: NPU_WIZARD_SSH_COMMAND as a whole, else ssh in batch mode."""
    override = os.environ.get(ENV_SSH_COMMAND, "").strip()
    return shlex.split(override) if override else list(DEFAULT_SSH)


def rsync_host(host: str) -> str:
    """The host as rsync's HOST:PATH takes it: an IPv6 address in brackets (fd00::2:/p is daemon syntax)."""
    user, at, name = host.rpartition("@")
    if ":" in name and not name.startswith("["):
        name = f"[{name}]"
    return f"{user}{at}{name}"


class SshEngine(Engine):
    """Starts launch/nodeK.sh on node K's host over ssh and follows each session."""

    name = "ssh"

    def __init__(self) -> None:
        self.launch: Launch | None = None
        self.sessions: dict[int, subprocess.Popen[bytes]] = {}
        self._lines: list[str] = []

    # ---- where things are -------------------------------------------------------------

    @staticmethod
    def hosts(launch: Launch) -> tuple[str, ...]:
        """Each node's host as ssh reaches it: cluster.ssh_hosts, else the host IPs; a spare where one took over."""
        hosts = list(launch.answers.get("cluster.ssh_hosts") or launch.answers["network.host_ips"])
        for node, spare in launch.spares.items():
            hosts[node] = spare
        return tuple(hosts)

    @staticmethod
    def copy_root(launch: Launch) -> Path:
        """What is copied to every host: the repository when the project is one folder of it, else the project."""
        return repository_root(launch.project)

    def remote_root(self, launch: Launch) -> str:
        """Where that copy lies on every host: cluster.remote_dir, else its path here."""
        return str(launch.answers.get("cluster.remote_dir") or self.copy_root(launch))

    def remote_dir(self, launch: Launch) -> str:
        """The project's folder on every host: in the copy, where it is in the repository here."""
        folder = repository_folder(launch.project)
        return f"{self.remote_root(launch).rstrip('/')}/{folder}" if folder else self.remote_root(launch)

    def fresh_refusal(self, project: Path, answers: Answers) -> str | None:
        """Always: the ranks save on their hosts, where this runner cannot set checkpoints aside."""
        from wizard.run.checkpoints import ENV_CHECKPOINT_DIR

        remote = answers.get("cluster.remote_dir") or str(repository_root(project))
        inside = repository_folder(project)
        remote = f"{remote.rstrip('/')}/{inside}" if inside else remote
        folder = os.environ.get(ENV_CHECKPOINT_DIR) or f"{remote.rstrip('/')}/checkpoints"
        return (
            f"--fresh: the ssh engine's ranks keep their checkpoints on every host, in {folder}, which npu-wizard "
            "cannot set aside from here; move that folder's step-N.pt files aside on every host, then run again "
            "without --fresh (nothing was changed)"
        )

    def remote_run_dir(self, launch: Launch) -> str:
        """The run folder on the hosts, at the same place inside the project."""
        return str(Path(self.remote_dir(launch)) / launch.run_dir.relative_to(launch.project))

    def node_log(self, launch: Launch, node: int) -> str:
        """Node's launch script log: on its host, in the run folder there (HOST:PATH)."""
        return f"{self.hosts(launch)[node]}:{self.remote_run_dir(launch)}/logs/node-{node}.log"

    def node_env(self, launch: Launch) -> dict[str, str]:
        """What each node's launch script gets on top of its host's environment."""
        passed = {
            key: value
            for key, value in os.environ.items()
            if (key.startswith(PASSED_PREFIXES) or key in PASSED_NAMES) and key not in NOT_PASSED
        }
        env = node_environment(launch.answers, {**passed, **launch.env})
        env["NPU_WIZARD_RUN_DIR"] = self.remote_run_dir(launch)
        return env

    # ---- commands ------------------------------------------------------------------

    @staticmethod
    def copy_list_file(launch: Launch) -> Path:
        """Where the list of the files copied to every host is kept: in the run folder's logs."""
        return launch.run_dir / "logs" / "ssh-copied-files"

    def rsync_command(self, launch: Launch, node: int) -> list[str]:
        """rsync of the listed files (see ssh_copy) to node's host over the same ssh, only what changed."""
        remote = self.remote_root(launch)
        return [
            "rsync",
            "-a",
            "--from0",
            f"--files-from={self.copy_list_file(launch)}",
            "-e",
            shlex.join(ssh_command()),
            f"--rsync-path=mkdir -p {shlex.quote(remote)} && rsync",
            f"{self.copy_root(launch)}/",
            f"{rsync_host(self.hosts(launch)[node])}:{remote}/",
        ]

    def start_command(self, launch: Launch, node: int) -> list[str]:
        """ssh running node's launch script in a session of its own, printing that session's id first.

        The status token is not on it: the remote shell reads it from ssh's standard input
        (see `submit`), so no command line on either host holds it for another user's `ps`.
        """
        env = self.node_env(launch)
        if node in launch.spares:  # node K's script on a spare host: HCCL_IF_IP is the spare's address
            env[ENV_SPARE_ADDR] = launch.spares[node]
        token = env.pop(ENV_STATUS_TOKEN, None)
        python_dir = os.path.dirname(env["PYTHON"])
        assignments = " ".join(f"{key}={shlex.quote(value)}" for key, value in sorted(env.items()))
        inner = f'echo "{PGID_MARK}$$"; exec bash launch/node{node}.sh "$@"'
        read_token = (
            f"IFS= read -r {ENV_STATUS_TOKEN} || {{ echo 'npu-wizard: no status token on standard input "
            f"(the ssh command must pass it on: no -n)' >&2; exit 2; }}; export {ENV_STATUS_TOKEN}; "
        )
        remote = (
            (read_token if token is not None else "") + f"cd {shlex.quote(self.remote_dir(launch))} && "
            f'exec env {assignments} PATH={shlex.quote(python_dir)}:"$PATH" '
            f"setsid -w bash -c {shlex.quote(inner)} npu-wizard-node {shlex.join(launch.train_args)}"
        ).rstrip()
        return [*ssh_command(), self.hosts(launch)[node], remote]

    def stop_command(self, launch: Launch, node: int, pgid: int | None, signal_name: str) -> list[str]:
        """ssh signalling node's session and, with KILL, every process of the run left on the host."""
        parts = [f"kill -{signal_name} -- -{pgid} 2>/dev/null" if pgid else "true"]
        if signal_name == "KILL":
            # one grep over every process's environment (NUL-separated lines) finds what is left of the run;
            # one over command lines finds a node's login shell that has not yet started its launch script
            # (the needle is put together in the shell, so that this shell's own command line holds none)
            run_dir = shlex.quote(self.remote_run_dir(launch))
            started = shlex.quote(f"={run_dir} ")
            parts.append(
                f'n=NPU_WIZARD_RUN_DIR; for f in $(grep -lzxF "$n"={run_dir} /proc/[0-9]*/environ 2>/dev/null) '
                f'$(grep -lzF "$n"{started} /proc/[0-9]*/cmdline 2>/dev/null); do '
                'p="${f#/proc/}"; p="${p%/*}"; [ "$p" = "$$" ] || kill -KILL "$p" 2>/dev/null; done'
            )
        return [*ssh_command(), self.hosts(launch)[node], "; ".join(parts) + "; true"]

    def dry_run(self, launch: Launch) -> str:
        """The rsync and ssh commands, node by node."""
        lines = [f"# ssh engine: {len(launch.nodes)} node(s); ssh command: {shlex.join(ssh_command())}"]
        copied = copy_list(self.copy_root(launch))
        lines.append(f"# rsync {copied.summary()}; the list goes to {self.copy_list_file(launch)}")
        if ENV_STATUS_TOKEN in launch.env:
            lines.append(f"# each node's ssh gets {ENV_STATUS_TOKEN} on its standard input, never on a command line")
        for node in launch.nodes:
            lines.append(f"# node {node} on {self.hosts(launch)[node]}")
            lines.append(shlex.join(self.rsync_command(launch, node)))
            lines.append(shlex.join(self.start_command(launch, node)))
        return "\n".join(lines) + "\n"

    # ---- the job -------------------------------------------------------------------

    def status_plan(self, launch: Launch, port: int | None) -> StatusPlan:
        """Listen on every address; advertise the one this host reaches node 0 from."""
        override = launch.env.get(ENV_STATUS_HOST) or os.environ.get(ENV_STATUS_HOST)
        target = (launch.answers.get("network.host_ips") or self.hosts(launch))[0]
        host = override or route_source(target) or os.uname().nodename
        return StatusPlan("::" if ":" in host else "0.0.0.0", port or 0, host)

    def check(self, launch: Launch) -> None:
        """Every host answers over ssh (in parallel) and its folder for the project is free or this project's.

        Refuse, naming each host, one that does not answer or holds other files in that folder.
        """
        hosts, remote = self.hosts(launch), self.remote_root(launch)
        refuse_system_folder(remote)
        answers_file = "/".join(filter(None, [repository_folder(launch.project), "answers.yaml"]))
        check = "; ".join(
            [
                folder_check(remote, project_line(launch.project, launch.answers["project_name"]), answers_file),
                launcher_check(launch.answers, self.node_env(launch)[ENV_PYTHON]),
                "true",
            ]
        )
        started = time.monotonic()
        results = run_all([[*ssh_command(), host, check] for host in hosts], CHECK_S)
        failed = [(node, result) for node, result in enumerate(results) if result.returncode != 0]
        if failed:
            lines = [
                f"node {node} ({hosts[node]}): {(result.stderr.strip().splitlines() or ['ssh failed'])[-1]}"
                for node, result in failed
            ]
            raise EngineError(
                "cannot reach every host over ssh; nothing was started:\n  "
                + "\n  ".join(lines)
                + f"\n(the ssh command is `{shlex.join(ssh_command())}`; set {ENV_SSH_COMMAND} to change it)"
            )
        refuse_foreign(remote, hosts, [result.stdout for result in results], launch.answers["project_name"])
        missing = remote_problems([result.stdout for result in results], hosts)
        if missing:
            raise EngineError(
                "the Python for the ranks or its launcher is missing on a host, so nothing was started:\n  "
                + "\n  ".join(missing)
                + f"\n{fix('at the same path on every host').capitalize()}"
            )
        self._lines.append(f"ssh: {len(hosts)} host(s) answered in {time.monotonic() - started:.1f}s")

    def submit(self, launch: Launch) -> str:
        """Copy the project to every host, then start every node's launch script there."""
        self.launch = launch
        logs = launch.run_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        copied = copy_list(self.copy_root(launch))
        self.copy_list_file(launch).write_bytes(copied.encoded())
        self._lines.append(f"ssh: rsync {copied.summary()}")
        copies = run_all([self.rsync_command(launch, node) for node in launch.nodes], COPY_S)
        failed = [(node, result) for node, result in zip(launch.nodes, copies, strict=True) if result.returncode]
        if failed:
            raise EngineError(
                "copying the project failed; nothing was started:\n  "
                + "\n  ".join(f"node {node} ({self.hosts(launch)[node]}): {r.stderr.strip()}" for node, r in failed)
            )
        self._lines.append(f"ssh: project copied to {len(launch.nodes)} host(s) in {time.monotonic() - started:.1f}s")
        token = launch.env.get(ENV_STATUS_TOKEN)
        for node in launch.nodes:
            # a signal between the fork and Popen's return would lose the session: it waits until it is kept
            with (logs / f"ssh-node-{node}.log").open("wb") as log, deferred_signals():
                session = subprocess.Popen(
                    self.start_command(launch, node),
                    stdin=subprocess.DEVNULL if token is None else subprocess.PIPE,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
                self.sessions[node] = session
            if session.stdin is not None:
                with contextlib.suppress(OSError):  # an ssh that ended at once says why in its log
                    session.stdin.write(f"{token}\n".encode())
                    session.stdin.close()
            self._lines.append(f"ssh: node {node} started on {self.hosts(launch)[node]}")
        return ",".join(self.hosts(launch)[node] for node in launch.nodes)

    def describe(self) -> Description:
        """Each node's exit code as its ssh session reports it (255: the connection failed)."""
        codes = {node: session.poll() for node, session in self.sessions.items()}
        lost = [node for node, code in codes.items() if code == 255]
        reason = None
        if lost and self.launch is not None:
            reason = (
                "ssh to "
                + ", ".join(self.hosts(self.launch)[n] for n in lost)
                + " failed (exit 255); see logs/ssh-node-K.log"
            )
        state = ENDED if codes and all(code is not None for code in codes.values()) else RUNNING
        return Description(state, codes, reason)

    def remote_checkpoint_dir(self, launch: Launch) -> str:
        """The folder the ranks save to on every host: NPU_WIZARD_CHECKPOINT_DIR, else <remote_dir>/checkpoints."""
        from wizard.run.checkpoints import ENV_CHECKPOINT_DIR

        chosen = launch.env.get(ENV_CHECKPOINT_DIR) or os.environ.get(ENV_CHECKPOINT_DIR)
        return chosen or f"{self.remote_dir(launch).rstrip('/')}/checkpoints"

    def spare_problems(self, launch: Launch, host: str) -> list[str]:
        """The spare's device network, checked over ssh as doctor checks a node's (engines/ssh_spare.py)."""
        return spare_device_network(launch.answers, host, ssh_command())

    def seed_spares(self, launch: Launch, spares: dict[int, str], donor: int) -> list[str]:
        """Copy node `donor`'s checkpoints to each new spare (through this host): a spare resumes like the others.

        Each node keeps its own copy of the checkpoints (runtime/checkpoint.py), and the newest one every rank
        holds is where the job resumes: a spare that held none would stop every rank. Returns what went wrong.
        """
        folder = self.remote_checkpoint_dir(launch)
        staging = launch.run_dir / "logs" / "spare-checkpoints"
        staging.mkdir(parents=True, exist_ok=True)
        ssh = shlex.join(ssh_command())
        only = ["--include=step-*.pt", "--exclude=*"]
        fetch = ["rsync", "-a", *only, "-e", ssh, f"{rsync_host(self.hosts(launch)[donor])}:{folder}/", f"{staging}/"]
        result = run_all([fetch], COPY_S)[0]
        if result.returncode not in (0, 23):  # 23: the donor holds no checkpoint folder yet: nothing to copy
            return [f"fetching node {donor}'s checkpoints: {result.stderr.strip()}"]
        sends = [
            ["rsync", "-a", "-e", ssh, f"--rsync-path=mkdir -p {shlex.quote(folder)} && rsync", f"{staging}/"]
            + [f"{rsync_host(spare)}:{folder}/"]
            for spare in spares.values()
        ]
        sent = run_all(sends, COPY_S)
        shutil.rmtree(staging, ignore_errors=True)
        return [
            f"copying the checkpoints to spare {spare}: {result.stderr.strip()}"
            for spare, result in zip(spares.values(), sent, strict=True)
            if result.returncode
        ]

    def host_of(self, node: int) -> str | None:
        """The host node's launch script was started on."""
        return self.hosts(self.launch)[node] if self.launch is not None else None

    def node_health(self, launch: Launch, nodes: list[int]) -> dict[int, list[str]]:
        """For each node: whether its host answers over ssh, with no process of the run left there (at once)."""
        run_dir = shlex.quote(self.remote_run_dir(launch))
        count = f'n=NPU_WIZARD_RUN_DIR; grep -lzxF "$n"={run_dir} /proc/[0-9]*/environ 2>/dev/null | wc -l'
        hosts = self.hosts(launch)
        results = run_all([[*ssh_command(), hosts[node], count] for node in nodes], HEALTH_S)
        health: dict[int, list[str]] = {}
        for node, result in zip(nodes, results, strict=True):
            left = result.stdout.strip()
            if result.returncode != 0:
                said = (result.stderr.strip().splitlines() or [f"exit code {result.returncode}"])[-1]
                health[node] = [f"ssh to {hosts[node]} failed: {said}"]
            else:
                health[node] = (
                    [f"{left} process(es) of the run still alive on {hosts[node]}"] if left not in ("", "0") else []
                )
        return health

    def stream(self) -> list[str]:
        """Nodes started, since the last call."""
        lines, self._lines = self._lines, []
        return lines

    def pgid(self, node: int) -> int | None:
        """The session id node's launch script runs in on its host, once it said so."""
        assert self.launch is not None
        try:
            text = (self.launch.run_dir / "logs" / f"ssh-node-{node}.log").read_text(errors="replace")
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith(PGID_MARK) and line[len(PGID_MARK) :].strip().isdigit():
                return int(line[len(PGID_MARK) :])
        return None

    def probe_rank(self, launch: Launch, rank: int, host: str | None, pid: int) -> tuple[str, str] | None:
        """On rank's host, over ssh: /proc/PID/stat, and the faulthandler stacks SIGUSR2 makes it write.

        The host is the one the rank reported where it is one of the run's hosts, else its node's; a pid
        whose environment does not name the run folder there (another process by now) is not signalled.
        """
        hosts = self.hosts(launch)
        target = host if host in hosts else hosts[rank // launch.answers["devices_per_node"]]
        stacks = shlex.quote(f"{self.remote_run_dir(launch)}/logs/rank-{rank}.stacks.txt")
        of_run = shlex.quote(f"{ENV_RUN_DIR}={self.remote_run_dir(launch)}")
        script = (
            f"p={int(pid)}; f={stacks}; "
            'stat=$(cat /proc/"$p"/stat 2>/dev/null) || exit 0; '
            f'grep -qzxF {of_run} /proc/"$p"/environ 2>/dev/null || {{ echo {NOT_THIS_RUN}; exit 0; }}; '
            'printf "%s\\n" "$stat"; '
            "cgt=$(sed -n 's/^SigCgt:[[:space:]]*//p' /proc/\"$p\"/status); "
            "[ $(( 0x${cgt:-0} >> 11 & 1 )) = 1 ] || exit 0; "
            'size() { stat -c %s "$f" 2>/dev/null || echo 0; }; s=$(size); kill -USR2 "$p" || exit 0; '
            'case "$stat" in *") T "*|*") t "*) exit 0;; esac; '
            'i=0; while [ "$i" -lt 20 ] && [ "$(size)" -le "$s" ]; do sleep 0.1; i=$((i+1)); done; sleep 0.2; '
            f'tail -c +$((s+1)) "$f" | head -c {MAX_PROBE_BYTES}'
        )
        try:
            done = subprocess.run(
                [*ssh_command(), target, script],
                capture_output=True,
                timeout=PROBE_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        stat_line, _, stacks_text = done.stdout.decode("utf-8", "replace").partition("\n")
        return (stat_line, stacks_text) if done.returncode == 0 else None

    def cancel(self, prompt: bool = False) -> None:
        """TERM every node's session on its host, wait the (stop) grace, then KILL what is left of the run.

        Each round waits ROUND_S at most for a host (a hung host cannot hold the runner); a
        node that had not yet said its session id when stopped is swept once more after its
        ssh is gone, in case its launch started after the first sweep.
        """
        launch = self.launch
        if launch is None:
            return
        nodes = list(self.sessions)
        pgids = {node: self.pgid(node) for node in nodes}
        term = run_all([self.stop_command(launch, node, pgids[node], "TERM") for node in nodes], ROUND_S)
        deadline = time.monotonic() + launch.grace
        for node, result in zip(nodes, term, strict=True):
            if result.returncode in (0, 1):  # a host that did not answer is not waited for
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.sessions[node].wait(timeout=max(0.1, deadline - time.monotonic()))
        pgids = {node: pgids[node] or self.pgid(node) for node in nodes}
        kill = run_all([self.stop_command(launch, node, pgids[node], "KILL") for node in nodes], ROUND_S)
        for session in self.sessions.values():
            if session.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(session.pid, signal.SIGKILL)
            session.wait()
        reached = {node for node, result in zip(nodes, kill, strict=True) if result.returncode in (0, 1)}
        late = [node for node in nodes if node in reached and pgids[node] is None]
        if late:
            swept = run_all([self.stop_command(launch, node, None, "KILL") for node in late], ROUND_S)
            reached -= {node for node, result in zip(late, swept, strict=True) if result.returncode not in (0, 1)}
        for node in nodes:
            if node not in reached:
                self._lines.append(
                    f"ssh: could not reach {self.hosts(launch)[node]} within {ROUND_S:.0f}s to stop node {node}: "
                    "processes of the run may be left there"
                )
