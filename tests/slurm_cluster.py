"""A real two-node Slurm cluster in a temporary folder: munged, slurmctld and two slurmd.

Everything lives under the folder (configuration, spool, state, logs, the munge
key and socket), `SLURM_CONF` points sbatch, squeue, scontrol and scancel at it,
and the daemons are stopped by their PIDs. Both nodes are this host (127.0.0.1)
on their own slurmd ports; CLUSTERS.md has the recipe this follows.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.runs import free_port

NODES = ("n1", "n2")


def have_slurm() -> bool:
    """Whether slurmctld, slurmd, munged and sbatch are installed."""
    return all(
        shutil.which(name) or Path("/usr/sbin", name).exists() for name in ("slurmctld", "slurmd", "munged", "sbatch")
    )


def daemon_ports(count: int) -> list[int]:
    """`count` distinct free ports for the daemons, below the ephemeral range and outside the jobs' master ports.

    A port the kernel hands out (bind to port 0) and takes back can go to any outgoing connection before slurmd
    binds it: "Unable to bind listen port: Address already in use", seen under load.
    """
    ports: list[int] = []
    while len(ports) < count:
        port = free_port(outside=JOB_MASTER_PORTS, count=1)
        if port not in ports:
            ports.append(port)
    return ports


def _wait(predicate, timeout: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


JOB_ID_BLOCK = 100
"""Job ids each test cluster may give: its jobs' master ports (29500 + job id % 1000) stay its own."""

JOB_ID_BLOCKS = 1000 // JOB_ID_BLOCK
JOB_MASTER_PORTS = range(29500, 30500)
"""Where every test cluster's jobs take their master ports: no daemon may listen there."""


def job_id_lock_dir() -> Path:
    """Where the test clusters of every test run on this host, for this user, take their blocks of job ids."""
    return Path(tempfile.gettempdir()) / f"npu-wizard-test-slurm-job-ids-{os.getuid()}"


def reserve_job_ids(lock_dir: Path | None = None, timeout: float = 900) -> tuple[int, int]:
    """Take a block of job ids no other test cluster on this host holds; return its first id and the lock's fd.

    Clusters running at once (two pytest-xdist workers, or two test runs side by side)
    must not give jobs the same id: launch/entry.sh derives the master port from it, and
    two jobs on this one host would then want the same port. Each block is an flock on
    its own file, held until the fd is closed (the kernel lets it go if the test dies);
    when all are held, wait for one.
    """
    folder = job_id_lock_dir() if lock_dir is None else lock_dir
    folder.mkdir(mode=0o700, exist_ok=True)
    held = folder.lstat()
    if not stat.S_ISDIR(held.st_mode) or held.st_uid != os.getuid() or held.st_mode & 0o022:
        raise AssertionError(f"{folder}: not a folder of this user's that only it can write; remove it")
    deadline = time.monotonic() + timeout
    while True:
        for block in range(JOB_ID_BLOCKS):
            fd = os.open(folder / f"block-{block}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return 1 + block * JOB_ID_BLOCK, fd
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for a free block of Slurm job ids")
        time.sleep(0.5)


def slurm_conf(root: Path, ctld_port: int, node_ports: dict[str, int], cpus: int, first_job: int = 1) -> str:
    """The cluster's slurm.conf: two nodes on 127.0.0.1, munge through the folder's own socket."""
    lines = [
        "ClusterName=npuwizardtest",
        f"FirstJobId={first_job}",
        "SlurmctldHost=localhost",
        f"SlurmctldPort={ctld_port}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        # cred_expire (default 120 s) is also how long Slurm holds a requeued job before it may start again:
        # the preemption test's requeued job waits 30 s, not two minutes (30 s: a step launched on a loaded machine
        # must still find its credential valid)
        f"AuthInfo=socket={root / 'munge.sock'},cred_expire=30",
        "SlurmUser=root",
        "SlurmdUser=root",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "MpiDefault=none",
        "JobAcctGatherType=jobacct_gather/none",
        "ReturnToService=2",
        "KillWait=5",
        "MinJobAge=600",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool'}/%n",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}",
        f"SlurmdPidFile={root}/slurmd-%n.pid",
        f"SlurmctldLogFile={root / 'slurmctld.log'}",
        f"SlurmdLogFile={root}/slurmd-%n.log",
    ]
    for name, port in node_ports.items():
        lines.append(
            f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} CPUs={cpus} RealMemory=2000"
        )
    lines.append("PartitionName=debug Nodes=ALL Default=YES State=UP OverSubscribe=YES MaxTime=INFINITE")
    return "\n".join(lines) + "\n"


class SlurmCluster:
    """A running test cluster: its folder, the environment to talk to it, and its daemons."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.conf = root / "slurm.conf"
        self.pids: list[int] = []
        self.job_ids_lock: int | None = None

    @property
    def env(self) -> dict[str, str]:
        """This process's environment with SLURM_CONF pointing at the cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster."""
        return subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=timeout, check=False)

    def start(self) -> None:
        """Start munged, slurmctld and both slurmd; return once both nodes are idle."""
        (self.root / "state").mkdir()
        for name in NODES:
            (self.root / "spool" / name).mkdir(parents=True)
        key = self.root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        ctld_port, *node_ports = daemon_ports(1 + len(NODES))
        ports = dict(zip(NODES, node_ports, strict=True))
        self.first_job_id, self.job_ids_lock = reserve_job_ids()
        self.conf.write_text(
            slurm_conf(self.root, ctld_port, ports, cpus=os.cpu_count() or 2, first_job=self.first_job_id)
        )
        self._daemon(
            [
                "munged",
                "-f",
                f"--key-file={key}",
                f"--socket={self.root / 'munge.sock'}",
                f"--pid-file={self.root / 'munged.pid'}",
                f"--log-file={self.root / 'munged.log'}",
                f"--seed-file={self.root / 'munged.seed'}",
            ],
            self.root / "munged.pid",
        )
        self._daemon(["slurmctld", "-f", str(self.conf)], self.root / "slurmctld.pid")
        for name in NODES:
            self._daemon(["slurmd", "-f", str(self.conf), "-N", name], self.root / f"slurmd-{name}.pid")
        _wait(self._idle, 120, "both Slurm nodes idle (sinfo)")

    def _daemon(self, command: list[str], pid_file: Path) -> None:
        subprocess.run(command, env=self.env, check=True, timeout=60, capture_output=True)
        _wait(lambda: pid_file.is_file() and pid_file.read_text().strip().isdigit(), 60, f"{pid_file.name}")
        self.pids.append(int(pid_file.read_text().strip()))

    def _idle(self) -> bool:
        result = self.run("sinfo", "-h", "-N", "-o", "%N %t")
        states = dict(line.split() for line in result.stdout.splitlines() if line.strip())
        return all(states.get(name) == "idle" for name in NODES)

    def queue(self) -> list[str]:
        """The ids of the jobs squeue still lists."""
        return self.run("squeue", "-h", "-o", "%i").stdout.split()

    def stop(self) -> None:
        """Stop every daemon by its PID (TERM, then KILL), newest first."""
        for pid in reversed(self.pids):
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for pid in reversed(self.pids):
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            _signal(pid, signal.SIGKILL)
        if self.job_ids_lock is not None:
            os.close(self.job_ids_lock)  # the block of job ids is free for the next cluster
            self.job_ids_lock = None


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


@contextmanager
def slurm_cluster(root: Path) -> Iterator[SlurmCluster]:
    """A started cluster under `root`, stopped when the block ends."""
    cluster = SlurmCluster(root)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
