"""Time from the command to the first logged step, by engine, against baselines in the same run.

- ssh: the CPU demo (2 nodes x 2 ranks, gloo, one epoch) across two real hosts
  (network namespaces with their own sshd, tests/ssh_hosts.py) with
  `npu-wizard run`, against (a) the manual engine running the same job on one
  host (both nodes on 127.0.0.1) and (b) DeepSpeed's multi-node launcher
  (`deepspeed --hostfile H --launcher pdsh`) starting the same train.py on the
  same two hosts (benchmarks/cluster_deepspeed.py). The ssh engine adds the
  reachability check, rsync and ssh start-up. Goal: under 2 s more than manual.
- Slurm: `npu-wizard run` of the same job with engine slurm against a plain
  `sbatch slurm/job.sbatch` of the same project on the same two-node cluster
  (tests/slurm_cluster.py).

Every line is timed from the command to the first step event in its run
folder. Each run starts afresh: the project's checkpoints are removed first
(a finished run's checkpoint would make the next one resume with nothing to
train). Rounds alternate the engines; the medians are printed.

Prerequisites: root; sshd, ssh, rsync, ip, slurm-wlm and munge (as the tests);
for the DeepSpeed line, pdsh and a venv with DeepSpeed (skipped, with the
reason printed, without them):

    apt-get update && apt-get install -y pdsh
    python3 -m venv /work/dsvenv && /work/dsvenv/bin/pip install torch pyyaml
    DS_BUILD_OPS=0 /work/dsvenv/bin/pip install deepspeed

    python benchmarks/cluster_start.py [--rounds 3] [--deepspeed-python /work/dsvenv/bin/python]
    python benchmarks/cluster_start.py --smoke   # one round, 2 x 1 ranks, shell launcher (the smoke test)
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cluster_deepspeed import DeepSpeedLaunch, deepspeed_version, skip_reason  # noqa: E402
from runtime.events import read_events  # noqa: E402
from tests.runs import free_port, node_env  # noqa: E402
from tests.slurm_cluster import slurm_cluster  # noqa: E402
from tests.ssh_hosts import ssh_hosts  # noqa: E402
from wizard.answers.model import resolve  # noqa: E402
from wizard.render.render import render  # noqa: E402

TIMEOUT_S = 600
SIZES: dict[str, Any] = {}  # what --smoke shrinks: every demo of this run


def render_demo(folder: Path, name: str, **overrides: Any) -> Path:
    """The CPU demo, one epoch, every step logged."""
    raw: dict[str, Any] = {
        "project_name": name,
        "device": "cpu",
        "nodes": 2,
        "devices_per_node": 2,
        "launcher": "torchrun",
        "amp": "off",
        "network.master_port": free_port(),
        "training.samples": 2048,
        "training.batch_size": 16,
        "training.epochs": 1,
        "training.log_every": 1,
    }
    raw.update(SIZES, **overrides)
    return render(resolve(raw), folder, force=True).project_dir


def fresh(project: Path) -> Path:
    """Remove the project's checkpoints, so that the next run trains from step 0 (not resumes at the end)."""
    shutil.rmtree(project / "checkpoints", ignore_errors=True)
    return project


def first_step(folders: Callable[[], list[Path]]) -> bool:
    """Whether any rank logged a step in any of the folders (events/ or remote/events/)."""
    for folder in folders():
        for events in (read_events(folder), read_events(folder / "remote")):
            if any(e.get("event") == "step" for rank_events in events.values() for e in rank_events):
                return True
    return False


def timed(command: list[str], env: dict[str, str], cwd: Path, folders: Callable[[], list[Path]], log: Path) -> float:
    """Seconds from starting `command` to the first step event; then wait for the job to end (output in `log`)."""
    # an earlier round's run folders hold steps already; a folder named in advance does not exist yet
    earlier = {folder for folder in folders() if folder.exists()}
    with log.open("wb") as output:
        started = time.monotonic()
        process = subprocess.Popen(command, env=env, cwd=cwd, stdout=output, stderr=subprocess.STDOUT)
        try:
            while not first_step(lambda: [folder for folder in folders() if folder not in earlier]):
                if time.monotonic() - started > TIMEOUT_S:
                    raise RuntimeError(f"no step within {TIMEOUT_S}s")
                if process.poll() is not None:
                    raise RuntimeError(f"exited {process.returncode} before any step")
                time.sleep(0.05)
            took = time.monotonic() - started
            process.wait(timeout=TIMEOUT_S)
        except (RuntimeError, subprocess.TimeoutExpired) as error:
            process.kill()
            process.wait()
            raise RuntimeError(f"{shlex.join(command)}: {error}; its output ({log}):\n{tail(log)}") from None
    if process.returncode != 0:
        raise RuntimeError(f"{shlex.join(command)} exited {process.returncode}; its output ({log}):\n{tail(log)}")
    return took


