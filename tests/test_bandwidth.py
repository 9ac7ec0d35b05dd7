"""The network check, `npu-wizard run PROJECT --smoke --bandwidth`.

For real: three hosts (network namespaces with their own sshd on one bridge,
tests/ssh_hosts.py) run the CPU demo through the ssh engine, 2 ranks each (each
local rank has its own link); tc shapes the middle host's link to 200 Mbit/s both
ways. The runs here start their ranks with the shell launcher: the check is the
ranks', and a torchrun agent would only add a process that imports torch on each node. The check must name that
node's devices, measure the link within 20% of the limit (its fastest
transfer), and name no link without the limit. The figures (nccl-tests' bus
bandwidth, the slow-link rule) and the table are pinned on small inputs.
"""

from __future__ import annotations

import json
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime.bandwidth_report import bus_factor, collective_row, link_row, ring_pairs, slowest_link, table_lines
from tests.runs import clean_up, node_env, render_cpu, run_dirs, start_runner
from tests.ssh_hosts import SshHosts, have_ssh_hosts, ssh_hosts
from tests.test_ssh_engine import START_S, render_ssh, runner_env
from wizard.cli import main

LIMIT_MBIT = 200
LIMIT_GBPS = LIMIT_MBIT * 1e6 / 8 / 1e9  # 0.025 GB/s
CHECK_BYTES = str(2 * 1024 * 1024)  # the largest message: keeps the shaped sweep to seconds
CONTRACT_KEYS = {
    "backend",
    "world_size",
    "nodes",
    "collectives",
    "latency_us",
    "links",
    "link_mode",
    "slowest_link",
    "expected",
}


# ---- the figures ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "ranks", "factor"),
    [
        ("all_reduce", 2, 1.0),
        ("all_reduce", 8, 1.75),
        ("all_reduce", 1, 0.0),
        ("all_gather", 8, 0.875),
        ("reduce_scatter", 8, 0.875),
    ],
)
def test_bus_bandwidth_follows_nccl_tests(op: str, ranks: int, factor: float) -> None:
    assert bus_factor(op, ranks) == factor
    row = collective_row(op, 8_000_000, 0.002, ranks)
    assert row["algbw_GBps"] == pytest.approx(4.0)
    assert row["busbw_GBps"] == pytest.approx(4.0 * factor)


def test_an_unknown_collective_is_refused() -> None:
    with pytest.raises(ValueError, match="broadcast"):
        bus_factor("broadcast", 4)


def test_the_round_pairs_neighbours_and_closes_the_ring_from_three_nodes() -> None:
    assert ring_pairs(1) == []
    assert ring_pairs(2) == [(0, 1)]
    assert ring_pairs(4) == [(0, 1), (1, 2), (2, 3), (3, 0)]


def links_of(speeds: dict[tuple[int, int], float]) -> list[dict[str, Any]]:
    """Link rows with the given GB/s per (from, to)."""
    return [link_row(a, b, 1 << 20, [(1 << 20) / (gbps * 1e9)]) for (a, b), gbps in speeds.items()]


def test_a_node_slow_both_ways_is_named_against_the_median_of_the_nodes_link_speeds() -> None:
    slow, fast = 0.025, 1.0
    speeds = {(0, 1): slow, (1, 0): slow, (1, 2): slow * 1.1, (2, 1): slow, (2, 0): fast, (0, 2): fast * 0.9}
    found = slowest_link(links_of(speeds))
    assert found is not None
    assert (found["from_node"], found["to_node"], found["node"], found["named"]) == (0, 1, 1, True)
    # node 0 took part in s, s, fast, 0.9 fast; node 2 in 1.1 s, s, fast, 0.9 fast; node 1 only in slow ones
    assert found["median_GBps"] == pytest.approx((slow + 0.9 * fast) / 2)
    assert found["below_median_pct"] == pytest.approx(94.6)


def test_links_within_half_of_the_median_name_nothing() -> None:
    speeds = {(0, 1): 1.0, (1, 0): 0.7, (1, 2): 0.9, (2, 1): 1.1, (2, 0): 0.6, (0, 2): 1.0}
    found = slowest_link(links_of(speeds))
    assert found is not None
    assert found["named"] is False and (found["from_node"], found["to_node"]) == (2, 0)


def test_two_nodes_name_a_one_way_slow_pair_but_no_node() -> None:
    found = slowest_link(links_of({(0, 1): 1.0, (1, 0): 0.2}))
    assert found is not None
    assert (found["named"], found["node"], found["from_node"]) == (True, None, 1)
    assert slowest_link(links_of({(0, 1): 0.2, (1, 0): 0.2}))["named"] is False  # type: ignore[index]


