"""Rules that tie several answers together (ASCEND.md), as plain functions.

Each rule reads the parsed values (dotted names) and yields problems. A rule
only runs when every field it reads parsed cleanly, so one bad value is
reported once, at its own field.
"""

from __future__ import annotations

import ipaddress
import re
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from wizard.answers import hardware, hostfile
from wizard.answers.addresses import is_ip, is_loopback
from wizard.answers.questions_cluster import HCCL_SLOTS, MASTER_PORT_SPAN
from wizard.answers.questions_k8s import mount_point_problem
from wizard.answers.rules_lm import LM_RULES
from wizard.answers.rules_sharding import SHARDING_RULES
from wizard.answers.script import is_foreign
from wizard.errors import Problem

Values = Mapping[str, Any]
EPHEMERAL = (32768, 60999)
CONFIGMAP_PATH = re.compile(r"[-._a-zA-Z0-9]+(/[-._a-zA-Z0-9]+)*")


def _error(field: str, value: object, message: str) -> Problem:
    return Problem(field, value, message)


def _warning(field: str, value: object, message: str) -> Problem:
    return Problem(field, value, message, severity="warning")


def devices_fit_series(v: Values) -> Iterator[Problem]:
    """Devices per node must be a count the series allows."""
    series = hardware.SERIES[v["hardware"]]
    if v["devices_per_node"] not in series.devices_per_node:
        allowed = ", ".join(map(str, series.devices_per_node))
        if series.key == "atlas-training":
            allowed += " (cards 0-3 and 4-7 are separate groups; a job must not span them)"
        yield _error("devices_per_node", v["devices_per_node"], f"{series.title} allows {allowed}")


def amp_fits_series(v: Values) -> Iterator[Problem]:
    """bf16 is refused where the series lacks it; AMP off is discouraged there."""
    series = hardware.SERIES[v["hardware"]]
    if v["amp"] == "bf16" and not series.bf16:
        yield _error("amp", "bf16", f"refused: {hardware.BF16_REFUSAL}")
    if v["amp"] == "off" and not series.bf16:
        yield _warning("amp", "off", "Huawei's migration guide trains this series with fp16 mixed precision")


def one_ip_per_node(v: Values) -> Iterator[Problem]:
    """One host IP per node, distinct unless every node is simulated on loopback."""
    ips, nodes = v["network.host_ips"], v["nodes"]
    # a hostfile's problems are reported at the hostfile
    field, value = (
        ("network.hostfile", v["network.hostfile"]) if v.get("network.hostfile") else ("network.host_ips", ips)
    )
    if len(ips) != nodes:
        yield _error(field, value, f"give one address per node: {nodes} expected, {len(ips)} given")
        return
    repeated = sorted(ip for ip, count in Counter(ips).items() if count > 1)
    if repeated and not all(is_loopback(ip) for ip in ips):
        shown = ", ".join(repeated[:5]) + (f" and {len(repeated) - 5} more" if len(repeated) > 5 else "")
        yield _error(field, value, f"each node needs its own address; repeated: {shown}")
    if nodes > 1 and v["device"] != "cpu" and all(is_loopback(ip) for ip in ips):
        yield _warning(
            "network.host_ips",
            ips,
            "loopback addresses only simulate nodes on one host; HCCL across servers needs their real IPs",
        )


def spares_apart(v: Values) -> Iterator[Problem]:
    """Spare hosts are distinct, none of them a node's address, and only where npu-wizard starts every node."""
    spares, ips = v["network.spare_hosts"], v["network.host_ips"]
    if not spares:
        return
    field = "network.hostfile" if v.get("network.hostfile") else "network.spare_hosts"
    value = v["network.hostfile"] if v.get("network.hostfile") else spares
    simulated = all(is_loopback(ip) for ip in (*ips, *spares))  # every node and spare on this host's loopback
    repeated = sorted(ip for ip, count in Counter(spares).items() if count > 1)
    if repeated and not simulated:
        yield _error(field, value, f"each spare host is listed once; repeated: {', '.join(repeated[:5])}")
    nodes = sorted(set(spares) & set(ips))
    if nodes and not simulated:
        yield _error(field, value, f"a spare host is not a node; also in network.host_ips: {', '.join(nodes[:5])}")
    if v["cluster.engine"] == "manual" and not simulated:
        yield _error(
            field,
            value,
            "the manual engine starts only the node of the host it runs on (run --node N), so it cannot start a "
            "spare in a failed node's place: use cluster.engine ssh, which starts every node, or loopback "
            "addresses to simulate the nodes and spares on this host",
        )


