"""Doctor's network checks: which node this is, HCCL's address or NIC, ports, the master, HCCL timeouts.

The probes (bind, connect, the address test) are runtime/preflight.py's, the
ones the launch scripts run; here they are judged against the answers, and
the kernel's port reservation and ephemeral range are read too.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from runtime import hccl_ports, nic, preflight, rank_table
from runtime.checks import FAIL, PASS, SKIP, WARN, Result
from runtime.preflight import compress_numbers
from wizard.answers import hardware
from wizard.answers.model import Answers
from wizard.errors import TargetError

RESERVED_PORTS = Path("/proc/sys/net/ipv4/ip_local_reserved_ports")
PORT_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LARGE_JOB_RANKS = 128  # beyond this, Huawei's guides raise HCCL_CONNECT_TIMEOUT
LARGE_JOB_CONNECT_S = 1200
RESERVE_FIX = "reserve them on every node: sudo bash sysctl/reserve-ports.sh --apply (merges into the current list)"


@dataclass(frozen=True)
class Node:
    """The node doctor checks: its index and host IP, and how that was decided."""

    index: int
    address: str
    how: str  # "--node", "simulated" (every node on loopback), "found" (its IP is here), "guessed"


@dataclass(frozen=True)
class PortFacts:
    """The kernel's ephemeral port range and reserved ports; None where unreadable."""

    ephemeral: tuple[int, int] | None
    reserved: tuple[tuple[int, int], ...] | None
    problems: tuple[str, ...] = ()

    def in_ephemeral(self, ports: range) -> list[int]:
        """The ports the kernel may hand out as ephemeral ones (in the range, not reserved)."""
        if self.ephemeral is None:
            return []
        first, last = self.ephemeral
        reserved = self.reserved or ()
        return [p for p in ports if first <= p <= last and not any(a <= p <= b for a, b in reserved)]


def which_node(answers: Answers, requested: int | None, nonlocal_bind: Path) -> Node:
    """This host's node: --node, else node 0 when simulated, else the node whose host IP is here."""
    if "network.host_ips" not in answers.values:  # a scheduler picks the nodes when the job starts
        raise TargetError(
            f"a {answers['cluster.engine']} project's nodes are chosen when the job starts, so doctor cannot tell "
            "which node this is: `npu-wizard run PROJECT --smoke` runs every node's preflight and a smoke test there"
        )
    ips = answers["network.host_ips"]
    if requested is not None:
        if not 0 <= requested < len(ips):
            raise TargetError(f"--node {requested}: this project has nodes 0 to {len(ips) - 1}")
        return Node(requested, ips[requested], "--node")
    if all(preflight.is_loopback(ip) for ip in ips):
        return Node(0, ips[0], "simulated")
    for index, ip in enumerate(ips):
        if preflight.address_is_local(ip, nonlocal_bind):
            return Node(index, ip, "found")
    return Node(0, ips[0], "guessed")


def read_port_facts(reserved_path: Path, range_path: Path) -> PortFacts:
    """Read ip_local_port_range and ip_local_reserved_ports; note what could not be read."""
    problems = []
    ephemeral = reserved = None
    try:
        ephemeral = preflight.parse_port_range(range_path.read_text())
    except (OSError, ValueError) as error:
        problems.append(f"cannot read the ephemeral range from {range_path}: {error}")
    try:
        reserved = tuple(preflight.parse_port_list(reserved_path.read_text()))
    except (OSError, ValueError) as error:
        problems.append(f"cannot read the reserved ports from {reserved_path}: {error}")
    return PortFacts(ephemeral, reserved, tuple(problems))


def check_if_ip(answers: Answers, node: Node, nonlocal_bind: Path) -> Result:
    """HCCL's host address is on this host: the NIC the answers name, else this node's host IP."""
    if answers["network.nic"]:
        result = preflight.check_socket_ifname(answers["network.nic"])
        return replace(result, detail=f"node {node.index}: {result.detail}")
    result = preflight.check_hccl_if_ip(node.address, nonlocal_bind)
    if result.status == FAIL and node.how == "guessed":
        ips = ", ".join(answers["network.host_ips"])
        return replace(
            result,
            detail=f"none of the project's host IPs ({ips}) is on this host ({socket.gethostname()})",
            fix="run doctor on a node of the project (or name it: --node N), or fix network.host_ips and render again",
        )
    return replace(result, detail=f"node {node.index}: {result.detail}")