def test_the_table_has_a_row_per_size_the_latency_and_the_verdict() -> None:
    result = {
        "backend": "gloo",
        "world_size": 4,
        "nodes": 2,
        "collectives": [collective_row("all_reduce", 4096, 0.0001, 4), collective_row("all_gather", 1 << 20, 0.01, 4)],
        "latency_us": 100.0,
        "links": links_of({(0, 1): 1.0, (1, 0): 0.25}),
        "link_mode": "one at a time",
    }
    assert table_lines(result) == [
        "bandwidth: gloo, 4 ranks on 2 node(s); GB/s = 1e9 bytes/s; busbw = algbw x 2(n-1)/n (all_reduce), "
        "x (n-1)/n (all_gather, reduce_scatter), as nccl-tests",
        "  op              size       time  algbw GB/s  busbw GB/s",
        "  all_reduce     4 KiB   100.0 us       0.041      0.0614",
        "  all_gather     1 MiB   10.00 ms       0.105      0.0786",
        "  latency: 100.0 us (all_reduce of 4 KiB)",
        "  links (each local rank to the same local rank of the next node, 1 MiB messages; one at a time):",
        "    node 0 -> node 1: 1 GB/s (local rank 0)",
        "    node 1 -> node 0: 0.25 GB/s (local rank 0)",
        "  SLOW LINK: node 1 -> node 0 (local rank 0) at 0.25 GB/s (best round 0.25), 60% below the median node link "
        "(0.625 GB/s)",
    ]


# ---- the command line -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--bandwidth-max-bytes", "65536"], "--bandwidth-max-bytes only goes with --bandwidth"),
        (["--bandwidth", "--bandwidth-max-bytes", "100"], "4096 or more"),
    ],
)
def test_a_cap_without_the_check_or_below_the_smallest_message_is_a_usage_error(
    tmp_path: Path, args: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    project = render_cpu(tmp_path, "torchrun")
    with pytest.raises(SystemExit) as stopped:
        main(["run", str(project), "--plain", *args])
    assert stopped.value.code == 2
    assert said in capsys.readouterr().err
    assert run_dirs(project) == []


def run_check(project: Path, env: dict[str, str] | None = None, timeout: float = START_S) -> tuple[str, dict]:
    """`npu-wizard run PROJECT --bandwidth` to its end: its output and its bandwidth.json."""
    runner = start_runner(project, "--bandwidth", "--bandwidth-max-bytes", CHECK_BYTES, env=env)
    try:
        output, _ = runner.communicate(timeout=timeout)
    finally:
        clean_up(project, runner)
    print(output)  # pytest shows it when the test fails: the table and the links
    assert runner.returncode == 0, output
    (run_dir,) = run_dirs(project)
    return output, json.loads((run_dir / "bandwidth.json").read_text())


@pytest.mark.slow
def test_two_simulated_nodes_on_this_host_write_the_table_and_bandwidth_json(tmp_path: Path) -> None:
    project = render_cpu(tmp_path, "shell", nodes=2)
    output, result = run_check(project)
    assert set(result) == CONTRACT_KEYS
    assert (result["backend"], result["world_size"], result["nodes"]) == ("gloo", 4, 2)
    sizes = [4096 * 2**k for k in range(10)]  # 4 KiB .. 2 MiB
    assert [(row["op"], row["bytes"]) for row in result["collectives"]] == [
        *(("all_reduce", size) for size in sizes),
        *(("all_gather", size) for size in sizes),
    ]
    for row in result["collectives"]:
        assert row["time_s"] > 0
        assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * bus_factor(row["op"], 4))
    assert result["latency_us"] == pytest.approx(result["collectives"][0]["time_s"] * 1e6)
    assert [(link["from_node"], link["to_node"], link["local_rank"]) for link in result["links"]] == [
        (0, 1, 0),
        (0, 1, 1),
        (1, 0, 0),
        (1, 0, 1),
    ]
    assert result["link_mode"] == "one at a time"  # gloo: the local ranks share the host's NIC
    assert result["expected"]["note"].startswith("a CPU simulation (gloo): no figure of the Atlas")
    assert "  all_gather     2 MiB" in output
    assert "smoke ok: 4/4 ranks" in output


@pytest.mark.slow
def test_one_node_of_a_sharded_project_measures_its_collectives_and_says_there_is_no_link_between_nodes(
    tmp_path: Path,
) -> None:
    # fsdp2 (training.parallelism): reduce_scatter too, and all_gather into one tensor, as fully_shard runs them
    project = render_cpu(tmp_path, "shell", nodes=1, parallelism="fsdp2")
    output, result = run_check(project)
    assert (result["world_size"], result["nodes"], result["links"], result["slowest_link"]) == (2, 1, [], None)
    ops = [row["op"] for row in result["collectives"]]
    assert ops == ["all_reduce"] * 10 + ["all_gather"] * 10 + ["reduce_scatter"] * 10
    scatter = [row for row in result["collectives"] if row["op"] == "reduce_scatter"]
    assert all(row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] / 2) for row in scatter)  # (n-1)/n, n = 2
    assert "  reduce_scatter    4 KiB" in output
    assert "  links: none measured (1 node: no link between nodes)" in output


