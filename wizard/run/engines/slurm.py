"""The Slurm engine: `sbatch --parsable slurm/job.sbatch`, follow the job with scontrol, scancel it.

The batch script runs launch/entry.sh on every node with `srun --kill-on-bad-exit=1`
and exits with srun's status, so a failed node fails the job. The ranks report
to this runner through the status stream, whose address travels in the job's
environment (sbatch exports the submitting environment).
"""

from __future__ import annotations

import os
import re
import shlex
import time
from typing import Any

from wizard.run.engines.base import ENDED, PENDING, RUNNING, Description, Engine, EngineError, Launch, StatusPlan
from wizard.run.engines.common import ENV_STATUS_HOST, node_environment, run_command
from wizard.run.engines.interpreter import ENV_PYTHON, launcher_problem

SBATCH = "slurm/job.sbatch"
POLL_S = 1.0
"""How often scontrol is asked at most: it is a request to the controller each time."""
CANCEL_WAIT_S = 60.0
ENDED_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "REVOKED",
        "SPECIAL_EXIT",
    }
)
PENDING_STATES = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "RESV_DEL_HOLD", "REQUEUE_HOLD", "SUSPENDED"})


def parse_job(text: str) -> dict[str, str]:
    """`scontrol show job -o` output as its Key=Value fields."""
    return dict(re.findall(r"(\w+)=(\S*)", text))