def master_is_a_node(v: Values) -> Iterator[Problem]:
    """The master address is one of the nodes (ideally node 0), or a name to resolve."""
    addr, ips = v["network.master_addr"], v["network.host_ips"]
    if not is_ip(addr):
        yield _warning(
            "network.master_addr",
            addr,
            "a host name: every node must resolve it to node 0's address; an IP is safer",
        )
        return
    canonical = str(ipaddress.ip_address(addr))
    if canonical not in ips:
        yield _error("network.master_addr", addr, f"must be one of the host IPs: {', '.join(ips)}")
    elif canonical != ips[0]:
        yield _warning("network.master_addr", addr, "rank 0 runs on node 0; the master is usually node 0's address")


def ports_apart(v: Values) -> Iterator[Problem]:
    """The master port lies outside the HCCL range and, ideally, the ephemeral range."""
    port, base, count = v["network.master_port"], v["network.hccl_base_port"], v["network.hccl_port_count"]
    last = base + count - 1
    if last > 65535:
        yield _error("network.hccl_base_port", base, f"the HCCL range {base}-{last} runs past port 65535")
    if port + 1 > 65535:
        yield _error(
            "network.master_port",
            port,
            f"npu-wizard run's status stream listens on the next port, {port + 1}, past 65535; "
            "choose a master port up to 65534",
        )
    elif base <= port + 1 <= last and not base <= port <= last:
        yield _warning(
            "network.master_port",
            port,
            f"npu-wizard run's status stream uses the next port, {port + 1}, inside the HCCL range "
            f"{base}-{last}; choose another master port or pass --status-port",
        )
    if base <= port <= last:
        yield _error("network.master_port", port, f"inside the HCCL port range {base}-{last}; choose a port outside it")
    elif EPHEMERAL[0] <= port <= EPHEMERAL[1]:
        yield _warning(
            "network.master_port",
            port,
            f"inside the usual ephemeral range {EPHEMERAL[0]}-{EPHEMERAL[1]}: "
            "the kernel may hand it to another program",
        )


def timeouts_fit_series(v: Values) -> Iterator[Problem]:
    """HCCL_EXEC_TIMEOUT within the series' range (CANN envref_07_0078); connect >= exec only warns."""
    connect, execute = v["network.connect_timeout"], v["network.exec_timeout"]
    if v["hardware"] == "atlas-training":
        top, step = hardware.TRAINING_EXEC_TIMEOUT_MAX, hardware.TRAINING_EXEC_TIMEOUT_STEP
        if not 0 < execute <= top:
            yield _error(
                "network.exec_timeout",
                execute,
                f"the Atlas training series accepts (0, {top}] seconds (no 0 = never there), e.g. 1836",
            )
            return
        effective = hardware.effective_exec_timeout(v["hardware"], execute)
        if effective != execute:
            yield _warning(
                "network.exec_timeout",
                execute,
                f"the Atlas training series floors it to a multiple of {step} (at least {step}): "
                f"HCCL will wait {effective}s",
            )
    elif execute > hardware.EXEC_TIMEOUT_MAX:
        yield _error("network.exec_timeout", execute, f"at most {hardware.EXEC_TIMEOUT_MAX} (0 means never)")
        return
    if execute != 0 and connect >= execute:
        yield _warning(
            "network.connect_timeout",
            connect,
            f"not below network.exec_timeout ({execute}): a collective may then time out "
            "before a slow rank has even connected",
        )


def signal_before_time_limit(v: Values) -> Iterator[Problem]:
    """Slurm's warning before the time limit must come after the job starts."""
    if v["cluster.engine"] != "slurm" or not v.get("cluster.signal_before"):
        return
    parts = [int(part) for part in re.split(r"[-:]", v["cluster.time"])]
    days = parts[0] if "-" in v["cluster.time"] else 0
    hours, minutes, seconds = parts[-3:]
    limit = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    if v["cluster.signal_before"] >= limit:
        yield _error(
            "cluster.signal_before",
            v["cluster.signal_before"],
            f"not below the time limit cluster.time ({v['cluster.time']}, {limit} s): the warning would come "
            "before the job starts; give fewer seconds, or a longer time limit",
        )


def launcher_available(v: Values) -> Iterator[Problem]:
    """torch-npu-run needs a torch_npu release that ships it."""
    version = v["environment.torch_npu_version"]
    if v["launcher"] == "torch-npu-run" and not hardware.has_torch_npu_run(version):
        yield _error(
            "launcher",
            "torch-npu-run",
            f"torch_npu {version} has no torch_npu_run; it needs 2.1.0.post8+, 2.3.1.post2+ or 2.4.0+ "
            "(CANN 8.0.RC3); pick torchrun or a newer torch_npu",
        )
    if v["launcher"] == "torch-launch":
        yield _warning(
            "launcher", "torch-launch", "torch.distributed.launch is deprecated upstream; torchrun replaces it"
        )


