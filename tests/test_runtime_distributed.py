"""Rank, local rank and world size come out the same whichever launcher started the rank."""

from __future__ import annotations

import datetime
import socket
from pathlib import Path

import pytest

from runtime import distributed, nic
from runtime.distributed import RankInfo
from runtime.errors import LaunchError
from tests.runs import free_port

MASTER = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def torchrun_env(rank: int, local_rank: int, world: int = 4, local_world: int = 2) -> dict[str, str]:
    """The environment torchrun (and torch_npu_run, and our shell loop) gives a rank."""
    return {
        **MASTER,
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(local_world),
        "NODE_RANK": str(rank // local_world),
    }


EXPECTED = RankInfo(rank=3, local_rank=1, world_size=4, local_world_size=2, node_rank=1, launcher="")


@pytest.mark.parametrize("launcher", ["shell", "torchrun", "torch-npu-run"])
def test_env_launchers_read_the_rank_from_the_environment(launcher: str) -> None:
    info = distributed.rank_info(launcher, env=torchrun_env(3, 1), nnodes=2, nproc_per_node=2)
    assert info == RankInfo(**{**EXPECTED.__dict__, "launcher": launcher})


@pytest.mark.parametrize("flag_value", [1, None], ids=["--local-rank", "LOCAL_RANK-only"])
def test_torch_launch_takes_the_local_rank_argument_or_the_environment(flag_value: int | None) -> None:
    env = torchrun_env(3, 1)
    if flag_value is not None:
        env["LOCAL_RANK"] = "0"  # the argument wins over a stale environment
    info = distributed.rank_info("torch-launch", local_rank=flag_value, env=env, nnodes=2, nproc_per_node=2)
    assert info == RankInfo(**{**EXPECTED.__dict__, "launcher": "torch-launch"})


def test_mp_spawn_derives_the_global_rank_from_node_and_local_rank() -> None:
    info = distributed.rank_info("mp-spawn", local_rank=1, nnodes=2, node_rank=1, nproc_per_node=2, env=MASTER)
    assert info == RankInfo(**{**EXPECTED.__dict__, "launcher": "mp-spawn"})


def test_mp_spawn_takes_the_node_rank_from_the_environment_when_not_given() -> None:
    info = distributed.rank_info("mp-spawn", local_rank=0, nnodes=2, nproc_per_node=2, env={**MASTER, "NODE_RANK": "1"})
    assert (info.rank, info.node_rank) == (2, 1)


def test_torchrun_without_node_rank_falls_back_to_group_rank() -> None:
    env = torchrun_env(3, 1)
    del env["NODE_RANK"]
    env["GROUP_RANK"] = "1"
    assert distributed.rank_info("torchrun", env=env).node_rank == 1


def test_a_missing_launcher_variable_is_named() -> None:
    env = torchrun_env(0, 0)
    del env["WORLD_SIZE"], env["MASTER_PORT"]
    with pytest.raises(LaunchError, match=r"^torchrun: WORLD_SIZE, MASTER_PORT not set; start train.py through"):
        distributed.rank_info("torchrun", env=env)


def test_mp_spawn_needs_the_master_address() -> None:
    with pytest.raises(LaunchError, match=r"^mp-spawn: MASTER_ADDR, MASTER_PORT not set"):
        distributed.rank_info("mp-spawn", local_rank=0, env={})


def test_a_non_integer_rank_is_refused() -> None:
    with pytest.raises(LaunchError, match=r"RANK='one' is not an integer"):
        distributed.rank_info("shell", env={**torchrun_env(0, 0), "RANK": "one"})


def test_env_int_reads_the_launch_scripts_counts() -> None:
    assert distributed.env_int("NNODES", 1, {"NNODES": "4"}) == 4
    assert distributed.env_int("NNODES", 1, {}) == 1


def test_loopback_maps_to_lo() -> None:
    assert distributed.interface_for_address("127.0.0.1") == "lo"
    assert distributed.interface_for_address("::1") == "lo"


def outward_address() -> str:
    """The IPv4 address this host routes outward from (a UDP socket's bound address)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.254", 9))
        except OSError:
            pytest.skip("no IPv4 route on this machine")
        return probe.getsockname()[0]


def outward_interface() -> str:
    """The interface holding outward_address()."""
    name = distributed.interface_for_address(outward_address())
    assert name is not None
    return name


def test_an_ipv4_address_maps_to_the_interface_holding_it() -> None:
    name = distributed.interface_for_address(outward_address())
    assert name is not None and name in {n for _i, n in socket.if_nameindex()}


def test_an_ipv6_address_maps_through_proc_net_if_inet6(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = tmp_path / "if_inet6"
    table.write_text(
        "fe80000000000000000000fffe000001 02 40 20 80     eth0\n"
        "fd000000000000000000000000000002 02 40 00 80     eth0\n"
        "fd000000000000000000000000000009 03 40 00 80     ib0\n"
    )
    monkeypatch.setattr(nic, "IF_INET6", table)
    assert distributed.interface_for_address("fd00::9") == "ib0"
    assert distributed.interface_for_address("fd00::2") == "eth0"
    assert distributed.interface_for_address("fd00::7") is None


def test_an_address_no_interface_holds_is_none() -> None:
    assert distributed.interface_for_address("203.0.113.77") is None


def test_gloo_uses_the_interface_of_hccl_if_ip() -> None:
    env = {"HCCL_IF_IP": "127.0.0.1"}
    assert distributed.configure_gloo_interface(env) == "lo"
    assert env["GLOO_SOCKET_IFNAME"] == "lo"


def test_an_explicit_gloo_interface_is_kept() -> None:
    env = {"HCCL_IF_IP": "127.0.0.1", "GLOO_SOCKET_IFNAME": "eth7"}
    assert distributed.configure_gloo_interface(env) == "eth7"


def test_without_hccl_if_ip_gloo_is_left_alone() -> None:
    env: dict[str, str] = {}
    assert distributed.configure_gloo_interface(env) is None
    assert env == {}


def test_gloo_follows_the_nic_hccl_socket_ifname_names() -> None:
    exact = {"HCCL_SOCKET_IFNAME": "=lo"}
    assert distributed.configure_gloo_interface(exact) == "lo"
    assert exact["GLOO_SOCKET_IFNAME"] == "lo"
    outward = outward_interface()
    prefix = {"HCCL_SOCKET_IFNAME": f"nosuch,{outward[:2]}"}
    assert distributed.configure_gloo_interface(prefix) == nic.socket_ifname_interfaces(outward[:2])[0]


def test_a_nic_name_this_host_lacks_is_a_clear_error() -> None:
    with pytest.raises(LaunchError, match=r"^HCCL_SOCKET_IFNAME=nosuch0 names no interface with an address on "):
        distributed.configure_gloo_interface({"HCCL_SOCKET_IFNAME": "nosuch0"})


def test_socket_ifname_patterns_follow_hccl_prefix_exact_and_exclude_rules() -> None:
    names = ["lo", "eth0", "eth10", "enp3s0", "docker0", "ib0"]
    assert nic.socket_ifname_interfaces("eth", names) == ["eth0", "eth10"]
    assert nic.socket_ifname_interfaces("eth,enp", names) == ["eth0", "eth10", "enp3s0"]
    assert nic.socket_ifname_interfaces("=eth0", names) == ["eth0"]
    assert nic.socket_ifname_interfaces("=eth1,ib0", names) == ["ib0"]
    assert nic.socket_ifname_interfaces("^docker,eth", names) == ["enp3s0", "ib0"]


def test_an_hccl_if_ip_foreign_to_this_host_is_a_clear_error() -> None:
    with pytest.raises(LaunchError, match=r"^HCCL_IF_IP=203.0.113.77 is not an address of any network interface"):
        distributed.configure_gloo_interface({"HCCL_IF_IP": "203.0.113.77"})


def restart_env(port: int, **extra: str) -> dict[str, str]:
    """A worker's environment in the second attempt of an elastic job."""
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "TORCHELASTIC_RESTART_COUNT": "1", **extra}


