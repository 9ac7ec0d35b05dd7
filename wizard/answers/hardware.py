"""Facts about Ascend hardware series and the torch / torch_npu / CANN pairing."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Series:
    """One Ascend training series and what it allows."""

    key: str
    title: str
    chip: str
    devices_per_node: tuple[int, ...]
    bf16: bool
    note: str


SERIES: dict[str, Series] = {
    "atlas-training": Series(
        key="atlas-training",
        title="Atlas training series (Atlas 800 training server)",
        chip="Ascend 910 (910A/ProA/ProB/PremiumA)",
        devices_per_node=(1, 2, 4, 8),
        bf16=False,
        note=(
            "8 cards per node in two groups (0-3, 4-7): a job uses 1, 2, 4 or 8 cards; "
            "no bf16; train with fp16 mixed precision"
        ),
    ),
    "atlas-a2": Series(
        key="atlas-a2",
        title="Atlas A2 training series (Atlas 800T A2)",
        chip="Ascend 910B1-B4",
        devices_per_node=tuple(range(1, 9)),
        bf16=True,
        note="1 to 8 cards per node; fp16 and bf16",
    ),
    "atlas-a3": Series(
        key="atlas-a3",
        title="Atlas A3 training series (Atlas 800T A3, Atlas 900 A3 SuperPoD)",
        chip="Ascend 910_93",
        devices_per_node=tuple(range(1, 17)),
        bf16=True,
        note="1 to 16 devices per node (two dies per NPU, one rank per die); fp16 and bf16",
    ),
}

BF16_REFUSAL = "the Atlas training series (Ascend 910) has no bf16 all_reduce and no bf16 autocast; use fp16"

# torch_npu release -> CANN release it was built for (ASCEND.md).
TORCH_NPU_CANN: dict[str, str] = {
    "2.12.0": "9.1.0",
    "2.11.0": "9.1.0",
    "2.10.0.post4": "9.1.0",
    "2.9.0.post6": "9.1.0",
    "2.7.1.post8": "9.1.0",
    "2.9.0.post2": "9.0.0",
    "2.8.0.post4": "9.0.0",
    "2.7.1.post4": "9.0.0",
    "2.9.0": "8.5.0",
    "2.8.0.post2": "8.5.0",
    "2.7.1.post2": "8.5.0",
    "2.6.0.post5": "8.5.0",
    "2.8.0": "8.3.RC1",
    "2.7.1": "8.3.RC1",
    "2.6.0.post3": "8.3.RC1",
    "2.1.0.post17": "8.3.RC1",
    "2.6.0": "8.2.RC1",
    "2.5.1.post1": "8.2.RC1",
    "2.1.0.post13": "8.2.RC1",
    "2.5.1": "8.1.RC1",
    "2.4.0.post4": "8.1.RC1",
    "2.3.1.post6": "8.1.RC1",
    "2.1.0.post12": "8.1.RC1",
    "2.4.0.post2": "8.0.0",
    "2.3.1.post4": "8.0.0",
    "2.1.0.post10": "8.0.0",
}

DEFAULT_TORCH_NPU = "2.9.0.post6"
DEFAULT_TORCH = "2.9.0"

# ASCII digits only: int() would take "２.９.０", and pip would refuse it in requirements.txt.
_VERSION = re.compile(r"^([0-9]{1,6})\.([0-9]{1,6})\.([0-9]{1,6})(?:\.post([0-9]{1,6}))?$")


def parse_version(text: str) -> tuple[int, int, int, int] | None:
    """Split 'X.Y.Z[.postN]' into numbers, or None when it is not such a version."""
    match = _VERSION.match(text)
    if match is None:
        return None
    major, minor, patch, post = match.groups()
    return int(major), int(minor), int(patch), int(post or 0)


def base_version(text: str) -> str:
    """The X.Y.Z part of a torch or torch_npu version."""
    parsed = parse_version(text)
    return text if parsed is None else "{}.{}.{}".format(*parsed[:3])


def has_torch_npu_run(torch_npu_version: str) -> bool:
    """Whether this torch_npu release ships the torch_npu_run launcher."""
    parsed = parse_version(torch_npu_version)
    if parsed is None:
        return False
    release, post = parsed[:3], parsed[3]
    if release == (2, 1, 0):
        return post >= 8
    if release == (2, 3, 1):
        return post >= 2
    return release >= (2, 4, 0)


def _from_release(torch_npu_version: str, firsts: dict[tuple[int, int, int], int], newer: tuple[int, int, int]) -> bool:
    """Whether a release is at least the first post of its line in `firsts`, or `newer` and later."""
    parsed = parse_version(torch_npu_version)
    if parsed is None:
        return False
    release, post = parsed[:3], parsed[3]
    if release in firsts:
        return post >= firsts[release]
    return release >= newer


def has_task_queue_2(torch_npu_version: str) -> bool:
    """Whether TASK_QUEUE_ENABLE=2 is validated: 2.1.0.post8 / 2.3.1.post2 / 2.4.0 on (the 6.0.0 branches)."""
    return _from_release(torch_npu_version, {(2, 1, 0): 8, (2, 3, 1): 2}, (2, 4, 0))


def has_cpu_affinity_conf(torch_npu_version: str) -> bool:
    """Whether torch_npu reads CPU_AFFINITY_CONF: 2.1.0.post10 / 2.3.1.post4 / 2.4.0.post2 on (CANN 8.0.0)."""
    return _from_release(torch_npu_version, {(2, 1, 0): 10, (2, 3, 1): 4, (2, 4, 0): 2}, (2, 5, 0))


def has_cpu_affinity_force(torch_npu_version: str) -> bool:
    """Whether torch_npu parses CPU_AFFINITY_CONF's force option ('1,force:1'): the 26.1.0 branches (CANN 9.1.0)."""
    newer = cann_at_least(torch_npu_version, 9, 1)
    if newer is not None:
        return newer
    return _from_release(torch_npu_version, {(2, 7, 1): 8, (2, 9, 0): 6, (2, 10, 0): 4}, (2, 11, 0))


