"""Who this rank is, whatever launched it, and the process group it joins.

Every launcher ends in the same `RankInfo`: the shell loop, torchrun and
torch_npu_run set the environment; torch.distributed.launch passes
`--local-rank`; under mp.spawn the worker's first argument is its local rank.
"""

from __future__ import annotations

import datetime
import os
import socket
import time
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

import torch.distributed as dist

from . import nic, stacks
from .errors import LaunchError

LAUNCHERS = ("shell", "mp-spawn", "torch-launch", "torchrun", "torch-npu-run")
TORCH_NPU_PARALLEL_STORE = "TORCH_NPU_USE_PARALLEL_TCPSTORE"
PYTORCH_DEFAULT_TIMEOUT_S = 1800  # what PyTorch gives non-NCCL process groups
NEVER_TIMEOUT_S = 7 * 24 * 3600  # HCCL_EXEC_TIMEOUT=0: HCCL never gives up; a week here
TIMEOUT_MARGIN_S = 120
GLOO_WORKER_GRACE_S = 0.2  # destroy_process_group: see there


@dataclass(frozen=True)
class RankInfo:
    """A rank's place in the job: global and local rank, sizes and node."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    launcher: str

    @property
    def is_main(self) -> bool:
        """True on global rank 0, the rank that saves and prints."""
        return self.rank == 0


def rank_info(
    launcher: str,
    *,
    local_rank: int | None = None,
    nnodes: int = 1,
    node_rank: int | None = None,
    nproc_per_node: int = 1,
    env: Mapping[str, str] = os.environ,
) -> RankInfo:
    """This rank's RankInfo from the launcher's environment and arguments."""
    if launcher not in LAUNCHERS:
        raise LaunchError(f"unknown launcher {launcher!r}: use {', '.join(LAUNCHERS)}")
    if node_rank is None:
        node_rank = _optional_int_env(env, "NODE_RANK", None)
    if node_rank is None:
        node_rank = _optional_int_env(env, "GROUP_RANK", 0) or 0
    if launcher == "mp-spawn":
        if local_rank is None:
            raise LaunchError("mp-spawn: the worker got no local rank from mp.spawn")
        _require(env, ("MASTER_ADDR", "MASTER_PORT"), launcher)
        return RankInfo(
            rank=node_rank * nproc_per_node + local_rank,
            local_rank=local_rank,
            world_size=nnodes * nproc_per_node,
            local_world_size=nproc_per_node,
            node_rank=node_rank,
            launcher=launcher,
        )
    _require(env, ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"), launcher)
    if launcher != "torch-launch" or local_rank is None:
        local_rank = _int_env(env, "LOCAL_RANK", launcher)
    local_world_size = _optional_int_env(env, "LOCAL_WORLD_SIZE", nproc_per_node)
    return RankInfo(
        rank=_int_env(env, "RANK", launcher),
        local_rank=local_rank,
        world_size=_int_env(env, "WORLD_SIZE", launcher),
        local_world_size=local_world_size,
        node_rank=node_rank,
        launcher=launcher,
    )


def env_int(name: str, default: int, env: Mapping[str, str] = os.environ) -> int:
    """An integer from the environment (a launch script's NNODES, ...), else `default`."""
    value = _optional_int_env(env, name, default)
    return default if value is None else value


def export_rank_env(info: RankInfo, env: MutableMapping[str, str] = os.environ) -> None:
    """Publish the rank in the environment, as torchrun would, for code that reads it."""
    env["RANK"] = str(info.rank)
    env["LOCAL_RANK"] = str(info.local_rank)
    env["WORLD_SIZE"] = str(info.world_size)
    env["LOCAL_WORLD_SIZE"] = str(info.local_world_size)
    env["NODE_RANK"] = str(info.node_rank)


def process_group_timeout_s(exec_timeout_s: int) -> int:
    """The process group's timeout for HCCL_EXEC_TIMEOUT=`exec_timeout_s`: always beyond it.

    A collective that waits too long should fail with HCCL's own message, which
    names the operator and the ranks, not with PyTorch's; and HCCL_EXEC_TIMEOUT=0
    (never) must not leave PyTorch's 30 minutes in force (Ascend/pytorch issue 54).
    """
    if exec_timeout_s <= 0:
        return NEVER_TIMEOUT_S
    return max(PYTORCH_DEFAULT_TIMEOUT_S, exec_timeout_s + TIMEOUT_MARGIN_S)


def init_process_group(info: RankInfo, backend: str, timeout_s: float) -> None:
    """Join the job's process group through env:// (the only method HCCL supports)."""
    if backend == "gloo":
        configure_gloo_interface()
    stacks.enable_recorder()  # read only when the process group is made
    export_rank_env(info)
    timeout = datetime.timedelta(seconds=timeout_s)
    store = restarted_attempt_store(info, timeout)
    if store is not None:
        dist.init_process_group(
            backend=backend,
            store=store,
            rank=info.rank,
            world_size=info.world_size,
            timeout=timeout,
        )
        return
    dist.init_process_group(
        backend=backend,
        init_method="env://",
        rank=info.rank,
        world_size=info.world_size,
        timeout=timeout,
    )


def restarted_attempt_store(
    info: RankInfo,
    timeout: datetime.timedelta,
    env: Mapping[str, str] = os.environ,
) -> dist.Store | None:
    """After an elastic restart, the job's store under a prefix of its own attempt.

    torchrun keeps one store across restarts; without a fresh prefix the
    restarted ranks read the dead attempt's addresses and fail to connect. The
    first attempt keeps plain env://, and so does torch_npu_run: its workers
    (TORCH_NPU_USE_PARALLEL_TCPSTORE=True) reach its parallel store through
    env:// with a prefix per attempt of its own, and a plain TCPStore on that
    port would speak the wrong protocol.
    """
    attempt = env_int("TORCHELASTIC_RESTART_COUNT", 0, env)
    if attempt == 0 or env.get(TORCH_NPU_PARALLEL_STORE) == "True":
        return None
    agent_hosts_store = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(
        host_name=env["MASTER_ADDR"],
        port=int(env["MASTER_PORT"]),
        world_size=info.world_size,
        is_master=info.rank == 0 and not agent_hosts_store,
        timeout=timeout,
    )
    return dist.PrefixStore(f"npu-wizard/attempt-{attempt}", store)


def destroy_process_group() -> None:
    """Leave the process group if this rank joined one.

    Gloo's worker threads may still be dropping the last collective's
    tensors when the rank moves on; that needs the GIL. Before torch 2.8
    (pytorch/pytorch#154976) the group is torn down with the GIL held, and
    such a worker hangs the rank for ever (seen on torch 2.1 in about one run
    of seven). From 2.8 the teardown lets the GIL go, but a group that DDP
    used is not torn down here at all: on torch 2.14 its worker threads still
    run after this returns (a DistributedDataParallel, even one already
    collected, keeps the group), so they may meet the interpreter's own
    teardown at exit, where a thread that asks for the GIL can abort the
    process: a rank that had finished died by SIGABRT a moment later, on a
    loaded machine, a few times in thousands of runs. A short pause without
    the GIL lets those workers finish first, on every release: it makes that
    rarer, not impossible (a loaded machine may hold a worker longer).
    """
    if not (dist.is_available() and dist.is_initialized()):
        return
    if dist.get_backend() == "gloo":
        time.sleep(GLOO_WORKER_GRACE_S)
    dist.destroy_process_group()


def configure_gloo_interface(env: MutableMapping[str, str] = os.environ) -> str | None:
    """Point gloo at HCCL's NIC (HCCL_IF_IP's, else the one HCCL_SOCKET_IFNAME names); return its name."""
    if env.get("GLOO_SOCKET_IFNAME"):
        return env["GLOO_SOCKET_IFNAME"]
    address, spec = env.get("HCCL_IF_IP"), env.get("HCCL_SOCKET_IFNAME")
    if address:  # HCCL_IF_IP wins over HCCL_SOCKET_IFNAME in HCCL too
        name = nic.interface_for_address(address)
        if name is None:
            raise LaunchError(
                f"HCCL_IF_IP={address} is not an address of any network interface on "
                f"{socket.gethostname()}: set it to this node's host IP (ip -brief addr)"
            )
    elif spec:
        found = nic.socket_ifname_address(spec)
        if found is None:
            raise LaunchError(
                f"HCCL_SOCKET_IFNAME={spec} names no interface with an address on {socket.gethostname()} "
                f"(interfaces: {', '.join(nic.interface_names())}): name this node's NIC (ip -brief addr)"
            )
        name = found[0]
    else:
        return None
    env["GLOO_SOCKET_IFNAME"] = name
    return name


def interface_for_address(address: str) -> str | None:
    """The name of the local network interface holding `address`, or None."""
    return nic.interface_for_address(address)


def _require(env: Mapping[str, str], names: tuple[str, ...], launcher: str) -> None:
    missing = [name for name in names if not env.get(name)]
    if missing:
        raise LaunchError(
            f"{launcher}: {', '.join(missing)} not set; start train.py through its "
            "launch script (launch/node<N>.sh) or set them as the launcher would"
        )


def _int_env(env: Mapping[str, str], name: str, launcher: str) -> int:
    value = _optional_int_env(env, name, None)
    if value is None:
        raise LaunchError(f"{launcher}: {name} not set; the launcher should set it")
    return value


def _optional_int_env(
    env: Mapping[str, str],
    name: str,
    default: int | None,
) -> int | None:
    value = env.get(name)
    if value in (None, ""):
        return default
    try:
        return int(value)
    except ValueError:
        raise LaunchError(f"{name}={value!r} is not an integer") from None