def test_under_torch_npu_run_a_restart_opens_no_store_of_its_own(held_port: int) -> None:
    # torch_npu's parallel store listens on the master port: a plain TCPStore there speaks
    # another protocol. Its workers see TORCH_NPU_USE_PARALLEL_TCPSTORE=True.
    info = RankInfo(0, 0, 2, 2, 0, "torch-npu-run")
    env = restart_env(held_port, TORCH_NPU_USE_PARALLEL_TCPSTORE="True")
    assert distributed.restarted_attempt_store(info, datetime.timedelta(seconds=5), env) is None


def test_under_torchrun_a_restart_gets_a_store_prefixed_by_its_attempt() -> None:
    port = free_port(count=1)  # below the ephemeral range, where no outgoing connection takes it meanwhile
    info = RankInfo(0, 0, 1, 1, 0, "torchrun")
    store = distributed.restarted_attempt_store(info, datetime.timedelta(seconds=30), restart_env(port))
    assert store is not None
    store.set("key", "value")
    assert store.get("key") == b"value"


def test_the_first_attempt_keeps_env_init() -> None:
    info = RankInfo(0, 0, 2, 2, 0, "torchrun")
    env = restart_env(1, TORCHELASTIC_RESTART_COUNT="0")
    assert distributed.restarted_attempt_store(info, datetime.timedelta(seconds=5), env) is None


@pytest.mark.parametrize(
    ("exec_timeout_s", "process_group_s"),
    [(1836, 1836 + 120), (17340, 17340 + 120), (68, 1800), (0, 7 * 24 * 3600), (2147483647, 2147483647 + 120)],
)
def test_the_process_group_waits_longer_than_hccl(exec_timeout_s: int, process_group_s: int) -> None:
    assert distributed.process_group_timeout_s(exec_timeout_s) == process_group_s