class SlurmEngine(Engine):
    """Submits the project's batch script and follows the job until it ends."""

    name = "slurm"
    recovery = "exclude"

    def __init__(self) -> None:
        self.job_id: str | None = None
        self.launch: Launch | None = None
        self._last: Description = Description(PENDING)
        self._asked_at = float("-inf")
        self._said: str | None = None
        self._lines: list[str] = []
        self.node_list: str | None = None
        """The job's nodes as Slurm writes them (n[1-2]), once it has them."""

    def status_plan(self, launch: Launch, port: int | None) -> StatusPlan:
        """Listen on every address; the nodes reach this host by NPU_WIZARD_STATUS_HOST or its name."""
        host = launch.env.get(ENV_STATUS_HOST) or os.environ.get(ENV_STATUS_HOST) or os.uname().nodename
        return StatusPlan("0.0.0.0", port or 0, host)

    def command(self, launch: Launch) -> list[str]:
        """The sbatch command line (run in the project folder), without the nodes that failed an earlier attempt."""
        output = launch.run_dir / "logs" / "slurm-%j.out"
        exclude = [f"--exclude={','.join(launch.excluded)}"] if launch.excluded else []
        return ["sbatch", "--parsable", f"--output={output}", *exclude, SBATCH, *launch.train_args]

    def _env(self, launch: Launch) -> dict[str, str]:
        env = node_environment(launch.answers, launch.env)
        # sbatch exports PATH to the nodes: the interpreter's folder first, where torchrun lives
        env["PATH"] = f"{os.path.dirname(env['PYTHON'])}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        return env

    def dry_run(self, launch: Launch) -> str:
        """The sbatch command with the environment it exports to the job, then the batch script."""
        env = " ".join(f"{key}={shlex.quote(value)}" for key, value in sorted(self._env(launch).items()))
        script = (launch.project / SBATCH).read_text()
        return (
            "# slurm engine: submitted from the project folder; sbatch exports this environment to every node\n"
            f"cd {shlex.quote(str(launch.project))} && env {env} {shlex.join(self.command(launch))}\n"
            f"# ---- {SBATCH} ----\n{script}"
        )

    def check(self, launch: Launch) -> None:
        """The batch script exists and sbatch can be found."""
        if not (launch.project / SBATCH).is_file():
            raise EngineError(f"{launch.project / SBATCH} is missing: render the project again with engine slurm")
        if not any(os.access(os.path.join(d, "sbatch"), os.X_OK) for d in os.environ.get("PATH", "").split(":")):
            raise EngineError("sbatch not found: run npu-wizard run on a Slurm login node (sbatch on PATH)")
        # sbatch exports this PATH and PYTHON to the nodes, which see the same shared folders
        python = self._env(launch)[ENV_PYTHON]
        problem = launcher_problem(launch.answers, python, self._env(launch)["PATH"])
        if problem is not None:
            raise EngineError(
                f"{problem.replace('on this host', 'on this login node')}; the job's nodes would not find it "
                "either, so nothing was submitted"
            )

    def submit(self, launch: Launch) -> str:
        """sbatch --parsable; return the job id."""
        self.launch = launch
        (launch.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        result = run_command(
            self.command(launch), env={**os.environ, **self._env(launch)}, cwd=str(launch.project), timeout=120
        )
        job_id = result.stdout.strip().split(";")[0]
        if result.returncode != 0 or not job_id.isdigit():
            raise EngineError(f"sbatch refused the job: {(result.stderr or result.stdout).strip()}")
        self.job_id = job_id
        kept_off = f" kept off {','.join(launch.excluded)} (sbatch --exclude)" if launch.excluded else ""
        self._lines.append(f"slurm: submitted job {job_id}{kept_off}")
        return job_id

    def describe(self) -> Description:
        """The job's state from scontrol (asked at most once a second)."""
        if self.job_id is None or self._last.state == ENDED:
            return self._last
        now = time.monotonic()
        if now - self._asked_at < POLL_S:
            return self._last
        self._asked_at = now
        result = run_command(["scontrol", "show", "job", "-o", self.job_id], timeout=30)
        if result.returncode != 0:
            if "Invalid job id" in result.stderr:  # purged from the controller: it ended long ago
                self._last = Description(ENDED, {}, f"job {self.job_id} is gone from Slurm")
            return self._last
        self._last = self._describe(parse_job(result.stdout))
        return self._last

    def _describe(self, fields: dict[str, str]) -> Description:
        state = fields.get("JobState", "UNKNOWN")
        reason = fields.get("Reason", "None")
        exit_code = fields.get("ExitCode", "0:0")
        said = f"job {self.job_id} {state}"
        if state in PENDING_STATES:
            said += f" ({reason})"
            kind = PENDING
        elif state in ENDED_STATES:
            said += f" ExitCode={exit_code}" + (f" Reason={reason}" if reason != "None" else "")
            kind = ENDED
        else:
            said += f" on {fields.get('NodeList', '?')}"
            kind = RUNNING
        if fields.get("NodeList") not in (None, "", "(null)"):
            self.node_list = fields["NodeList"]
        if said != self._said:
            self._said = said
            self._lines.append(f"slurm: {said}")
        if kind != ENDED:
            return Description(kind, {}, None)
        nodes = self.launch.nodes if self.launch else ()
        codes = {node: 0 for node in nodes} if state == "COMPLETED" and exit_code == "0:0" else {}
        return Description(ENDED, codes, said)

    def host_of(self, node: int) -> str | None:
        """The Slurm node that ran `node` (SLURM_NODEID counts the job's nodes in scontrol's order)."""
        if self.node_list is None:
            return None
        result = run_command(["scontrol", "show", "hostnames", self.node_list], timeout=30)
        names = result.stdout.split() if result.returncode == 0 else []
        return names[node] if 0 <= node < len(names) else None

    def summary_fields(self) -> dict[str, Any]:
        """The nodes this job was kept off (sbatch --exclude), where an earlier attempt's node failed."""
        excluded = self.launch.excluded if self.launch is not None else ()
        return {"slurm_excluded": list(excluded)} if excluded else {}

    def stream(self) -> list[str]:
        """The job's state changes since the last call."""
        lines, self._lines = self._lines, []
        return lines

    def cancel(self, prompt: bool = False) -> None:
        """scancel the job and wait until Slurm says it ended.

        A plain scancel sends TERM, on which the ranks save, and KILLs only after the cluster's
        KillWait (30 s by default): `prompt` (a rank dead or hung, no save possible) KILLs first.
        """
        if self.job_id is None:
            return
        if prompt:
            run_command(["scancel", "--full", "--signal=KILL", self.job_id], timeout=30)
        run_command(["scancel", self.job_id], timeout=30)
        deadline = time.monotonic() + CANCEL_WAIT_S
        while time.monotonic() < deadline:
            self._asked_at = float("-inf")
            if self.describe().state == ENDED:
                return
            time.sleep(0.5)
        self._lines.append(f"slurm: job {self.job_id} still not ended {CANCEL_WAIT_S:.0f}s after scancel")