@pytest.mark.slow
def test_node_0s_runner_reports_and_node_1s_points_there(tmp_path: Path) -> None:
    project = render_cpu(tmp_path, "shell", nodes=2, devices_per_node=1)  # which runner reports: one rank a node
    # both runners hand their ranks the same run token, as every node's runner must; one thread a rank: both nodes
    # share this machine's cores, and a node's only rank would otherwise take them all (runtime/device.py)
    env = node_env(tmp_path / "unused", NPU_WIZARD_STATUS_TOKEN=secrets.token_hex(16), OMP_NUM_THREADS="1")
    args = ("--bandwidth", "--bandwidth-max-bytes", "65536")
    runners = [start_runner(project, "--node", str(node), *args, env=env) for node in (0, 1)]
    try:
        outputs = [runner.communicate(timeout=START_S)[0] for runner in runners]
    finally:
        clean_up(project, *runners)
    assert [runner.returncode for runner in runners] == [0, 0], outputs
    assert "  links (each local rank to the same local rank of the next node, 4 MiB messages" in outputs[0]
    assert "bandwidth: measured by rank 0: node 0's runner prints the table" in outputs[1]
    written = [run_dir for run_dir in run_dirs(project) if (run_dir / "bandwidth.json").is_file()]
    assert len(written) == 1 and str(written[0]) in outputs[0]


# ---- for real: three hosts, one shaped with tc ----------------------------------------


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshHosts]:
    """Three hosts with their own addresses and sshd on one bridge."""
    if not (have_ssh_hosts() and shutil.which("tc")):
        pytest.skip("needs root, sshd, ssh, rsync, ip and tc (iproute2)")
    with ssh_hosts(tmp_path_factory.mktemp("ssh"), count=3) as started:
        yield started


def check_across(tmp_path: Path, hosts: SshHosts) -> tuple[str, dict]:
    """The check on the CPU demo rendered for the three hosts, 2 ranks each, through the ssh engine."""
    project = render_ssh(tmp_path, hosts.addresses, launcher="shell")
    return run_check(project, runner_env(hosts, project), timeout=START_S + 240)


@pytest.mark.slow
def test_a_node_whose_link_is_shaped_to_200_mbit_is_named_and_measured_within_20_percent(
    tmp_path: Path, hosts: SshHosts
) -> None:
    with hosts.rate_limited(1, f"{LIMIT_MBIT}mbit"):
        output, result = check_across(tmp_path, hosts)
    assert (result["world_size"], result["nodes"]) == (6, 3)
    slow = result["slowest_link"]
    assert slow is not None, output
    assert slow["node"] == 1 and 1 in (slow["from_node"], slow["to_node"]), output
    assert [(device["node"], device["local_rank"]) for device in slow["slow_devices"]] == [(1, 0), (1, 1)]
    shaped = [link for link in result["links"] if 1 in (link["from_node"], link["to_node"])]
    assert len(shaped) == 8  # 2 node pairs x 2 ways x 2 local ranks
    # the link's speed is its fastest transfer's best round, within 20% of the limit, and no transfer passes it;
    # with both cores busy some connections stay near 58% of it in every round (local rank 0's in 3 runs of 3
    # here, whatever the round's length; cause not found), so each transfer is only held between 50% and 120%
    assert max(link["best_GBps"] for link in shaped) == pytest.approx(LIMIT_GBPS, rel=0.2), output
    assert all(LIMIT_GBPS / 2 < link["best_GBps"] < LIMIT_GBPS * 1.2 for link in shaped), output
    assert f"SLOW LINK: node 1 local rank {slow['local_rank']}'s: node " in output
    assert "slow devices (their links' median more than 50% below): node 1 local rank 0, node 1 local rank 1" in output


@pytest.mark.slow
def test_without_the_limit_no_link_is_named(tmp_path: Path, hosts: SshHosts) -> None:
    output, result = check_across(tmp_path, hosts)
    assert result["slowest_link"] is None, output
    assert len(result["links"]) == 12
    assert min(link["GBps"] for link in result["links"]) > 4 * LIMIT_GBPS, output
    assert "no slow link: the slowest, node " in output


def test_a_one_rank_project_is_refused_the_check_and_nothing_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    project = render_cpu(tmp_path, "torchrun", devices_per_node=1)
    code = main(["run", str(project), "--plain", "--smoke", "--bandwidth"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "--bandwidth needs 2 ranks or more" in err and "Use --smoke alone" in err
    assert run_dirs(project) == []