def script_launcher(v: Values) -> Iterator[Problem]:
    """mp-spawn cannot start the user's own script: only the generated train.py spawns its own ranks."""
    if v["launcher"] == "mp-spawn" and is_foreign(v["training.script"]):
        yield _error(
            "launcher",
            "mp-spawn",
            f"mp-spawn needs the script to start its own ranks with torch.multiprocessing, which the generated "
            f"train.py does and {v['training.script']} cannot be made to; pick torchrun (or torch-npu-run on NPU)",
        )


def tensorboard_script(v: Values) -> Iterator[Problem]:
    """TensorBoard logging is the generated train.py's: npu-wizard cannot add it to the user's own script."""
    if v["training.tensorboard"] and is_foreign(v["training.script"]):
        yield _error(
            "training.tensorboard",
            True,
            f"TensorBoard logging is a feature of the generated train.py; {v['training.script']} can write its "
            "own with torch.utils.tensorboard.SummaryWriter: set training.tensorboard to false",
        )


def compile_fits_release(v: Values) -> Iterator[Problem]:
    """On an NPU the compiled step is TorchAir's: Atlas A2/A3 only, reduce-overhead from the 7.0.0 branches."""
    mode = v.get("training.compile", "off")
    if mode == "off" or v["device"] == "cpu":
        return
    npu = v["environment.torch_npu_version"]
    if v["hardware"] == "atlas-training":
        yield _error(
            "training.compile",
            mode,
            "torch_npu's graph backend (TorchAir) supports the Atlas A2 and A3 series, not the Atlas training "
            "series (Ascend 910): set training.compile to off",
        )
    elif mode == "reduce-overhead" and not hardware.has_torchair_reduce_overhead(npu):
        yield _error(
            "training.compile",
            mode,
            f"on an NPU, reduce-overhead is TorchAir's aclgraph mode, which torch_npu {npu} lacks (it came with "
            "2.1.0.post12, 2.3.1.post6, 2.4.0.post4 and 2.5.1, CANN 8.1.RC1): choose default, or a newer "
            "environment.torch_npu_version",
        )


def versions_pair(v: Values) -> Iterator[Problem]:
    """torch_npu X.Y.Z[.postN] needs torch X.Y.Z."""
    npu, torch = v["environment.torch_npu_version"], v["environment.torch_version"]
    if hardware.base_version(npu) != hardware.base_version(torch):
        yield _error(
            "environment.torch_version",
            torch,
            f"torch_npu {npu} needs torch {hardware.base_version(npu)}",
        )
    elif hardware.cann_for(npu) is None:
        yield _warning(
            "environment.torch_npu_version",
            npu,
            "not a release npu-wizard knows the CANN pairing of; check Ascend's version table",
        )


def one_ssh_host_per_node(v: Values) -> Iterator[Problem]:
    """ssh hosts, when given, name each node once."""
    hosts, nodes = v.get("cluster.ssh_hosts"), v["nodes"]
    if hosts is not None and len(hosts) != nodes:
        yield _error("cluster.ssh_hosts", hosts, f"give one host per node: {nodes} expected, {len(hosts)} given")


def scheduled_ports_apart(v: Values) -> Iterator[Problem]:
    """Under Slurm the master ports and HCCL slots that job ids pick stay apart and below 65536."""
    if v["cluster.engine"] != "slurm":
        return
    port, base, count = v["network.master_port"], v["network.hccl_base_port"], v["network.hccl_port_count"]
    last_master, last_hccl = port + MASTER_PORT_SPAN - 1, base + HCCL_SLOTS * count - 1
    if last_master > 65535:
        yield _error("network.master_port", port, f"under Slurm the master ports {port}-{last_master} run past 65535")
    if last_hccl > 65535:
        yield _error(
            "network.hccl_base_port",
            base,
            f"under Slurm the {HCCL_SLOTS} HCCL port slots {base}-{last_hccl} run past 65535; lower the base port",
        )
    elif port <= last_hccl and base <= last_master:
        yield _error(
            "network.master_port",
            port,
            f"under Slurm the master ports {port}-{last_master} overlap the HCCL slots {base}-{last_hccl}",
        )


