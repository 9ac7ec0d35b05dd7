"""Fast checks of this node before any rank starts (standard library only).

A launch script runs `python -m runtime.preflight` first, so that a node with
a wrong HCCL_IF_IP, a taken port or an unreachable master fails in seconds,
with the reason, instead of hanging at process-group init. `npu-wizard doctor`
builds its network checks on the same probes. Every check reads only: it binds
a socket and closes it, or opens a TCP connection to the master and closes it.
Skip the launch-time checks with NPU_WIZARD_SKIP_PREFLIGHT=1.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from . import hccl_ports, nic
from .cann import check_cann
from .checks import FAIL, PASS, WARN, Result
from .probes import (  # noqa: F401  (doctor and runtime/ports.py import the probes from here)
    NONLOCAL_BIND,
    address_is_local,
    compress_numbers,
    connect_error,
    is_loopback,
    parse_port_list,
    parse_port_range,
    parse_visible_devices,
    port_error,
)
from .rank_table import check_rank_table
from .shadowing import check_shadowing

# a check failed; any other non-zero exit means the preflight itself could not run
EXIT_FAILED = 3
ENV_WAIT = "NPU_WIZARD_PREFLIGHT_WAIT"
DEFAULT_WAIT_S = 15.0


# ---- checks ---------------------------------------------------------------------


def check_hccl_if_ip(address: str, nonlocal_bind: Path = NONLOCAL_BIND) -> Result:
    """HCCL_IF_IP must be an address of this host (HCCL and gloo listen there)."""
    name = "HCCL_IF_IP"
    try:
        local = address_is_local(address, nonlocal_bind)
    except ValueError:
        return Result(
            name,
            FAIL,
            f"{address!r} is not an IP address",
            "set it to this node's host IP",
        )
    if local is None:
        return Result(
            name,
            WARN,
            f"{address}: cannot tell (ip_nonlocal_bind=1)",
            "check it with: ip -brief addr",
        )
    if not local:
        return Result(
            name,
            FAIL,
            f"{address} is not an address of this host ({socket.gethostname()})",
            "set this node's host IP in the answers (see: ip -brief addr) and render "
            "again, or use this node's own launch script",
        )
    return Result(name, PASS, f"{address} is on this host")


def check_socket_ifname(spec: str) -> Result:
    """HCCL_SOCKET_IFNAME must name an interface of this host with an address."""
    name = "HCCL_SOCKET_IFNAME"
    found = nic.socket_ifname_address(spec)
    if found is None:
        interfaces = ", ".join(nic.interface_names())
        return Result(
            name,
            FAIL,
            f"{spec!r} names no interface with an address on {socket.gethostname()} (interfaces: {interfaces})",
            "name this node's NIC in the answers' network.nic (see: ip -brief addr) and render again",
        )
    return Result(name, PASS, f"{spec!r} is {found[0]} ({found[1]}) on this host")


def check_port_free(name: str, host: str, port: int) -> Result:
    """A server port (the master's) must be free to listen on."""
    error = port_error(host, port)
    if error is None:
        return Result(name, PASS, f"{port} is free")
    return Result(
        name,
        FAIL,
        f"{port} is taken ({error.strerror or error})",
        f"stop what holds it (see: ss -ltnp 'sport = :{port}'), often an earlier run, "
        "or pick another port",
    )


def check_ports_free(name: str, host: str, first: int, count: int) -> Result:
    """HCCL's host ports on HCCL_IF_IP must be free (else EJ0003 / EI0020)."""
    last = first + count - 1
    ports = range(first, last + 1)
    taken = [port for port in ports if port_error(host, port) is not None]
    if not taken:
        return Result(name, PASS, f"{first}-{last} free on {host}")
    return Result(
        name,
        FAIL,
        f"{compress_numbers(taken)} taken on {host} (HCCL needs {first}-{last})",
        f"stop what holds them (see: ss -tanp 'sport = :{taken[0]}'), "
        "often an earlier run; "
        "reserve the range (sysctl/reserve-ports.sh) or move the HCCL base port",
    )


def check_master_local(address: str, nonlocal_bind: Path = NONLOCAL_BIND) -> Result:
    """On node 0 the master address must be this host's: rank 0 listens there."""
    name = "master address"
    try:
        resolved = socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)[0][4][0]
    except OSError as error:
        return Result(
            name,
            FAIL,
            f"{address} does not resolve ({error})",
            "use node 0's IP address",
        )
    local = address_is_local(resolved, nonlocal_bind)
    if local is False:
        return Result(
            name,
            FAIL,
            f"{address} is not an address of this host, but node 0 runs rank 0, "
            "which listens there",
            "make the master address node 0's host IP, "
            "or run node 0's script on the master host",
        )
    return Result(name, PASS, f"{address} is this host (node 0 listens there)")


