"""The status stream at scale: thousands of simulated ranks report to node 0's runner, in one run.

The runner side is the real thing: `StatusServer` (token, line bounds,
accept-until-empty) and `JobState` folding every event, drained every 0.2 s
as `npu-wizard run` does. The ranks are simulated by a few client processes:
each rank connects (all of them within --connect-within seconds), presents
the run's token, says hello and started, then sends a step and a heartbeat
every --interval seconds, and bye at the end. Each client counts what it sent
per rank; the runner counts what it received, so "none lost" is exact.

Two phases in one run, the same load: first the baseline, the monitor
keeping every loss point it is sent (as before the bound; --baseline-ranks
changes its rank count), then the bounded monitor. Figures per phase: ranks
accepted, events sent and received, lost, the runner's CPU (share of one
core, steady state) and its memory after warm-up and at the end.

    python benchmarks/status_stream_scale.py [--ranks 4096] [--duration 600] [--baseline-duration 120]
    python benchmarks/status_stream_scale.py --smoke   # 16 ranks for seconds (tests/test_benchmarks_smoke.py)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import secrets
import socket
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from wizard.monitor import ranks as ranks_module  # noqa: E402
from wizard.monitor.state import JobState  # noqa: E402
from wizard.monitor.status_server import StatusServer  # noqa: E402

DRAIN_S = 0.2  # as the runner's tick
SAMPLE_S = 5.0
RANKS_PER_NODE = 16


def line(record: dict) -> bytes:
    """One wire line."""
    return (json.dumps(record) + "\n").encode()


def simulate(address: tuple[str, int], token: str, ranks: range, options: dict, results: multiprocessing.Queue) -> None:
    """Ranks `ranks`, each on its own connection; put {rank: events sent} on `results` at the end."""
    _raise_file_limit()
    start = options["start"]
    sent: Counter[int] = Counter()
    sockets: dict[int, socket.socket] = {}
    for index, rank in enumerate(ranks):
        _sleep_until(start + options["connect_within"] * index / len(ranks))
        connection = socket.create_connection(address)
        now = time.time()
        hello = {"event": "hello", "time": now, "rank": rank, "pid": 100000 + rank, "host": "sim"}
        started = {
            "schema": 1,
            "event": "started",
            "time": now + 1e-6,
            "rank": rank,
            "node": rank // RANKS_PER_NODE,
            "pid": 100000 + rank,
            "world_size": options["world_size"],
            "resumed_step": 0,
            "total_steps": 10**9,
        }
        connection.sendall(line({"token": token}) + line(hello) + line(started))
        sockets[rank] = connection
        sent[rank] += 2
    connected_at = time.monotonic()
    step, tick = 0, start + options["connect_within"]
    while time.monotonic() - start < options["duration"]:
        step += 1
        for rank, connection in sockets.items():
            now = time.time()
            beat = {"schema": 1, "event": "heartbeat", "time": now, "rank": rank, "step": step}
            record = {
                "schema": 1,
                "event": "step",
                "time": now + 1e-6,
                "rank": rank,
                "step": step,
                "epoch": 0,
                "loss": 2.0 / step,
                "samples_per_s": 1000.0,
            }
            connection.sendall(line(beat) + line(record))
            sent[rank] += 2
        tick += options["interval"]
        _sleep_until(tick)
    for rank, connection in sockets.items():
        connection.sendall(line({"schema": 1, "event": "bye", "time": time.time(), "rank": rank}))
        sent[rank] += 1
        connection.close()
    results.put((dict(sent), connected_at - start))


@dataclass
class Phase:
    """What one phase measured."""

    name: str
    ranks: int
    accepted: int
    connect_s: float
    sent: int
    received: int
    lost_ranks: int
    behind_at_end: int
    dropped: int
    cpu_share: float
    rss_warm_mib: float
    rss_end_mib: float
    rss_peak_mib: float
    rss_series: list[tuple[float, float]]


def run_phase(name: str, ranks: int, duration: float, args: argparse.Namespace) -> Phase:
    """One runner and its simulated ranks, for `duration` seconds."""
    token = secrets.token_hex(16)
    server = StatusServer("127.0.0.1", 0, token)
    host, port = server.address.rsplit(":", 1)
    state = JobState(ranks, nodes=max(1, ranks // RANKS_PER_NODE), hang_after=30.0)
    received: Counter[int] = Counter()
    context = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue = context.Queue()
    start = time.monotonic() + 2.0  # the clients have started by then
    options = {
        "start": start,
        "duration": duration,
        "interval": args.interval,
        "connect_within": args.connect_within,
        "world_size": ranks,
    }
    share = -(-ranks // args.clients)
    address = (host, int(port))
    clients = [
        context.Process(target=simulate, args=(address, token, range(i, min(ranks, i + share)), options, results))
        for i in range(0, ranks, share)
    ]
    for client in clients:
        client.start()
    rss: list[tuple[float, float]] = []
    warm_at = start + min(args.warm_up, duration / 3)
    cpu_warm = None
    next_sample = time.monotonic()
    while time.monotonic() < start + duration + 5 and any(c.is_alive() for c in clients):
        for event in server.drain():
            state.ingest(event)
            if event.get("event") != "lost":
                received[event["rank"]] += 1
        now = time.monotonic()
        if now >= next_sample:
            rss.append((now, _rss_mib()))
            next_sample += SAMPLE_S
        if cpu_warm is None and now >= warm_at:
            cpu_warm = (now, time.process_time())
        time.sleep(DRAIN_S)
    cpu_end = (time.monotonic(), time.process_time())
    outcomes = [results.get(timeout=60) for _ in clients]
    for client in clients:
        client.join(timeout=30)
    sent: Counter[int] = Counter()
    for counts, _ in outcomes:
        sent.update({int(rank): n for rank, n in counts.items()})
    # what a slow runner has not read yet is late, not lost: read on until nothing comes for 30 s
    behind = sum(sent.values()) - sum(received.values())
    quiet_since = time.monotonic()
    while sum(received.values()) < sum(sent.values()) and time.monotonic() - quiet_since < 30:
        events = server.drain()
        for event in events:
            state.ingest(event)
            if event.get("event") != "lost":
                received[event["rank"]] += 1
        quiet_since = time.monotonic() if events else quiet_since
        time.sleep(DRAIN_S)
    accepted = server.counts.accepted
    dropped = server.counts.dropped_lines + server.counts.rejected_connections
    server.close()
    warm = next((mib for at, mib in rss if at >= warm_at), rss[-1][1] if rss else 0.0)
    cpu_share = (cpu_end[1] - cpu_warm[1]) / (cpu_end[0] - cpu_warm[0]) if cpu_warm else float("nan")
    return Phase(
        name=name,
        ranks=ranks,
        accepted=accepted,
        connect_s=max(connect for _, connect in outcomes),
        sent=sum(sent.values()),
        received=sum(received.values()),
        lost_ranks=sum(1 for rank in range(ranks) if received[rank] < sent[rank]),
        behind_at_end=behind,
        dropped=dropped,
        cpu_share=cpu_share,
        rss_warm_mib=warm,
        rss_end_mib=rss[-1][1] if rss else 0.0,
        rss_peak_mib=max(mib for _, mib in rss) if rss else 0.0,
        rss_series=[(at - start, mib) for at, mib in rss],
    )


def main() -> None:
    """Run the baseline phase, then the bounded one, and print both."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4096)
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of the bounded phase")
    parser.add_argument("--baseline-ranks", type=int, help="ranks of the baseline phase (default: --ranks)")
    parser.add_argument("--baseline-duration", type=float, default=120.0)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between each rank's reports")
    parser.add_argument("--connect-within", type=float, default=1.0)
    parser.add_argument("--warm-up", type=float, default=30.0, help="seconds before CPU and memory count")
    parser.add_argument("--clients", type=int, default=8, help="client processes simulating the ranks")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks that it runs and prints (seconds)")
    args = parser.parse_args()
    if args.smoke:
        args.ranks, args.duration, args.baseline_duration, args.warm_up, args.clients = 16, 3.0, 2.0, 1.0, 2
    _raise_file_limit()

    bounded = ranks_module.LOSS_HISTORY
    ranks_module.LOSS_HISTORY = None  # the baseline: every loss point kept, as before the bound
    phases = [run_phase("baseline: unbounded history", args.baseline_ranks or args.ranks, args.baseline_duration, args)]
    ranks_module.LOSS_HISTORY = bounded
    phases.append(run_phase(f"bounded history ({bounded} points)", args.ranks, args.duration, args))

    print(
        f"status stream, {args.interval:g}s report interval, connects within {args.connect_within:g}s; "
        f"load average {Path('/proc/loadavg').read_text().split()[0]} on {os.cpu_count()} cores at the end"
    )
    print("lost: ranks with fewer events received than sent; behind: events not yet read when the clients ended")
    header = (
        f"{'phase':32} {'ranks':>6} {'accepted':>8} {'connect':>8} {'sent':>10} {'received':>10} "
        f"{'lost':>5} {'behind':>7} {'dropped':>7} {'runner CPU':>10} {'RSS warm':>9} {'RSS end':>8} {'RSS peak':>8}"
    )
    print(header)
    for p in phases:
        print(
            f"{p.name:32} {p.ranks:6d} {p.accepted:8d} {p.connect_s:7.2f}s {p.sent:10d} {p.received:10d} "
            f"{p.lost_ranks:5d} {p.behind_at_end:7d} {p.dropped:7d} {p.cpu_share:9.0%}  "
            f"{p.rss_warm_mib:7.1f}M {p.rss_end_mib:7.1f}M {p.rss_peak_mib:7.1f}M"
        )
    for p in phases:
        every_30s = [f"{at:.0f}s {mib:.0f}M" for at, mib in p.rss_series if at >= 0][::6]
        print(f"{p.name} RSS every 30 s: {', '.join(every_30s)}")
    main_phase = phases[-1]
    verdict = main_phase.lost_ranks == 0 and main_phase.accepted == main_phase.ranks and main_phase.cpu_share < 0.5
    growth = main_phase.rss_end_mib - main_phase.rss_warm_mib
    print(
        f"bounded phase: none lost and runner below half a core: {'yes' if verdict else 'NO'}; "
        f"memory after warm-up grew {growth:+.1f} MiB"
    )


def _rss_mib() -> float:
    for row in Path("/proc/self/status").read_text().splitlines():
        if row.startswith("VmRSS:"):
            return int(row.split()[1]) / 1024
    return 0.0


def _sleep_until(moment: float) -> None:
    delay = moment - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def _raise_file_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


if __name__ == "__main__":
    main()
