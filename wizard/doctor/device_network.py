"""Doctor's device-network check (multi-node NPU jobs): each device's IP, link and TLS switch via hccn_tool.

Ranks on different nodes talk over the NPUs' own NICs, which seed 002 sets up
with `hccn_tool -i N -ip -s ...`. Doctor only reads: `-ip -g`, `-link -g` and
`-tls -g` for each device this node's ranks use. The output formats parsed here
are the documented ones (`ipaddr:`, `netmask:`, `link status: UP`, `tls switch[1]`);
they could not be checked against a real device here.
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
Runner = Callable[[Sequence[str], Mapping[str, str]], str]
HAND_CHECK = "hccn_tool -i N -ip -g, -link -g and -tls -g for each device N"


@dataclass(frozen=True)
class DeviceNet:
    """What hccn_tool says about one device: its address, link and TLS switch (None: not read)."""

    device: int
    address: str | None
    netmask: str | None
    link_up: bool | None
    tls: str | None


def run_hccn_tool(argv: Sequence[str], env: Mapping[str, str]) -> str:
    """hccn_tool's output (stdout and stderr) in environment `env`; a failed call returns what it printed."""
    done = subprocess.run(list(argv), env=dict(env), capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    return done.stdout + done.stderr


def used_devices(answers: Answers, env: Mapping[str, str]) -> list[int]:
    """The physical ids of the devices this node's ranks use (ASCEND_RT_VISIBLE_DEVICES renumbers from 0)."""
    count = answers["devices_per_node"]
    visible = env.get("ASCEND_RT_VISIBLE_DEVICES")
    if visible:
        try:
            return list(parse_visible_devices(visible)[:count])
        except ValueError:
            pass
    return list(range(count))


def read_device(tool: str, device: int, run: Runner, env: Mapping[str, str]) -> DeviceNet:
    """One device's address, link and TLS switch as hccn_tool reports them."""
    base = [tool, "-i", str(device)]
    ip_text = run([*base, "-ip", "-g"], env)
    link_text = run([*base, "-link", "-g"], env)
    tls_text = run([*base, "-tls", "-g"], env)
    address = re.search(r"ipaddr\s*:\s*(\S+)", ip_text)
    netmask = re.search(r"netmask\s*:\s*(\S+)", ip_text)
    link = re.search(r"link status\s*:\s*(\w+)", link_text, re.IGNORECASE)
    tls = re.search(r"tls switch\s*[\[:]\s*(\d)", tls_text, re.IGNORECASE)
    return DeviceNet(
        device,
        address.group(1) if address else None,
        netmask.group(1) if netmask else None,
        None if link is None else link.group(1).upper() == "UP",
        tls.group(1) if tls else None,
    )


def check_device_network(
    answers: Answers,
    env: Mapping[str, str],
    *,
    which: Callable[[str], str | None] | None = None,
    run: Runner = run_hccn_tool,
) -> Result:
    """Every device this node uses has an address, its link up, and one TLS switch for all."""
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
    problems = []
    for net in devices:
        if net.address is None:
            problems.append(f"device {net.device} has no address (hccn_tool -i {net.device} -ip -g)")
        if net.link_up is not True:
            state = "unknown" if net.link_up is None else "DOWN"
            problems.append(f"device {net.device} link {state} (hccn_tool -i {net.device} -link -g)")
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
            "; ".join(problems),
            "set each device's address with hccn_tool -i N -ip -s address A netmask M (the same subnet as "
            "device N on the other nodes), bring the links up, and use one TLS switch on every node",
        )
    return Result(
        NAME,
        PASS,
        f"addresses {summary}, links up, TLS switch {tls}: compare with the other nodes "
        "(device N's address in one subnet with device N elsewhere; the same TLS switch everywhere)",
    )