def hostfile_fits(v: Values) -> Iterator[Problem]:
    """A hostfile's slots, where given, equal the devices per node."""
    path, devices = v["network.hostfile"], v["devices_per_node"]
    if not path:
        return
    wrong = [host for host in hostfile.read(path) if host.slots is not None and host.slots != devices]
    if wrong:
        lines = ", ".join(f"line {host.line} slots={host.slots}" for host in wrong[:5])
        more = f" and {len(wrong) - 5} more" if len(wrong) > 5 else ""
        yield _error("network.hostfile", path, f"{lines}{more}: every node runs devices_per_node = {devices} ranks")


def kubernetes_settings(v: Values) -> Iterator[Problem]:
    """A Kubernetes job needs its image; its data comes from one place at most."""
    if v["cluster.engine"] not in ("ascendjob", "pytorchjob"):
        return
    if "cluster.image" in v and v["cluster.image"] is None:
        yield _error(
            "cluster.image",
            None,
            "a value is required: the training image with CANN, torch and torch_npu that every pod runs",
        )
    if v["cluster.engine"] == "ascendjob" and v.get("device") == "cpu":
        yield _warning(
            "device",
            "cpu",
            "the ascend-operator counts WORLD_SIZE in the NPUs a pod asks for, and a CPU job asks for none: "
            "on a cluster use pytorchjob for a CPU trial",
        )
    script = v.get("training.script")
    if script is not None and not CONFIGMAP_PATH.fullmatch(script):
        yield _error(
            "training.script",
            script,
            "the pods get the project's files from a ConfigMap, whose keys allow only letters, digits, "
            "'.', '_' and '-': rename the script (and its folders) to those",
        )
    if v.get("cluster.data_host_path") and v.get("cluster.data_pvc"):
        yield _error(
            "cluster.data_pvc",
            v["cluster.data_pvc"],
            "the data comes from a hostPath or a volume claim, not both: leave one of them empty",
        )
    yield from data_volume_mount_point(v)


def operator_retries(v: Values) -> Iterator[Problem]:
    """An AscendJob's restarts become MindCluster's fault-retry-times, which its label table bounds at 100."""
    if v["cluster.engine"] == "ascendjob" and v["run.restarts"] > 100:
        yield _warning(
            "run.restarts",
            v["run.restarts"],
            "an AscendJob carries it as MindCluster's fault-retry-times label, documented for 0 to 100",
        )


def data_volume_mount_point(v: Values) -> Iterator[Problem]:
    """The data volume is mounted at the data folder: never over the root, a system folder or the project."""
    if not (v.get("cluster.data_host_path") or v.get("cluster.data_pvc")) or "project_name" not in v:
        return
    why = mount_point_problem(v["project_name"], v.get("training.data_dir"))
    if why is None:
        return
    field = "training.data_dir" if "training.data_dir" in v else "cluster.data_host_path"
    yield _error(
        field,
        v.get(field),
        f"the data volume is mounted at the data folder, here {why}; give a folder inside the project, such as data",
    )


RULES: tuple[tuple[tuple[str, ...], Callable[[Values], Iterator[Problem]]], ...] = (
    (("hardware", "devices_per_node"), devices_fit_series),
    (("hardware", "amp"), amp_fits_series),
    (("nodes", "device", "network.host_ips"), one_ip_per_node),
    (("network.hostfile", "devices_per_node"), hostfile_fits),
    (("cluster.engine", "network.host_ips", "network.spare_hosts"), spares_apart),
    (("network.master_addr", "network.host_ips"), master_is_a_node),
    (("network.master_port", "network.hccl_base_port", "network.hccl_port_count"), ports_apart),
    (("hardware", "network.connect_timeout", "network.exec_timeout"), timeouts_fit_series),
    (("launcher", "environment.torch_npu_version"), launcher_available),
    (("cluster.engine", "cluster.time", "cluster.signal_before"), signal_before_time_limit),
    (("launcher", "training.script"), script_launcher),
    (("training.tensorboard", "training.script"), tensorboard_script),
    (("environment.torch_npu_version", "environment.torch_version"), versions_pair),
    (("training.compile", "device", "hardware", "environment.torch_npu_version"), compile_fits_release),
    (("nodes", "cluster.engine"), one_ssh_host_per_node),
    (
        ("cluster.engine", "network.master_port", "network.hccl_base_port", "network.hccl_port_count"),
        scheduled_ports_apart,
    ),
    (("cluster.engine",), kubernetes_settings),
    (("cluster.engine", "run.restarts"), operator_retries),
    *LM_RULES,
    *SHARDING_RULES,
)


def check(values: Values) -> list[Problem]:
    """Every cross-field problem among cleanly parsed values."""
    problems: list[Problem] = []
    for fields, rule in RULES:
        if all(name in values for name in fields):
            problems.extend(rule(values))
    return problems
