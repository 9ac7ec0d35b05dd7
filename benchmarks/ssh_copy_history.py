"""Time to the first step over ssh with a big git history: the whole folder copied (before) against what a rank needs.

The CPU demo (2 nodes x 2 ranks, gloo, one epoch) is rendered with engine ssh for
the two network-namespace hosts of the tests (tests/ssh_hosts.py), made a git
repository, and given a history of `--history-gib` GiB in .git (a sparse file
where git-lfs keeps its objects: quick to make, and rsync reads and sends every
byte of it all the same). Each round removes the hosts' copy first, so every
copy is a first one, and times `npu-wizard run` from the command to the first
step event:

- before: the engine's rsync as it was (the whole folder but runs/ and
  __pycache__/, .git included), put back in place of today's for that run;
- after: today's, which copies the files git keeps (no .git, runs/,
  checkpoints/, or ignored files).

Rounds alternate; the medians, the bytes each copies, and after / before are printed.
Prerequisites: root; sshd, ssh, rsync, ip and git (as tests/test_ssh_engine.py).

    python benchmarks/ssh_copy_history.py [--history-gib 2] [--rounds 3]
    python benchmarks/ssh_copy_history.py --smoke   # 64 MiB, one round, 2 x 1 ranks (tests/test_benchmarks_smoke.py)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cluster_start import SIZES, fresh, render_demo, runs_of, timed  # noqa: E402
from tests.runs import node_env  # noqa: E402
from tests.ssh_hosts import ssh_hosts  # noqa: E402
from wizard.run.engines.ssh_copy import copy_list  # noqa: E402

# `npu-wizard run` with the engine's rsync of before this change: the whole folder, .git included
BEFORE = """
import shlex, sys
from wizard.run.engines import ssh
def whole_folder(self, launch, node):
    remote = self.remote_dir(launch)
    return ["rsync", "-a", "--exclude=/runs/", "--exclude=__pycache__/", "-e", shlex.join(ssh.ssh_command()),
            f"--rsync-path=mkdir -p {shlex.quote(remote)} && rsync", f"{launch.project}/",
            f"{ssh.rsync_host(self.hosts(launch)[node])}:{remote}/"]
ssh.SshEngine.rsync_command = whole_folder
from wizard.cli import main
sys.exit(main(sys.argv[1:]))
"""


def git(repo: Path, *args: str) -> None:
    """A git command in `repo` that must succeed."""
    author = ["-c", "user.name=Bench", "-c", "user.email=bench@example.com", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", *author, *args], cwd=repo, check=True, capture_output=True, timeout=120)


def with_history(project: Path, size: int) -> None:
    """Make `project` a git repository whose .git holds `size` bytes more (a sparse git-lfs object)."""
    git(project, "init", "-q")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "the project")
    big = project / ".git" / "lfs" / "objects" / "5e" / "ed" / ("5eed" + "0" * 60)
    big.parent.mkdir(parents=True)
    with big.open("wb") as handle:
        handle.truncate(size)


def folder_bytes(root: Path) -> int:
    """The bytes the whole-folder copy sends: every file but those in runs/ and __pycache__/."""
    total = 0
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__" and not (Path(folder) == root and d == "runs")]
        total += sum((Path(folder) / name).lstat().st_size for name in files)
    return total


def main() -> int:
    """Alternate the two copies; print each one's median time to the first step and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history-gib", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="64 MiB of history, one round, a rank a host")
    args = parser.parse_args()
    size = 64 * 2**20 if args.smoke else int(args.history_gib * 2**30)
    rounds = 1 if args.smoke else args.rounds
    launcher = "torchrun"
    if args.smoke:
        # as cluster_start.py's smoke run: the shell launcher starts each host's one rank itself, and 8 steps; both
        # copies are still timed across the same two hosts to the first step (4 torch processes, not 12)
        launcher = "shell"
        SIZES.update({"devices_per_node": 1, "training.samples": 256})
    times: dict[str, list[float]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="npu-wizard-copy-bench-") as scratch:
        work = Path(scratch)
        (work / "hosts").mkdir()
        with ssh_hosts(work / "hosts") as hosts:
            remote = work / "on-the-hosts"
            project = render_demo(
                work / "here",
                "big-history",
                launcher=launcher,
                **{
                    "cluster.engine": "ssh",
                    "cluster.remote_dir": str(remote),
                    "network.host_ips": hosts.addresses,
                    "network.master_addr": hosts.addresses[0],
                },
            )
            with_history(project, size)
            env = {**node_env(project / "runs" / "unused"), "NPU_WIZARD_SSH_COMMAND": hosts.ssh_command}
            commands = {
                "before": [sys.executable, "-c", BEFORE, "run", str(project), "--plain"],
                "after": [sys.executable, "-m", "wizard", "run", str(project), "--plain"],
            }
            for round_ in range(rounds):
                for name in ("before", "after") if round_ % 2 == 0 else ("after", "before"):
                    shutil.rmtree(remote, ignore_errors=True)  # every copy is a first one
                    fresh(project)
                    log = work / f"{name}-{round_}.log"
                    took = timed(commands[name], env, project, runs_of(project), log)
                    times[name].append(took)
                    print(f"round {round_ + 1}: {name}: first step after {took:.1f}s", flush=True)
            whole, needed = folder_bytes(project), copy_list(project).size
    before, after = statistics.median(times["before"]), statistics.median(times["after"])
    print(f".git holds {size / 2**30:.2f} GiB more; 2 hosts; median of {rounds} round(s)")
    print(f"before (whole folder, .git included, {whole / 2**20:.1f} MiB per host): first step after {before:.1f}s")
    print(f"after (what a rank needs, {needed / 2**20:.2f} MiB per host): first step after {after:.1f}s")
    print(f"after / before: {after / before:.2f} ({before - after:.1f}s saved per run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
