"""What a failed rank's error means and what to do: ASCEND.md's failure table, as data.

`explain(text)` matches an exception message (or a log tail) against the
known HCCL error codes and messages, and against the messages a rank prints
when a *peer* died (gloo, c10d). A match on a peer message marks the error as
a consequence, so the monitor looks further for the rank that failed first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Hint:
    """One known failure: its code, what it means and the usual fix."""

    code: str
    pattern: re.Pattern[str]
    meaning: str
    fix: str
    caused_by_peer: bool = False

    def __str__(self) -> str:
        return f"{self.code}: {self.meaning}. {self.fix}"


def _hint(code: str, pattern: str, meaning: str, fix: str, *, caused_by_peer: bool = False) -> Hint:
    return Hint(code, re.compile(pattern, re.IGNORECASE), meaning, fix, caused_by_peer)


OUT_OF_MEMORY = "out of memory"
# torch_npu's caching allocator, CUDA's, torch's CPU allocator, and Python's own
OUT_OF_MEMORY_TEXTS = (
    r"NPU out of memory|CUDA out of memory|OutOfMemoryError|DefaultCPUAllocator: can't allocate memory"
    r"|^MemoryError\b|\bMemoryError:"
)

# Most specific first: the first matching row wins.
HINTS: tuple[Hint, ...] = (
    Hint(
        OUT_OF_MEMORY,
        re.compile(OUT_OF_MEMORY_TEXTS, re.MULTILINE),
        "the rank ran out of memory (its device's, or on the CPU the host's)",
        "Lower what a rank holds: fsdp2 shards parameters, gradients and optimizer state; activation "
        "checkpointing keeps a block's input only; a smaller batch with more grad_accum keeps the global batch.",
    ),
    _hint(
        "EI0006",
        r"EI0006|Getting socket times? out",
        "the parameter-plane link (the NPUs' own NICs, device port 16666) timed out while a collective set up "
        "its links",
        "A rank is slow, dead or unreachable over the device network, where ranks on different nodes meet: on "
        "each node check every device's link is up (hccn_tool -i N -link -g), its address is set and in one "
        "subnet with device N on the other nodes (-ip -g), and the TLS switch is the same everywhere (-tls -g); "
        "npu-wizard doctor reads these. Or raise HCCL_CONNECT_TIMEOUT.",
        caused_by_peer=True,
    ),
    _hint(
        "EI0015",
        r"EI0015",
        "setting up the communicator over the host network (the root-info exchange with the master) timed out",
        "A rank never started or cannot reach the root over the host NIC: check HCCL_IF_IP (or "
        "HCCL_SOCKET_IFNAME) on every node, the master's address and port, and the firewall between the hosts; "
        "or raise HCCL_CONNECT_TIMEOUT.",
        caused_by_peer=True,
    ),
    _hint(
        "EI0016",
        r"EI0016",
        "the TLS configuration differs between the communicator's cards",
        "Make the TLS switch the same on every device of every node: compare hccn_tool -i N -tls -g "
        "(npu-wizard doctor reads it).",
    ),
    _hint(
        "EI0002",
        r"EI0002|507048|wait execution of the Notify register times? out|Heartbeat Lost",
        "a collective waited past HCCL_EXEC_TIMEOUT",
        "Another rank died or stalled (look for it above), or the ranks got uneven batches "
        "(drop_last=True with a DistributedSampler).",
        caused_by_peer=True,
    ),
    _hint(
        "EADDRINUSE",
        r"errno:? ?98|Address already in use",
        "MASTER_PORT is already taken",
        "Leftover processes of an earlier run hold it (find them with `ss -ltnp`), or choose another master_port.",
    ),
    _hint(
        "EJ0001",
        r"EJ0001|Failed to initialize the HCCP process|last training process is running",
        "a previous job still holds the device",
        "Kill the previous training process and wait about 10 s before starting again.",
    ),
    _hint(
        "EI0019",
        r"(?:EI0019|EJ0003|listen on ip)[^\n]*port\W*16666|device port\W*16666",
        "device port 16666 (HCCL_NPU_SOCKET_PORT_RANGE moves it) is bound by two processes on one card",
        "Run one training process per device (check ASCEND_RT_VISIBLE_DEVICES and nproc_per_node) and stop "
        "leftover processes of an earlier run.",
    ),
    _hint(
        "EJ0003",
        r"EJ0003|EI0020",
        "an HCCL host port is taken (the older CANN code of EI0019)",
        "Stop leftover processes of an earlier run (ss -tlnp), reserve the HCCL port range "
        "(sysctl/reserve-ports.sh) or move HCCL_IF_BASE_PORT (HCCL_HOST_SOCKET_PORT_RANGE instead, where set).",
    ),
    _hint(
        "EI0019",
        r"EI0019|listen on ip.*port.*fail",
        "a listening port could not be bound: usually a host port of HCCL's range (HCCL_IF_BASE_PORT, or "
        "HCCL_HOST_SOCKET_PORT_RANGE where set) is taken",
        "Stop leftover processes of an earlier run (ss -tlnp), reserve the HCCL port range "
        "(sysctl/reserve-ports.sh) or move HCCL_IF_BASE_PORT (HCCL_HOST_SOCKET_PORT_RANGE instead, where set). "
        "If the port named is the device port (16666, or HCCL_NPU_SOCKET_PORT_RANGE's), two processes share "
        "one card: run one per device.",
    ),
    _hint(
        "Recv unmatched ack",
        r"Recv unmatched ack",
        "HCCL ports were handed to other processes",
        "Reserve the HCCL port range (sysctl/reserve-ports.sh).",
    ),
    _hint(
        "EI0004",
        r"EI0004|EJ0004",
        "the rank table is invalid or its IP differs from the NIC",
        "Fix RANK_TABLE_FILE so each device's IP is the NIC's address.",
    ),
    _hint(
        "EI0005",
        r"EI0005",
        "the ranks disagree on operator arguments or CANN versions",
        "Install the same CANN and torch_npu on every node.",
    ),
    _hint(
        "EE1002",
        r"EE1002|Stream synchronize timeout",
        "a device stream waited past its limit",
        "A rank stalled or died, or an operator hung: look for another rank's error first; then run again with "
        "ASCEND_GLOBAL_LOG_LEVEL=1 ASCEND_GLOBAL_EVENT_ENABLE=1 and read each rank's CANN log (plog).",
        caused_by_peer=True,
    ),
    _hint(
        "c10d client timeout",
        r"client socket has timed out after \d+ ?ms|timed out after 1800000 ?ms",
        "this rank waited 30 minutes for the master's store (PyTorch's default) and gave up",
        "The master is unreachable from this node, or the nodes were given different MASTER_ADDR or "
        "MASTER_PORT values: probe the master from every node before training (npu-wizard doctor --node N).",
    ),
    _hint(
        "peer lost",
        r"Connection (?:closed|reset) by peer|Broken pipe|ECONNRESET|Connection refused.*(?:store|peer)",
        "this rank lost its connection to another rank",
        "That rank failed or was killed first; its report is the root cause.",
        caused_by_peer=True,
    ),
    _hint(
        "collective timeout",
        r"Timed out waiting|Socket Timeout|timed out after|DistStoreError|Watchdog caught collective operation timeout",
        "a collective or the store waited for another rank past its timeout",
        "Another rank stalled, died or never started: look for a hung or missing rank.",
        caused_by_peer=True,
    ),
)


def explain(text: str) -> Hint | None:
    """The first known failure whose code or message appears in `text`, else None."""
    return next((hint for hint in HINTS if hint.pattern.search(text)), None)