def tail(log: Path, lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def runs_of(project: Path) -> Callable[[], list[Path]]:
    return lambda: sorted((project / "runs").glob("*")) if (project / "runs").is_dir() else []


def run_command(project: Path) -> list[str]:
    return [sys.executable, "-m", "wizard", "run", str(project), "--plain"]


def wait_idle(env: dict[str, str]) -> None:
    """Wait until the cluster's queue is empty (the previous job fully ended)."""
    deadline = time.monotonic() + 120
    while subprocess.run(["squeue", "-h"], env=env, capture_output=True, text=True).stdout.strip():
        if time.monotonic() > deadline:
            raise RuntimeError("squeue never emptied")
        time.sleep(0.5)


def ssh_comparisons(
    work: Path, rounds: int, deepspeed: str | None, launcher: str = "torchrun"
) -> dict[str, list[float]]:
    """First-step times of the ssh engine across two hosts, the manual engine on one, DeepSpeed+pdsh on two."""
    times: dict[str, list[float]] = {"ssh": [], "manual": [], "deepspeed": []}
    (work / "hosts").mkdir()
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    with ssh_hosts(work / "hosts") as hosts:
        over_ssh = render_demo(
            work / "ssh",
            "over-ssh",
            launcher=launcher,
            **{"cluster.engine": "ssh", "network.host_ips": hosts.addresses, "network.master_addr": hosts.addresses[0]},
        )
        by_hand = render_demo(work / "manual", "by-hand", launcher=launcher, **{"network.host_ips": ["127.0.0.1"] * 2})
        env = node_env(work / "unused", NPU_WIZARD_SSH_COMMAND=hosts.ssh_command)
        launch = DeepSpeedLaunch(work / "deepspeed", hosts, over_ssh, deepspeed) if deepspeed else None
        for index in range(rounds):
            for name, project in (("manual", by_hand), ("ssh", over_ssh)):
                log = logs / f"{name}-{index}.log"
                times[name].append(timed(run_command(project), env, fresh(project), runs_of(project), log))
            if launch is not None:
                run_dir = work / "deepspeed" / "runs" / str(index)
                log = logs / f"deepspeed-{index}.log"
                try:
                    took = timed(launch.command(), launch.env(run_dir), fresh(over_ssh), lambda d=run_dir: [d], log)
                finally:
                    launch.stop(run_dir)
                times["deepspeed"].append(took)
    return times


def slurm_against_sbatch(work: Path, rounds: int, launcher: str = "torchrun") -> tuple[list[float], list[float]]:
    """First-step times of `npu-wizard run` (engine slurm) and of a plain sbatch of the same project."""
    run_times, sbatch_times = [], []
    (work / "cluster").mkdir()
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    with slurm_cluster(work / "cluster") as cluster:
        project = render_demo(work / "slurm", "on-slurm", launcher=launcher, **{"cluster.engine": "slurm"})
        for index in range(rounds):
            env = node_env(work / "unused", SLURM_CONF=str(cluster.conf))
            wait_idle(env)
            log = logs / f"slurm-run-{index}.log"
            run_times.append(timed(run_command(project), env, fresh(project), runs_of(project), log))
            wait_idle(env)
            plain_dir = project / "plain-runs" / str(index)
            env = node_env(plain_dir, SLURM_CONF=str(cluster.conf))
            command = ["sbatch", "--wait", "slurm/job.sbatch"]
            log = logs / f"sbatch-{index}.log"
            sbatch_times.append(timed(command, env, fresh(project), lambda d=plain_dir: [d], log))
    return run_times, sbatch_times


def line(name: str, times: list[float], baseline: list[float], base_name: str) -> str:
    ours, base = statistics.median(times), statistics.median(baseline)
    spread = ", ".join(f"{t:.1f}" for t in times)
    return f"{name:<26} median {ours:6.2f} s ({spread})  vs {base_name} {base:6.2f} s: {ours - base:+.2f} s"


def main() -> None:
    """Run the comparisons and print the medians against their baselines."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--deepspeed-python", help="python of a venv with deepspeed (the DeepSpeed+pdsh line)")
    parser.add_argument("--launcher", default="torchrun", help="the demo's launcher (the CPU demo: torchrun)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks that it runs and prints (seconds)")
    args = parser.parse_args()
    if args.smoke:
        # the shell launcher starts each node's 2 ranks itself: no torchrun process importing torch on each node
        # of the 4 jobs (8 of 24 torch processes); one rank a node and 8 steps: each line still times the same
        # engine across the same two hosts to the first step
        args.rounds, args.launcher = 1, "shell"
        SIZES.update({"devices_per_node": 1, "training.samples": 256})
    if os.geteuid() != 0:
        sys.exit("cluster_start.py needs root (network namespaces, slurmd)")
    skipped = skip_reason(args.deepspeed_python)
    deepspeed = None if skipped else args.deepspeed_python
    with tempfile.TemporaryDirectory(prefix="npu-wizard-bench-") as scratch:
        work = Path(scratch)
        times = ssh_comparisons(work, args.rounds, deepspeed, args.launcher)
        print(line("ssh engine (2 hosts)", times["ssh"], times["manual"], "manual engine (1 host)"), flush=True)
        if deepspeed:
            base = f"deepspeed {deepspeed_version(deepspeed)} pdsh (2 hosts)"
            print(line("ssh engine (2 hosts)", times["ssh"], times["deepspeed"], base), flush=True)
        else:
            print(f"ssh engine vs deepspeed pdsh: skipped: {skipped}", flush=True)
        run_times, sbatch_times = slurm_against_sbatch(work, args.rounds, args.launcher)
        print(line("npu-wizard run (slurm)", run_times, sbatch_times, "plain sbatch"), flush=True)


if __name__ == "__main__":
    main()
