"""The network check's slow-link verdict, N runs in a row: a quiet loopback names none, a shaped link is named.

Quiet: the CPU demo rendered for 2 nodes x 2 ranks on 127.0.0.1 (nodes
simulated on this host, torchrun) runs `npu-wizard run --plain --bandwidth`
--runs times; every run's bandwidth.json is read and its slowest link
printed (how far its best round is below the median node link, whether it was
named). Goal: none named, with the machine busy (run `stress-ng --cpu 2` beside
it). Small messages (--max-bytes 65536) are the hardest case: on a busy
loopback their rounds vary by 30x.

Shaped (--shaped-runs M, needs root, sshd and tc): three network namespaces
on one bridge (tests/ssh_hosts.py), 2 ranks each through the ssh engine, the
middle host's link shaped to 200 Mbit/s with tc as in tests/test_bandwidth.py;
messages up to 2 MiB as there; goal: node 1's devices named in every run.

Measured here (2 cores, `stress-ng --cpu 2` and other test suites beside it,
load 15-26): --runs 20 --max-bytes 65536 (links at the 4 MiB floor) named no
slow link in 20 runs, the slowest transfer's best round at most 6% below the
median; --shaped-runs 5 named node 1's two devices (and only them) in 5 of 5,
83-88% below. The rule before (local rank 0 only, the faster of 2 rounds each
way, 64 KiB messages) named a quiet link in 1 of 6 runs, 58% below.

    python benchmarks/bandwidth_quiet_runs.py [--runs 20] [--shaped-runs 5] [--max-bytes N]
    python benchmarks/bandwidth_quiet_runs.py --smoke   # one short quiet run, 2 x 1 (tests/test_benchmarks_smoke.py)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.runs import clean_up, render_cpu, run_dirs, start_runner  # noqa: E402

RUN_S = 900  # one check on a loaded two-core machine, generous


def one_check(project: Path, max_bytes: int | None, env: dict[str, str] | None = None) -> dict[str, Any]:
    """One `npu-wizard run --bandwidth` of `project` to its end: its newest bandwidth.json."""
    cap = ("--bandwidth-max-bytes", str(max_bytes)) if max_bytes else ()
    runner = start_runner(project, "--bandwidth", *cap, env=env)
    try:
        output, _ = runner.communicate(timeout=RUN_S)
    finally:
        clean_up(project, runner)
    if runner.returncode != 0:
        raise SystemExit(f"the check failed (exit {runner.returncode}):\n{output}")
    return json.loads((run_dirs(project)[-1] / "bandwidth.json").read_text())


def verdict(result: dict[str, Any]) -> str:
    """The run's slowest link, how far below, and what was named."""
    from runtime.bandwidth_report import link_text, slowest_link

    slow = slowest_link(result["links"])
    if slow is None:
        return "no link measured"
    named = "NAMED" if slow["named"] else "not named"
    devices = ", ".join(device_words(device) for device in slow.get("slow_devices", []))
    return (
        f"slowest {link_text(slow)} {slow['GBps']:.3g} GB/s (best round {slow['best_GBps']:.3g}), "
        f"{slow['below_median_pct']:.0f}% below the median "
        f"{slow['median_GBps']:.3g} GB/s: {named}" + (f" (slow: {devices})" if devices else "")
    )


def device_words(device: dict[str, Any]) -> str:
    """node N local rank L."""
    return f"node {device['node']} local rank {device['local_rank']}"


def quiet_runs(
    runs: int, max_bytes: int | None, keep: Path | None, launcher: str = "torchrun", devices: int = 2
) -> int:
    """Run the check `runs` times on loopback (2 nodes x `devices`); the number of runs that named a slow link."""
    folder = Path(tempfile.mkdtemp(prefix="bw-quiet-", dir=keep))
    project = render_cpu(folder, launcher, nodes=2, devices_per_node=devices)
    named = 0
    worst = 0.0
    for index in range(1, runs + 1):
        start = time.monotonic()
        result = one_check(project, max_bytes)
        named += result["slowest_link"] is not None
        worst = max(worst, max((0.0, *(float(s) for s in _below(result)))))
        print(
            f"run {index}: {verdict(result)}; {time.monotonic() - start:.0f} s, load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
    print(f"quiet loopback runs that named a slow link: {named} of {runs} (goal 0); worst {worst:.0f}% below")
    if keep is None:
        shutil.rmtree(folder, ignore_errors=True)
    return named


def _below(result: dict[str, Any]) -> list[float]:
    from runtime.bandwidth_report import slowest_link

    slow = slowest_link(result["links"])
    return [slow["below_median_pct"]] if slow else []


def shaped_runs(runs: int, max_bytes: int | None) -> None:
    """Run the check `runs` times across three namespaces, node 1 shaped to 200 Mbit/s; print how often it is named."""
    from tests.ssh_hosts import have_ssh_hosts, ssh_hosts
    from tests.test_ssh_engine import render_ssh, runner_env

    if not (have_ssh_hosts() and shutil.which("tc")):
        print("shaped runs: skipped: needs root, sshd, ssh, rsync, ip and tc (iproute2)")
        return
    folder = Path(tempfile.mkdtemp(prefix="bw-shaped-"))
    (folder / "ssh").mkdir()
    named = 0
    try:
        with ssh_hosts(folder / "ssh", count=3) as hosts:
            project = render_ssh(folder, hosts.addresses)
            with hosts.rate_limited(1, "200mbit"):
                for index in range(1, runs + 1):
                    start = time.monotonic()
                    result = one_check(project, max_bytes, runner_env(hosts, project))
                    slow = result["slowest_link"]
                    named += slow is not None and {d["node"] for d in slow["slow_devices"]} == {1}
                    print(f"shaped run {index}: {verdict(result)}; {time.monotonic() - start:.0f} s", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"shaped runs that named node 1's devices (and only them): {named} of {runs} (goal all)")


def main() -> None:
    """Parse the options and run both halves."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="quiet loopback runs")
    parser.add_argument("--shaped-runs", type=int, default=0, help="runs with node 1 shaped to 200 Mbit/s")
    parser.add_argument("--max-bytes", type=int, help="--bandwidth-max-bytes (default: the check's own, 16 MiB)")
    parser.add_argument("--keep", type=Path, help="make the quiet project here and keep it")
    parser.add_argument("--smoke", action="store_true", help="one quiet run of messages up to 64 KiB, 2 x 1 ranks")
    args = parser.parse_args()
    launcher, devices = "torchrun", 2
    if args.smoke:
        args.runs, args.shaped_runs, args.max_bytes = 1, 0, 65536
        # one rank a node still measures a link between the two nodes, judged by the same rule; the shell launcher
        # starts it without a torchrun agent: 2 torch processes instead of 6
        launcher, devices = "shell", 1
        # torchrun gives each of 2+ ranks a node OMP_NUM_THREADS=1: a lone rank would take a thread per core, and on
        # a busy machine its tiny steps would spin, not train
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.runs:
        quiet_runs(args.runs, args.max_bytes, args.keep, launcher, devices)
    if args.shaped_runs:
        shaped_runs(args.shaped_runs, 2 * 1024 * 1024)  # as tests/test_bandwidth.py


if __name__ == "__main__":
    main()
