"""DeepSpeed's multi-node launcher with pdsh starting the CPU demo's train.py: the baseline for the ssh engine.

`deepspeed --hostfile H --launcher pdsh` ssh-checks the first host, then pdsh
runs DeepSpeed's per-node launcher on every host over ssh; that launcher starts
one process per slot with RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, CROSS_RANK (the node) and LOCAL_SIZE set and `--local_rank=N`
appended. A small wrapper written here turns that into train.py's `shell`
launcher mode (the node rank, gloo's NIC, OMP_NUM_THREADS=1 as torchrun sets
it) and runs the project's own interpreter on the project's own train.py, so
the ranks do the same work as under npu-wizard. The run folder travels to the
nodes in DeepSpeed's `.deepspeed_env` file.

Prerequisites (see cluster_start.py): pdsh from apt and a virtual environment
with DeepSpeed, whose python is given with --deepspeed-python.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.runs import free_port, node_env
from tests.ssh_hosts import SshHosts
from wizard.monitor.procs import kill_job

RANK_WRAPPER = """#!/usr/bin/env bash
# What DeepSpeed's per-node launcher starts for each rank: its variables -> train.py's shell launcher.
# It sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, CROSS_RANK (this node), CROSS_SIZE
# and LOCAL_SIZE, and appends --local_rank=N (train.py takes it; under shell LOCAL_RANK wins).
set -euo pipefail
export NODE_RANK="$CROSS_RANK" NNODES="$CROSS_SIZE" NPROC_PER_NODE="$LOCAL_SIZE" LOCAL_WORLD_SIZE="$LOCAL_SIZE"
# gloo's NIC: this host's address on its route to the master, as launch/entry.sh finds it
HCCL_IF_IP="$(ip -o route get "$MASTER_ADDR" | sed -n 's/.* src \\([^ ]*\\).*/\\1/p')"
export HCCL_IF_IP
export OMP_NUM_THREADS="${{OMP_NUM_THREADS:-1}}"  # what torchrun gives the other lines' ranks
export TORCH_DEVICE_BACKEND_AUTOLOAD=0  # as launch/run-node.sh does on the CPU
cd {project}
exec "$PYTHON" train.py --launcher shell "$@"
"""


def skip_reason(python: str | None) -> str | None:
    """Why the DeepSpeed line cannot run here (None when it can)."""
    if not python:
        return "no --deepspeed-python given (a venv with deepspeed, e.g. /work/dsvenv/bin/python)"
    if not Path(python).is_file():
        return f"--deepspeed-python {python} does not exist"
    if not shutil.which("pdsh"):
        return "pdsh is not installed (apt-get install -y pdsh)"
    probe = subprocess.run(
        [python, "-c", "import deepspeed, sys; sys.stdout.write(deepspeed.__version__)"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if probe.returncode != 0:
        return f"deepspeed does not import in {python}: {(probe.stderr.strip().splitlines() or ['?'])[-1]}"
    return None


def deepspeed_version(python: str) -> str:
    """The DeepSpeed version in that venv."""
    command = [python, "-c", "import importlib.metadata as m; print(m.version('deepspeed'))"]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False).stdout.strip() or "?"


@dataclass
class DeepSpeedLaunch:
    """The files DeepSpeed's pdsh launch needs (ssh wrapper, hostfile, rank wrapper) and the command."""

    work: Path
    hosts: SshHosts
    project: Path
    python: str

    def __post_init__(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        bin_dir = self.work / "bin"
        bin_dir.mkdir(exist_ok=True)
        # pdsh and DeepSpeed's ssh check call `ssh` from PATH: this one carries the hosts' key and options
        ssh = shlex.split(self.hosts.ssh_command)
        system_ssh = shutil.which(ssh[0]) or ssh[0]
        self._write(bin_dir / "ssh", f'#!/bin/sh\nexec {shlex.join([system_ssh, *ssh[1:]])} "$@"\n')
        self.hostfile = self.work / "hostfile"
        self.hostfile.write_text("".join(f"{address} slots=2\n" for address in self.hosts.addresses))
        self.wrapper = self.work / "rank.sh"
        self._write(self.wrapper, RANK_WRAPPER.format(project=shlex.quote(str(self.project))))
        self.bin_dir = bin_dir

    @staticmethod
    def _write(path: Path, text: str) -> None:
        path.write_text(text)
        path.chmod(0o755)

    def command(self) -> list[str]:
        """`deepspeed --hostfile ... --launcher pdsh` with the master the ssh project names, on the rank wrapper."""
        launcher = Path(self.python).parent / "deepspeed"
        head = [str(launcher)] if launcher.is_file() else [self.python, "-m", "deepspeed.launcher.runner"]
        return [
            *head,
            "--hostfile",
            str(self.hostfile),
            "--launcher",
            "pdsh",
            "--master_addr",
            self.hosts.addresses[0],
            "--master_port",
            str(free_port()),
            "--no_python",
            str(self.wrapper),
        ]

    def env(self, run_dir: Path) -> dict[str, str]:
        """The environment for the deepspeed command; `.deepspeed_env` ships the run folder to the nodes."""
        env_file = self.work / ".deepspeed_env"
        exported = {"NPU_WIZARD_RUN_DIR": str(run_dir), "NPU_WIZARD_HEARTBEAT_S": "1", "PYTHON": sys.executable}
        env_file.write_text("".join(f"{key}={value}\n" for key, value in exported.items()))
        env = node_env(run_dir, DS_ENV_FILE=str(env_file))
        env["PATH"] = f"{self.bin_dir}:{env['PATH']}"
        return env

    def stop(self, run_dir: Path) -> list[int]:
        """Stop whatever of that run is still alive on either host (by its run folder); return the pids."""
        return kill_job(run_dir, grace=5)