def has_parallel_store_env(torch_npu_version: str) -> bool:
    """Whether torch_npu_run's workers get its parallel store through env://: the 7.1.0 branches on.

    2.1.0.post13 / 2.5.1.post1 / 2.6.0 and later (CANN 8.2.RC1); the 2.3.1 and 2.4.0 lines end before 7.1.0.
    """
    parsed = parse_version(torch_npu_version)
    if parsed is None or parsed[:3] in ((2, 3, 1), (2, 4, 0)):
        return False
    return _from_release(torch_npu_version, {(2, 1, 0): 13, (2, 5, 1): 1}, (2, 6, 0))


def has_hccl_flight_recorder(torch_npu_version: str) -> bool:
    """Whether ProcessGroupHCCL has its flight recorder (TORCH_HCCL_TRACE_BUFFER_SIZE and the dump calls).

    2.1.0.post12 (v2.1.0-7.0.0, a pickle dump only) / 2.1.0.post13 / 2.5.1.post1 / 2.6.0 and later (the
    7.1.0 branches on, also a JSON dump); the 2.3.1 and 2.4.0 lines never, nor 2.5.1 itself (Ascend/pytorch
    tags, torch_npu/csrc/distributed/ProcessGroupHCCL.hpp and Init.cpp).

    What the releases that have it do (same in every one; TraceUtils.h, ProcessGroupHCCL.cpp/.hpp,
    HCCLUtils.cpp, test/distributed/test_flight_recorder.py):
    - TORCH_HCCL_TRACE_BUFFER_SIZE (default 0: off) entries in a ring, read when the first process group is made;
    - torch_npu._C._distributed_c10d._dump_hccl_trace(includeCollectives, includeStackTraces, onlyActive): pickle;
      _dump_hccl_trace_json(includeCollectives, onlyActive): JSON, "version" "2.4" (the pickle of 2.1.0.post12
      says "2.1" and has no pg_status); keys version, pg_config, pg_status (JSON: values as strings), entries
      (left out when empty): record_id, pg_id, process_group, collective_seq_id, p2p_seq_id, op_id,
      profiling_name (empty for collectives: "profiling is not supported"), time_created_ns, input_sizes,
      input_dtypes, output_sizes, output_dtypes, state (scheduled / started / completed; "started" only
      with HCCL_DESYNC_DEBUG), time_discovered_*_ns, retired, timeout_ms, is_p2p;
    - the heartbeat monitor thread runs only with TORCH_HCCL_ENABLE_MONITORING=1; it then dumps (pickle, with
      stacks) to TORCH_HCCL_DEBUG_INFO_TEMP_FILE + global rank (default /tmp/hccl_trace_rank_), and each rank's
      Python stacks to that + "_py_traceback", when TORCH_HCCL_DUMP_ON_TIMEOUT=1 and a collective times out (on
      any rank: a flag in the store), when the watchdog saw no work for TORCH_HCCL_HEARTBEAT_TIMEOUT_SEC (600),
      or when a byte is written to the FIFO TORCH_HCCL_DEBUG_INFO_PIPE_FILE + rank + ".pipe" (made by the
      monitor with mkfifo, only with a buffer size > 0); its loop never breaks, so it does not abort the job.
    """
    return _from_release(torch_npu_version, {(2, 1, 0): 12, (2, 5, 1): 1}, (2, 6, 0))