def check_master_reachable(
    address: str,
    port: int,
    *,
    wait_s: float = 0.0,
    timeout_s: float = 1.0,
    starting: bool = False,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Result:
    """From nodes > 0: the master must answer; try for `wait_s` (node 0 may be late).

    `starting`: the job is starting now, so a master host that refuses the
    port has proved the route and passes at once; the launcher itself waits
    for node 0 (waiting here would start this node's launcher only after node
    0's, a few seconds later on every start).
    """
    name = "master reachable"
    deadline = clock() + wait_s
    while True:
        error = connect_error(address, port, timeout_s)
        if error is None:
            return Result(name, PASS, f"{address}:{port} accepts connections")
        if starting and isinstance(error, ConnectionRefusedError):
            return Result(
                name,
                PASS,
                f"{address} answers; nothing listens on {port} yet (node 0 is starting: the launcher waits for it)",
            )
        remaining = deadline - clock()
        if remaining <= 0:
            break
        sleep(min(0.5, remaining))
    waited = f" after {wait_s:.0f}s" if wait_s >= 1 else ""
    if isinstance(error, ConnectionRefusedError):
        return Result(
            name,
            WARN,
            f"{address} answers but nothing listens on {port}{waited}: "
            "node 0 may not have started yet",
            "fine before node 0 starts; if the job then hangs at start-up, "
            "check node 0 and its master port",
        )
    reason = str(error.strerror or error)
    if isinstance(error, TimeoutError):
        reason = "no answer (timed out)"
    return Result(
        name,
        FAIL,
        f"cannot reach {address}:{port}{waited}: {reason}",
        "check the master address, the route (ping), and firewalls between "
        "the nodes for this port",
    )


# ---- the launch-time preflight ------------------------------------------------------


def hccl_address(env: Mapping[str, str]) -> str | None:
    """The host address HCCL uses: HCCL_IF_IP, else the one HCCL_SOCKET_IFNAME names (HCCL's precedence)."""
    if env.get("HCCL_IF_IP"):
        return env["HCCL_IF_IP"]
    found = (
        nic.socket_ifname_address(env["HCCL_SOCKET_IFNAME"])
        if env.get("HCCL_SOCKET_IFNAME")
        else None
    )
    return found[1] if found else None


def as_job_clash(result: Result, env: Mapping[str, str], ports: str) -> Result:
    """A port taken under Slurm, whose ports come from the job id: name the job, the slot, the likely holder."""
    job, slot = env.get("NPU_WIZARD_JOB_ID"), env.get("NPU_WIZARD_HCCL_SLOT")
    if result.status != FAIL or not job or slot is None:
        return result
    host = socket.gethostname()
    if result.name == "master port":
        clash = f"job {job} takes master port {ports} from its job id; another job on {host} whose id gives the same port"
    else:
        clash = f"job {job} takes HCCL slot {slot} ({ports}) from its job id; another job on {host} in slot {slot}"
    return Result(
        result.name,
        FAIL,
        f"{result.detail}: {clash} probably holds it",
        f"see who holds it (ss -tlnp 'sport = :{ports.split('-')[0]}'; squeue -w {host}), then submit again: "
        "a new job id takes other ports (or keep jobs off a shared node: sbatch --exclusive); "
        "if no job holds it, reserve the ports (sysctl/reserve-ports.sh)",
    )


def launch_checks(args: argparse.Namespace, env: Mapping[str, str]) -> list[Result]:
    """The fast checks of this node for its launch script."""
    node = int(env.get("NODE_RANK", "0"))
    master_addr, master_port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
    if_ip, spec = env.get("HCCL_IF_IP", ""), env.get("HCCL_SOCKET_IFNAME", "")
    results = []
    if if_ip:
        results.append(check_hccl_if_ip(if_ip))
    elif spec:
        results.append(check_socket_ifname(spec))
    if node == 0:
        results.append(check_master_local(master_addr))
        every_address = "::" if ":" in master_addr else ""
        master_free = check_port_free("master port", every_address, master_port)
        results.append(as_job_clash(master_free, env, str(master_port)))
    elif not is_loopback(master_addr):
        # (simulated nodes start together on loopback: node 0 may not be up yet)
        wait = args.wait
        results.append(
            check_master_reachable(master_addr, master_port, wait_s=wait, starting=True)
        )
    results.append(check_cann(args.device, args.cann_set_env, env, args.cann_tried))
    address = hccl_address(env)
    if args.device == "npu" and address and results[0].status == PASS:
        results.append(
            check_hccl_ports_in_force(
                address, env, args.hccl_port_count, args.hccl_reads_port_range
            )
        )
    if args.device == "npu" and env.get("RANK_TABLE_FILE"):
        results.append(
            check_rank_table(env, spare=bool(env.get("NPU_WIZARD_SPARE_ADDR")))
        )
    # from the project folder, which the launch script puts first on PYTHONPATH
    if args.user_script:
        results.append(check_shadowing(Path.cwd(), args.user_script))
    return results


def check_hccl_ports_in_force(
    address: str, env: Mapping[str, str], count: int, reads_range: bool
) -> Result:
    """HCCL's host ports are free: HCCL_HOST_SOCKET_PORT_RANGE's where set (A2/A3), else HCCL_IF_BASE_PORT's."""
    name = "HCCL ports"
    try:
        ports = hccl_ports.host_ports(env, count, reads_range=reads_range)
    except ValueError as error:
        return Result(
            name, FAIL, str(error), f"fix it or unset it ({hccl_ports.SYNTAX})"
        )
    if ports.ranges is None:
        return Result(name, PASS, f"{ports.describe()}: none to check")
    if ports.variable == hccl_ports.BASE_PORT:
        (first, last), *_ = ports.ranges
        return as_job_clash(
            check_ports_free(name, address, first, count), env, f"{first}-{last}"
        )
    taken = [port for port in ports.ports if port_error(address, port) is not None]
    if not taken:
        return Result(
            name,
            PASS,
            f"{ports.describe()} free on {address}, overriding HCCL_IF_BASE_PORT",
        )
    return Result(
        name,
        FAIL,
        f"{compress_numbers(taken)} taken on {address} (HCCL needs {ports.describe()}, which overrides "
        "HCCL_IF_BASE_PORT)",
        f"stop what holds them (see: ss -tanp 'sport = :{taken[0]}'), often an earlier run; reserve them "
        f"(sysctl/reserve-ports.sh follows {hccl_ports.HOST_RANGE}) or change {hccl_ports.HOST_RANGE}",
    )


def report_lines(node: str, results: Sequence[Result]) -> list[str]:
    """The launch script's lines: one per check that did not pass, then the rest."""
    lines = []
    for r in results:
        if r.status in (WARN, FAIL):
            fix = f"; fix: {r.fix}" if r.fix else ""
            line = f"node {node}: preflight {r.status}: {r.name}: {r.detail}{fix}"
            lines.append(line)
    passed = [r.name for r in results if r.status == PASS]
    if passed:
        lines.append(f"node {node}: preflight ok: {', '.join(passed)}")
    return lines


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] = os.environ) -> int:
    """Run the launch-time checks; exit 0, or EXIT_FAILED when one failed."""
    summary = __doc__.splitlines()[0]
    parser = argparse.ArgumentParser(
        prog="python -m runtime.preflight",
        description=summary,
    )
    parser.add_argument("--device", default="npu", help="npu, auto or cpu")
    parser.add_argument(
        "--cann-set-env", default="", help="the set_env.sh found (and sourced), if any"
    )
    parser.add_argument(
        "--cann-tried",
        action="append",
        default=[],
        help="a place the launch script looked for set_env.sh",
    )
    parser.add_argument("--hccl-port-count", type=int, default=16)
    parser.add_argument(
        "--hccl-reads-port-range",
        action="store_true",
        help="A2/A3: HCCL_HOST_SOCKET_PORT_RANGE",
    )
    parser.add_argument(
        "--user-script", default="", help="the user's script its ranks run, if any"
    )
    wait = float(env.get(ENV_WAIT) or DEFAULT_WAIT_S)
    parser.add_argument("--wait", type=float, default=wait, help="master wait (s)")
    args = parser.parse_args(argv)
    try:
        results = launch_checks(args, env)
    except KeyboardInterrupt:
        # die of SIGINT, so that the launch script stops too instead of going on
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        raise
    for line in report_lines(env.get("NODE_RANK", "0"), results):
        print(line, flush=True)
    return EXIT_FAILED if any(r.status == FAIL for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