def hccl_env(answers: Answers, env: Mapping[str, str] | None) -> dict[str, str]:
    """What HCCL reads for its host ports on this node: the answers' base port, this shell's port range."""
    found = {hccl_ports.BASE_PORT: str(answers["network.hccl_base_port"])}
    if env and hccl_ports.HOST_RANGE in env:
        found[hccl_ports.HOST_RANGE] = env[hccl_ports.HOST_RANGE]
    return found


def hccl_host_ports(answers: Answers, env: Mapping[str, str] | None) -> hccl_ports.PortsInForce:
    """HCCL's host ports on this node: HCCL_HOST_SOCKET_PORT_RANGE's where set (A2/A3), else the answers' base port."""
    reads_range = answers["hardware"] != "atlas-training"
    return hccl_ports.host_ports(hccl_env(answers, env), answers["network.hccl_port_count"], reads_range=reads_range)


def check_hccl_reserved(answers: Answers, facts: PortFacts, env: Mapping[str, str] | None = None) -> Result:
    """HCCL's host ports in force are outside the ephemeral range, or reserved."""
    name = "HCCL ports reserved"
    if answers["device"] == "cpu":
        return Result(name, SKIP, "device cpu: gloo uses no HCCL ports")
    try:
        in_force = hccl_host_ports(answers, env)
    except ValueError as error:
        return Result(name, FAIL, str(error), f"fix it or unset it ({hccl_ports.SYNTAX})")
    if in_force.ranges is None:
        return Result(name, PASS, f"HCCL's host ports are {in_force.describe()}: none to reserve")
    if facts.problems:
        return Result(name, WARN, "; ".join(facts.problems), "check /proc/sys/net/ipv4 by hand")
    exposed = facts.in_ephemeral(in_force.ports)
    first, last = facts.ephemeral or (0, 0)
    if exposed:
        return Result(
            name,
            FAIL,
            f"{compress_numbers(exposed)} lie in the ephemeral range {first}-{last} and are not reserved: the "
            "kernel may hand them out (EI0019 or, on older CANN, EJ0003; 'Recv unmatched ack'); HCCL's host "
            f"ports here: {in_force.describe()}",
            RESERVE_FIX,
        )
    inside = facts.ephemeral and any(first <= port <= last for port in in_force.ports)
    state = "reserved" if inside else "outside the ephemeral range"
    return Result(name, PASS, f"{in_force.text} {state} ({in_force.source})")


def check_hccl_free(answers: Answers, node: Node, if_ip: Result, env: Mapping[str, str] | None = None) -> Result:
    """HCCL's host ports in force are free on HCCL's address (this node's HCCL_IF_IP, or the named NIC's)."""
    if answers["device"] == "cpu":
        return Result("HCCL ports free", SKIP, "device cpu: gloo uses no HCCL ports")
    address = node.address
    if answers["network.nic"]:
        found = nic.socket_ifname_address(answers["network.nic"])
        address = found[1] if found else ""
    if if_ip.status != PASS or not address:
        return Result("HCCL ports free", SKIP, f"{address or answers['network.nic']} is not on this host")
    reads_range = answers["hardware"] != "atlas-training"
    count = answers["network.hccl_port_count"]
    result = preflight.check_hccl_ports_in_force(address, hccl_env(answers, env), count, reads_range)
    return replace(result, name="HCCL ports free")


def check_device_port(answers: Answers, env: Mapping[str, str]) -> Result:
    """Which device port HCCL listens on, on the NPUs' own NICs: 16666 or HCCL_NPU_SOCKET_PORT_RANGE's."""
    name = "HCCL device port"
    if answers["device"] == "cpu":
        return Result(name, SKIP, "device cpu: no NPU network")
    if answers["hardware"] == "atlas-training":
        return Result(name, PASS, f"{hccl_ports.DEFAULT_DEVICE_PORT} (this series has no HCCL_NPU_SOCKET_PORT_RANGE)")
    try:
        ports = hccl_ports.device_ports(env, reads_range=True)
    except ValueError as error:
        return Result(name, FAIL, str(error), f"fix it or unset it ({hccl_ports.SYNTAX})")
    if ports.variable == hccl_ports.DEFAULT:
        return Result(name, PASS, ports.describe())
    return Result(
        name,
        WARN,
        f"{ports.describe()}, not {hccl_ports.DEFAULT_DEVICE_PORT}: every node of the job must set the same",
        f"compare with the other nodes (echo ${hccl_ports.NPU_RANGE}), or unset it on every node",
    )


