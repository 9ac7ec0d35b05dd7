"""The network check's link round: each local rank's link, the slow-link rule and the buffers.

Every NPU has its own NIC, so each local rank of node k is measured against
the same local rank of node k+1 and a slow one is named with its node, local
rank and device. A transfer counts at its median round and the reference is
the median of the nodes' figures, so a few slowed (or lucky) rounds on a busy
host name nothing. The rule is pinned on small inputs; the round itself runs
for real on 4 gloo processes (2 simulated nodes x 2 local ranks), with the
transfers of a node pair's local ranks at once as on NPUs, and so do the
check's buffers, which must start as zeros.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from runtime import bandwidth
from runtime.bandwidth import Place, device_id, link_steps, link_target_s, link_transfers
from runtime.bandwidth_report import link_lines, link_row, slowest_link
from runtime.distributed import RankInfo

MB = 1 << 20


def transfer(a: int, b: int, gbps: float | list[float], local: int = 0, devices: bool = False) -> dict[str, Any]:
    """A link row from node a to node b of `local`, at `gbps` in every round (or at each of a list)."""
    rounds = gbps if isinstance(gbps, list) else [gbps] * 5
    ids = (local, local) if devices else (None, None)
    return link_row(a, b, MB, [MB / (speed * 1e9) for speed in rounds], local_rank=local, devices=ids)


def ring(nodes: int, locals_: int, speed: Any) -> list[dict[str, Any]]:
    """Every transfer of a ring of `nodes` x `locals_`, each at speed(from, to, local)."""
    pairs = [(k, k + 1) for k in range(nodes - 1)] + ([(nodes - 1, 0)] if nodes > 2 else [])
    return [
        transfer(a, b, speed(a, b, local), local, devices=True)
        for x, y in pairs
        for a, b in ((x, y), (y, x))
        for local in range(locals_)
    ]


# ---- the rule -------------------------------------------------------------------------


def test_a_transfer_counts_at_its_median_round_and_its_best() -> None:
    link = transfer(1, 0, [1.0, 0.15, 0.9, 0.2, 0.5])
    assert (link["GBps"], link["best_GBps"]) == (pytest.approx(0.5), pytest.approx(1.0))
    assert link["rounds_GBps"] == pytest.approx([1.0, 0.15, 0.9, 0.2, 0.5])


def test_a_link_slow_in_most_rounds_of_a_busy_loopback_but_not_in_all_is_not_named() -> None:
    # the rounds of a quiet 2 x 2 loopback run here (64 KiB messages, load 21): the median round of the
    # last transfer is 61% below the median node link, the best of local rank 0's first two rounds each
    # way (the rule before) 84% below the mean of both ways; but every transfer had a round near or above it
    rounds = {
        (0, 1, 0): [0.00678, 0.281, 0.0825, 0.0336, 0.0156],
        (0, 1, 1): [0.0237, 0.312, 0.0661, 0.0104, 0.00936],
        (1, 0, 0): [0.0107, 0.0249, 0.0265, 0.0222, 0.0138],
        (1, 0, 1): [0.00688, 0.00885, 0.0417, 0.0203, 0.00841],
    }
    links = [transfer(a, b, speeds, local) for (a, b, local), speeds in rounds.items()]
    found = slowest_link(links)
    assert found is not None
    assert (found["named"], found["slow_devices"]) == (False, [])
    assert 1 - links[3]["GBps"] / found["median_GBps"] == pytest.approx(0.61, abs=0.01)
    assert found["below_median_pct"] < 0


def test_a_link_slow_in_every_round_is_named() -> None:
    healthy = [1.0, 0.2, 1.1, 0.9, 1.0]  # one slowed round
    links = [transfer(0, 1, healthy, 0), transfer(0, 1, healthy, 1), transfer(1, 0, healthy, 0)]
    found = slowest_link([*links, transfer(1, 0, [0.3, 0.2, 0.4, 0.3, 0.25], 1)])
    assert found is not None
    assert (found["named"], found["from_node"], found["local_rank"]) == (True, 1, 1)
    assert (found["best_GBps"], found["below_median_pct"]) == (pytest.approx(0.4), 60.0)


def test_a_lucky_fast_transfer_does_not_make_the_others_slow() -> None:
    # bandwidth.json of a quiet 2 x 2 loopback run here: one transfer 5x faster than the rest
    speeds = {(0, 1, 0): 0.494, (0, 1, 1): 0.555, (1, 0, 0): 2.49, (1, 0, 1): 0.444}
    found = slowest_link([transfer(a, b, gbps, local) for (a, b, local), gbps in speeds.items()])
    assert found is not None
    assert (found["named"], found["median_GBps"]) == (False, pytest.approx((0.494 + 0.555) / 2))


def test_one_slow_device_among_eight_per_node_is_named_with_its_node_local_rank_and_device() -> None:
    links = ring(3, 8, lambda a, b, local: 0.1 if local == 5 and 1 in (a, b) else 1.0)
    found = slowest_link(links)
    assert found is not None and found["named"] is True
    assert found["node"] == 1 and found["device"] == {"node": 1, "local_rank": 5, "device": 5}
    assert found["slow_devices"] == [{"node": 1, "local_rank": 5, "device": 5}]
    assert found["median_GBps"] == pytest.approx(1.0)
    verdict = link_lines(links, 3)[-2:]
    assert verdict[0].startswith("  SLOW LINK: node 1 local rank 5 (device 5)'s: node ")
    assert (
        "(local rank 5, device 5 -> 5) at 0.1 GB/s (best round 0.1), 90% below the median node link (1 GB/s)"
        in (verdict[0])
    )
    assert verdict[1] == "  slow devices (their links' median more than 50% below): node 1 local rank 5 (device 5)"


def test_a_node_slow_on_every_device_names_each_of_its_devices() -> None:
    found = slowest_link(ring(3, 2, lambda a, b, local: 0.025 if 1 in (a, b) else 1.0))
    assert found is not None and found["node"] == 1
    assert [(d["node"], d["local_rank"]) for d in found["slow_devices"]] == [(1, 0), (1, 1)]


def test_with_two_nodes_a_slow_pair_names_both_ends_and_no_single_device() -> None:
    found = slowest_link(ring(2, 4, lambda a, b, local: 0.2 if local == 2 else 1.0))
    assert found is not None and found["named"] is True
    assert (found["node"], found["device"]) == (None, None)
    assert [(d["node"], d["local_rank"]) for d in found["slow_devices"]] == [(0, 2), (1, 2)]


def test_the_table_has_a_line_per_node_pair_and_direction_with_each_local_rank() -> None:
    links = ring(2, 2, lambda a, b, local: 1.0 + 0.1 * local)
    assert link_lines(links, 2, "local ranks at once")[:3] == [
        "  links (each local rank to the same local rank of the next node, 1 MiB messages; local ranks at once):",
        "    node 0 -> node 1: 1, 1.1 GB/s (local ranks 0, 1)",
        "    node 1 -> node 0: 1, 1.1 GB/s (local ranks 0, 1)",
    ]


# ---- the round's plan -----------------------------------------------------------------


def places(order: list[tuple[int, int]]) -> list[Place]:
    """Places by global rank, each (node, local rank), on the CPU."""
    return [Place(rank, node, local, None) for rank, (node, local) in enumerate(order)]


def test_each_local_rank_sends_to_the_same_local_rank_of_the_next_node_and_back() -> None:
    found = places([(1, 0), (0, 0), (2, 1), (1, 1), (0, 1), (2, 0)])  # the launcher's order, not node order
    plan = [(t.sender.node, t.receiver.node, t.sender.local_rank, t.receiver.rank) for t in link_transfers(found)]
    assert plan == [
        (0, 1, 0, 0), (0, 1, 1, 3), (1, 0, 0, 1), (1, 0, 1, 4),
        (1, 2, 0, 5), (1, 2, 1, 2), (2, 1, 0, 0), (2, 1, 1, 3),
        (2, 0, 0, 1), (2, 0, 1, 4), (0, 2, 0, 5), (0, 2, 1, 2),
    ]  # fmt: skip


def test_only_the_local_ranks_both_nodes_have_are_paired() -> None:
    found = places([(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)])
    assert [(t.sender.rank, t.receiver.rank) for t in link_transfers(found)] == [(0, 3), (1, 4), (3, 0), (4, 1)]


def test_on_devices_a_node_pairs_local_ranks_go_at_once_on_the_cpu_one_at_a_time() -> None:
    transfers = link_transfers(places([(node, local) for node in range(3) for local in range(2)]))
    assert link_steps(transfers, at_once=True) == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11]]
    assert link_steps(transfers, at_once=False) == [[index] for index in range(12)]


@pytest.mark.parametrize("steps", [1, 6, 32, 256, 4096])
def test_the_link_round_is_bounded_however_many_transfers(steps: int) -> None:
    timed = steps * bandwidth.P2P_ROUNDS * link_target_s(steps)
    assert timed <= max(bandwidth.LINK_BUDGET_S, steps * bandwidth.P2P_ROUNDS * bandwidth.P2P_MIN_S)
    assert link_target_s(steps) <= bandwidth.P2P_TARGET_S


def test_the_device_id_is_the_nodes_as_the_visible_devices_list_numbers_it(monkeypatch: pytest.MonkeyPatch) -> None:
    npu_2 = SimpleNamespace(type="npu", index=2)  # stands in for torch.device("npu:2"): no torch_npu here
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "4,5,6,7")
    assert device_id(npu_2) == 6  # type: ignore[arg-type]
    monkeypatch.delenv("ASCEND_RT_VISIBLE_DEVICES")
    assert device_id(npu_2) == 2  # type: ignore[arg-type]
    assert device_id(torch.device("cpu")) == -1


# ---- for real: 4 gloo processes, 2 simulated nodes x 2 local ranks --------------------

WORLD = 4
REDUCTIONS = 130  # 4 ranks double a buffer of ones twice per all_reduce: past float32 (2**128) after 64


def gloo_rank(index: int, store: str, out: str) -> None:
    """Global rank `index` of node index % 2, local rank index // 2: the buffers, then the link round."""
    node, local = index % 2, index // 2  # ranks interleaved across the nodes, as a launcher may give them
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=index, world_size=WORLD)
    try:
        cpu = torch.device("cpu")
        buffers = {}
        for op in ("all_reduce", "all_gather"):
            collective = bandwidth._collective(op, 4096, WORLD, cpu, "gloo")
            for _ in range(REDUCTIONS):
                collective.run()
            buffers[op] = float(collective.buffer.abs().max())
        rank = RankInfo(index, local, WORLD, 2, node, "torchrun")
        transfers = link_transfers(bandwidth._places(rank, cpu))
        steps = link_steps(transfers, at_once=True)
        links = bandwidth._link_round(rank, cpu, transfers, steps, 64 * 1024)
        Path(out, f"{index}.json").write_text(json.dumps({"buffers": buffers, "links": links, "steps": steps}))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def gloo_results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """What each of the 4 ranks found. Its readers carry the xdist_group mark "gloo-link-round": one worker
    spawns the 4 processes once for both."""
    folder = tmp_path_factory.mktemp("gloo")
    mp.spawn(gloo_rank, args=(str(folder / "store"), str(folder)), nprocs=WORLD, join=True)
    return [json.loads((folder / f"{index}.json").read_text()) for index in range(WORLD)]


@pytest.mark.slow
@pytest.mark.xdist_group("gloo-link-round")
def test_the_checks_buffers_start_as_zeros_and_stay_finite_however_often_reduced(
    gloo_results: list[dict[str, Any]],
) -> None:
    for found in gloo_results:
        assert found["buffers"] == {"all_reduce": 0.0, "all_gather": 0.0}


@pytest.mark.slow
@pytest.mark.xdist_group("gloo-link-round")
def test_every_local_ranks_link_is_measured_with_a_node_pairs_local_ranks_at_once(
    gloo_results: list[dict[str, Any]],
) -> None:
    links = gloo_results[0]["links"]
    assert [(link["from_node"], link["to_node"], link["local_rank"]) for link in links] == [
        (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1),
    ]  # fmt: skip
    assert gloo_results[0]["steps"] == [[0, 1], [2, 3]]
    for link in links:
        assert link["GBps"] > 0 and len(link["rounds_GBps"]) == bandwidth.P2P_ROUNDS
        assert all(speed > 0 for speed in link["rounds_GBps"])
    assert all(found["links"] == links for found in gloo_results)  # every rank got every result
