"""Doctor's device-network check (multi-node NPU jobs): each device's IP, link and TLS switch via hccn_tool.

Ranks on different nodes talk over the NPUs' own NICs, which seed 002 sets up
with `hccn_tool -i N -ip -s ...`. Doctor only reads: `-ip -g`, `-link -g`,
`-tls -g` and `-net_health -g` for each device this node's ranks use (`-i` takes
the logical id, the one ASCEND_RT_VISIBLE_DEVICES lists). A call that fails
(permissions, an unknown id, the driver down) says nothing about the network:
it is reported as unread, never as a missing address. The output formats parsed
here are the documented ones (`ipaddr:`, `netmask:`, `link status: UP`,
`tls switch[1]`, `net health status: Success`); they could not be checked
against a real device here.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from runtime.checks import FAIL, PASS, SKIP, WARN, Result
from runtime.preflight import parse_visible_devices
from wizard.answers.model import Answers

NAME = "device network"
TIMEOUT_S = 10
HAND_CHECK = "hccn_tool -i N -ip -g, -link -g, -tls -g and -net_health -g for each device N"
HEALTHY = "success"


@dataclass(frozen=True)
class Call:
    """One hccn_tool call: its exit code (None: it did not run or finish) and what it printed."""

    code: int | None
    output: str


Runner = Callable[[Sequence[str], Mapping[str, str]], Call]


@dataclass(frozen=True)
class DeviceNet:
    """What hccn_tool says about one device: address, link, TLS switch, net health (None: not read)."""

    device: int
    address: str | None
    netmask: str | None
    link_up: bool | None
    tls: str | None
    health: str | None = None
    unread: tuple[str, ...] = ()  # the calls that failed, each with why


def run_hccn_tool(argv: Sequence[str], env: Mapping[str, str]) -> Call:
    """hccn_tool's exit code and output (stdout and stderr) in environment `env`."""
    try:
        done = subprocess.run(
            list(argv), env=dict(env), capture_output=True, timeout=TIMEOUT_S, check=False, text=True, errors="replace"
        )  # errors="replace": a tool under another locale may print bytes that are not UTF-8
    except subprocess.TimeoutExpired:
        return Call(None, f"no answer within {TIMEOUT_S} s")
    except OSError as error:
        return Call(None, f"cannot run it: {error.strerror or error}")
    return Call(done.returncode, done.stdout + done.stderr)


def used_devices(answers: Answers, env: Mapping[str, str]) -> list[int]:
    """The logical ids of the devices this node's ranks use (hccn_tool -i takes these; ASCEND_RT_VISIBLE_DEVICES)."""
    count = answers["devices_per_node"]
    visible = env.get("ASCEND_RT_VISIBLE_DEVICES")
    if visible:
        try:
            return list(parse_visible_devices(visible)[:count])
        except ValueError:
            pass
    return list(range(count))


def read_device(tool: str, device: int, run: Runner, env: Mapping[str, str]) -> DeviceNet:
    """One device's address, link, TLS switch and net health as hccn_tool reports them; failed calls as unread."""
    texts: dict[str, str | None] = {}
    unread = []
    for what in ("-ip", "-link", "-tls", "-net_health"):
        call = run([tool, "-i", str(device), what, "-g"], env)
        if call.code == 0:
            texts[what] = call.output
            continue
        texts[what] = None
        said = " ".join(call.output.split())[:120] or "no output"
        why = said if call.code is None else f"exit code {call.code}: {said}"
        unread.append(f"hccn_tool -i {device} {what} -g failed ({why})")
    address = _field(r"ipaddr\s*:\s*(\S+)", texts["-ip"])
    link = _field(r"link status\s*:\s*(\w+)", texts["-link"])
    return DeviceNet(
        device,
        address,
        _field(r"netmask\s*:\s*(\S+)", texts["-ip"]),
        None if link is None else link.upper() == "UP",
        _field(r"tls switch\s*[\[:]\s*(\d)", texts["-tls"]),
        _field(r"net health status\s*:\s*(\S.*?)\s*$", texts["-net_health"]),
        tuple(unread),
    )


def _field(pattern: str, text: str | None) -> str | None:
    match = None if text is None else re.search(pattern, text, re.IGNORECASE | re.MULTILINE)
    return match.group(1) if match else None


def check_device_network(
    answers: Answers,
    env: Mapping[str, str],
    *,
    which: Callable[[str], str | None] | None = None,
    run: Runner = run_hccn_tool,
) -> Result:
    """Every device this node uses has an address, its link up, a healthy net, and one TLS switch for all."""
    if answers["device"] == "cpu":
        return Result(NAME, SKIP, "device cpu: no NPU network")
    if answers["nodes"] == 1:
        return Result(NAME, SKIP, "one node: its ranks talk inside the server")
    find = which or (lambda name: shutil.which(name, path=env.get("PATH")))
    tool = find("hccn_tool")
    if tool is None:
        return Result(
            NAME,
            WARN,
            "hccn_tool not found: cannot read the NPUs' own addresses, links and TLS switch, "
            "which ranks on different nodes talk over",
            f"put the driver's tools on PATH (often /usr/local/Ascend/driver/tools) and run doctor again, "
            f"or check by hand: {HAND_CHECK}",
        )
    devices = [read_device(tool, device, run, env) for device in used_devices(answers, env)]
    unread = [call for net in devices for call in net.unread]
    problems = []
    notes = []
    for net in devices:
        failed = " ".join(net.unread)
        if net.address is None and " -ip -g" not in failed:
            problems.append(f"device {net.device} has no address (hccn_tool -i {net.device} -ip -g)")
        if net.link_up is False or (net.link_up is None and " -link -g" not in failed):
            state = "unknown" if net.link_up is None else "DOWN"
            problems.append(f"device {net.device} link {state} (hccn_tool -i {net.device} -link -g)")
        if net.health is not None and net.health.lower() != HEALTHY:
            notes.append(f"device {net.device} net health {net.health} (hccn_tool -i {net.device} -net_health -g)")
    switches = sorted({net.tls for net in devices if net.tls is not None})
    if len(switches) > 1:
        per_device = ", ".join(f"{net.device}: {net.tls}" for net in devices)
        problems.append(f"TLS switch differs between devices ({per_device})")
    summary = ", ".join(f"{net.device}={net.address or '?'}/{net.netmask or '?'}" for net in devices)
    tls = switches[0] if len(switches) == 1 else "?"
    if problems:
        return Result(
            NAME,
            FAIL,
            "; ".join(problems + unread + notes),
            "set each device's address with hccn_tool -i N -ip -s address A netmask M (the same subnet as "
            "device N on the other nodes), bring the links up, and use one TLS switch on every node",
        )
    if unread:
        return Result(
            NAME,
            WARN,
            "could not read the device network: " + "; ".join(unread + notes),
            "a failing hccn_tool call says nothing of the network: run doctor as root (hccn_tool needs it), "
            "check the driver (npu-smi info) and that -i N names a logical id of this node's devices, "
            f"or check by hand: {HAND_CHECK}",
        )
    if notes:
        return Result(
            NAME,
            WARN,
            "; ".join(notes),
            "the device cannot reach its detect address (hccn_tool -i N -netdetect -g names it): check its "
            "cabling and switch port, and that the detect address is set on every node",
        )
    return Result(
        NAME,
        PASS,
        f"addresses {summary}, links up, TLS switch {tls}, net health Success: compare with the other nodes "
        "(device N's address in one subnet with device N elsewhere; the same TLS switch everywhere)",
    )