def check_master_port(answers: Answers, node: Node, facts: PortFacts) -> Result:
    """On node 0: the master port is free to listen on, and not an ephemeral port."""
    port = answers["network.master_port"]
    if node.index != 0:
        return Result("master port", SKIP, f"node 0 listens on {port}, not this one")
    every_address = "::" if ":" in answers["network.master_addr"] else ""
    result = preflight.check_port_free("master port", every_address, port)
    if result.status != PASS:
        return result
    if facts.in_ephemeral(range(port, port + 1)):
        first, last = facts.ephemeral or (0, 0)
        return Result(
            "master port",
            WARN,
            f"{port} is free but in the ephemeral range {first}-{last}, not reserved",
            RESERVE_FIX,
        )
    return Result("master port", PASS, f"{port} is free")


def check_master(answers: Answers, node: Node, timeout_s: float, nonlocal_bind: Path) -> Result:
    """Node 0 is the master host; other nodes reach the master's address and port."""
    address, port = answers["network.master_addr"], answers["network.master_port"]
    if node.index == 0:
        return preflight.check_master_local(address, nonlocal_bind)
    result = preflight.check_master_reachable(address, port, wait_s=0.0, timeout_s=timeout_s)
    if result.status == WARN:
        return replace(result, fix="start node 0 (or its job) and run doctor again to prove the path")
    return result


def check_timeouts(answers: Answers, script: Path | None) -> Result:
    """HCCL timeouts within range as HCCL applies them, and the launch script agrees with the answers."""
    name = "HCCL timeouts"
    if answers["device"] == "cpu":
        return Result(name, SKIP, "device cpu: HCCL unused")
    connect, execute = answers["network.connect_timeout"], answers["network.exec_timeout"]
    source = "the answers"
    if script is not None and script.is_file():
        text = script.read_text()
        found = {key: _exported_int(text, f"HCCL_{key}_TIMEOUT") for key in ("CONNECT", "EXEC")}
        if found["CONNECT"] is not None and found["EXEC"] is not None:
            if (found["CONNECT"], found["EXEC"]) != (connect, execute):
                return Result(
                    name,
                    WARN,
                    f"{script.name} sets connect {found['CONNECT']}s, exec {found['EXEC']}s; the answers say "
                    f"{connect}s, {execute}s (edited by hand?)",
                    "render the project again, or set network.connect_timeout/exec_timeout to match",
                )
            source = f"launch/{script.name}"
    if not 120 <= connect <= 7200:
        return Result(name, FAIL, f"connect {connect}s is outside 120-7200", "set network.connect_timeout")
    effective = hardware.effective_exec_timeout(answers["hardware"], execute)
    if effective != execute:
        return Result(
            name,
            WARN,
            f"exec {execute}s: the Atlas training series floors it to a multiple of 68, so HCCL waits {effective}s",
            f"set network.exec_timeout to {effective} (or the next multiple, {effective + 68}) to say what happens",
        )
    if execute != 0 and connect >= execute:
        return Result(
            name,
            WARN,
            f"connect {connect}s >= exec {execute}s: a collective may time out before a slow rank connects",
            "raise network.exec_timeout above the connect one",
        )
    if answers.world_size >= LARGE_JOB_RANKS and connect < LARGE_JOB_CONNECT_S:
        return Result(
            name,
            WARN,
            f"connect {connect}s for {answers.world_size} ranks: large jobs connect slowly",
            f"raise network.connect_timeout to {LARGE_JOB_CONNECT_S}+",
        )
    shown = "never (0)" if execute == 0 else f"{execute}s"
    return Result(name, PASS, f"connect {connect}s, exec {shown} ({source})")


def _exported_int(text: str, variable: str) -> int | None:
    match = re.search(rf"^export {variable}=\"?(\d+)\"?$", text, re.MULTILINE)
    return int(match.group(1)) if match else None


def check_rank_table(answers: Answers, env: Mapping[str, str]) -> Result:
    """RANK_TABLE_FILE in this node's environment: torch_npu's rank-table init, which no spare host is in."""
    if answers["device"] == "cpu":
        return Result(rank_table.NAME, SKIP, "device cpu: HCCL unused")
    result = rank_table.check_rank_table(env, spare=bool(answers.get("network.spare_hosts")))
    if result.status == FAIL:
        return replace(result, fix=f"{result.fix}, or drop network.spare_hosts")
    return result