def has_tiered_store_flag(torch_npu_version: str) -> bool:
    """Whether torch_npu_run has the tiered store flag: 2.1.0.post12 / 2.3.1.post6 / 2.4.0.post4 / 2.5.1 on."""
    return _from_release(torch_npu_version, {(2, 1, 0): 12, (2, 3, 1): 6, (2, 4, 0): 4}, (2, 5, 1))


def has_torchair_reduce_overhead(torch_npu_version: str) -> bool:
    """Whether TorchAir in torch_npu has the reduce-overhead (aclgraph) mode: the 7.0.0 branches on.

    2.1.0.post12 / 2.3.1.post6 / 2.4.0.post4 / 2.5.1 and later (CANN 8.1.RC1); the 6.0.0 branches'
    TorchAir has only its Ascend IR graph mode (Ascend/torchair `configs/compiler_config.py` per pin).
    """
    return _from_release(torch_npu_version, {(2, 1, 0): 12, (2, 3, 1): 6, (2, 4, 0): 4}, (2, 5, 1))


def has_profiler_async_parse(torch_npu_version: str) -> bool:
    """Whether torch_npu.profiler.tensorboard_trace_handler takes async_mode (parsing in a child process).

    The 7.0.0 branches on: 2.1.0.post12 / 2.3.1.post6 / 2.4.0.post4 / 2.5.1 (CANN 8.1.RC1); checked in
    Ascend/pytorch's torch_npu/profiler/profiler.py on v2.1.0-6.0.0 (without) and v2.1.0-7.0.0 (with).
    """
    return _from_release(torch_npu_version, {(2, 1, 0): 12, (2, 3, 1): 6, (2, 4, 0): 4}, (2, 5, 1))


def has_fully_shard(torch_npu_version: str) -> bool:
    """Whether torch_npu supports FSDP2's fully_shard: 2.6.0 and later (ASCEND.md, "Sharded training on NPU")."""
    parsed = parse_version(torch_npu_version)
    return parsed is not None and parsed[:3] >= (2, 6, 0)


def fully_shard_field_tested(torch_npu_version: str) -> bool:
    """Whether torch_npu is at least 2.7.1, the first release whose API docs list fully_shard (warn below)."""
    parsed = parse_version(torch_npu_version)
    return parsed is not None and parsed[:3] >= (2, 7, 1)


def cann_for(torch_npu_version: str) -> str | None:
    """The CANN release a known torch_npu release pairs with, if known."""
    return TORCH_NPU_CANN.get(torch_npu_version)


def cann_at_least(torch_npu_version: str, major: int, minor: int) -> bool | None:
    """Whether the CANN this torch_npu pairs with is major.minor or later; None when unknown."""
    cann = cann_for(torch_npu_version)
    if cann is None:
        return None
    found = tuple(int(part) for part in cann.split(".")[:2])
    return found >= (major, minor)


def hccl_port_count_for(torch_npu_version: str) -> int:
    """HCCL host ports for the CANN of this torch_npu: 32 from 8.2.RC1 (and when unknown), else 16."""
    return 16 if cann_at_least(torch_npu_version, 8, 2) is False else 32


def cann_set_env_for(torch_npu_version: str) -> str:
    """Where the CANN this torch_npu pairs with installs set_env.sh: cann/ from 8.5, ascend-toolkit/ before."""
    newer = cann_at_least(torch_npu_version, 8, 5)
    return f"/usr/local/Ascend/{'cann' if newer else 'ascend-toolkit'}/set_env.sh"


EXEC_TIMEOUT_MAX = 2147483647  # A2/A3: [0, 2147483647], 0 = never (CANN envref_07_0078)
TRAINING_EXEC_TIMEOUT_MAX = 17340  # Atlas training series: (0, 17340]
TRAINING_EXEC_TIMEOUT_STEP = 68


def effective_exec_timeout(series: str, seconds: int) -> int:
    """The HCCL_EXEC_TIMEOUT HCCL applies: on the Atlas training series floored to a multiple of 68, at least 68."""
    if series != "atlas-training":
        return seconds
    step = TRAINING_EXEC_TIMEOUT_STEP
    return max(step, seconds // step * step)
