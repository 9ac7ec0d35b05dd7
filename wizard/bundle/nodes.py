"""The other nodes' NPU tools and plogs, through the engine that ran them: ssh, srun into a Slurm job, kubectl exec.

Each node gets one bounded bash script (`node_script`): `npu-smi info`, `hccn_tool -i N -link -g / -ip -g` of the
devices its ranks used, and the newest plog files of its ranks' pids, each cut to its last MEMBER_LIMIT bytes and
fenced by a marker no tool can guess. What a node gave goes under nodes/node-K/; what it could not give, and why,
goes into the manifest.
"""

from __future__ import annotations

import json
import re
import secrets
import shlex
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from wizard.bundle.redact import Redactor
from wizard.monitor.attach import RUN_FILE
from wizard.monitor.run_files import RunFileError, read_json_object
from wizard.run.engines.ssh import ssh_command
from wizard.run.engines.ssh_run import run_all


class Bundle(Protocol):
    """What the bundle being collected takes: a member, or a line on what is missing and why."""

    def add(self, name: str, data: bytes, cut: int | None = None, *, note: str = "", header: bool = True) -> None:
        """Add a member."""

    def lack(self, name: str, why: str) -> None:
        """Name what is missing, and why."""


MEMBER_LIMIT = 2 * 1024 * 1024  # bytes of one file the bundle keeps: the tail of a bigger one
COMMAND_S = 20  # seconds one tool may take on a node
REACH_S = 30.0  # seconds to reach a node, on top of its tools' time
PLOGS_PER_PID = 2
# where the driver installs its tools, for a non-login shell whose PATH lacks them
TOOL_FOLDERS = "/usr/local/sbin:/usr/local/bin:/usr/local/Ascend/driver/tools"
KUBERNETES_ENGINES = ("ascendjob", "pytorchjob")


def node_script(devices: Sequence[int], pids: Sequence[int], plog_root: str | None, marker: str) -> str:
    """The bash script one node runs: each tool's and plog's output between `marker` lines, in order."""
    root = shlex.quote(plog_root) if plog_root else '"$HOME/ascend/log"'
    lines = [
        f'PATH="$PATH:{TOOL_FOLDERS}"; export PATH',
        f"m={marker}",
        "run() {",
        '    local name="$1"; shift',
        '    if ! command -v "$1" >/dev/null 2>&1; then printf "%s missing %s\\n" "$m" "$1"; return; fi',
        '    printf "%s begin %s\\n" "$m" "$name"',
        f'    timeout {COMMAND_S} "$@" </dev/null 2>&1 | tail -c {MEMBER_LIMIT}',
        '    printf "\\n%s end %s %s\\n" "$m" "$name" "${PIPESTATUS[0]}"',
        "}",
        "plogs() {",
        '    local root="$1" pid file; shift',
        '    for pid in "$@"; do',
        '        ls -t "$root"/debug/plog/plog-"$pid"_*.log "$root"/run/plog/plog-"$pid"_*.log \\',
        f'            "$root"/plog/plog-"$pid"_*.log 2>/dev/null | head -n {PLOGS_PER_PID} |',
        "            while IFS= read -r file; do",
        '                printf "%s begin plog/%s-%s\\n" "$m" "$(basename "$(dirname "$(dirname "$file")")")" \\',
        '                    "$(basename "$file")"',
        f'                tail -c {MEMBER_LIMIT} "$file"',
        '                printf "\\n%s end plog 0\\n" "$m"',
        "            done",
        "    done",
        '    printf "%s plogs-from %s\\n" "$m" "$root"',
        "}",
        "run npu-smi-info.txt npu-smi info",
    ]
    for device in devices:
        for what in ("link", "ip"):
            lines.append(f"run hccn_tool-{device}-{what}.txt hccn_tool -i {int(device)} -{what} -g")
    lines.append(f"plogs {root} {' '.join(str(int(pid)) for pid in pids)}")
    return "\n".join(lines) + "\n"


def read_sections(output: str, marker: str) -> tuple[dict[str, tuple[str, str]], list[str], str]:
    """The script's output as {name: (text, exit code)}, the tools it found missing, and the plog folder it read."""
    sections: dict[str, tuple[str, str]] = {}
    missing: list[str] = []
    plog_root = ""
    name: str | None = None
    body: list[str] = []
    for line in output.splitlines(keepends=True):
        if not line.startswith(f"{marker} "):
            if name is not None:
                body.append(line)
            continue
        kind, _, rest = line[len(marker) + 1 :].rstrip("\n").partition(" ")
        if kind == "begin":
            name, body = rest, []
        elif kind == "end" and name is not None:
            text = "".join(body)
            sections[name] = (text[:-1] if text.endswith("\n") else text, rest.rpartition(" ")[2])
            name = None
        elif kind == "missing":
            missing.append(rest)
        elif kind == "plogs-from":
            plog_root = rest
    return sections, missing, plog_root


class NodeReach:
    """How the bundle reaches node K of a run: a command that runs a bash script there, or why it cannot."""

    def __init__(self, engine: str, via: str) -> None:
        self.engine, self.via = engine, via
        self.commands: dict[int, list[str]] = {}  # node -> the command that runs a script there
        self.targets: dict[int, str] = {}  # node -> its host, Slurm node or pod, in words
        self.why_not: dict[int, str] = {}  # node -> why it cannot be reached


def ssh_reach(hosts: Sequence[str], nodes: Sequence[int]) -> NodeReach:
    """Each node's host over the engine's own ssh (NPU_WIZARD_SSH_COMMAND, else ssh in batch mode)."""
    reach = NodeReach("ssh", "over ssh to {target}")
    for node in nodes:
        if node < len(hosts):
            reach.commands[node], reach.targets[node] = [*ssh_command(), hosts[node]], hosts[node]
        else:
            reach.why_not[node] = f"the answers name no ssh host for node {node}"
    return reach


def slurm_reach(job_id: str, nodes: Sequence[int], env: dict[str, str]) -> NodeReach:
    """srun into the job's allocation, one node each, while Slurm still holds it."""
    ok, shown = _run(["scontrol", "show", "job", "-o", job_id], env)
    if not ok:
        return _nowhere("slurm", nodes, f"scontrol show job {job_id} {shown}")
    state = re.search(r"\bJobState=(\S+)", shown)
    listed = re.search(r"\bNodeList=(\S+)", shown)
    if state is None or state.group(1) != "RUNNING" or listed is None:
        said = state.group(1) if state else "not known to Slurm"
        return _nowhere(
            "slurm", nodes, f"job {job_id} is {said}: its allocation is gone, so srun cannot reach its nodes"
        )
    ok, names = _run(["scontrol", "show", "hostnames", listed.group(1)], env)
    hostnames = names.split() if ok else []
    reach = NodeReach("slurm", f"through srun into job {job_id} on {{target}}")
    for node in nodes:
        if node < len(hostnames):
            srun = [
                "srun",
                f"--jobid={job_id}",
                "--overlap",
                "--nodes=1",
                "--ntasks=1",
                f"--nodelist={hostnames[node]}",
            ]
            reach.commands[node], reach.targets[node] = [*srun, "bash", "-c"], hostnames[node]
        else:
            reach.why_not[node] = f"job {job_id}'s node list ({listed.group(1)}) has no node {node}"
    return reach


def kubernetes_reach(engine: str, job_id: str, nodes: Sequence[int], env: dict[str, str]) -> NodeReach:
    """kubectl exec into each node's pod, where the pod is still there and running."""
    from wizard.render.k8s import JOB_LABEL
    from wizard.run.engines.k8s_pods import node_of

    namespace, _, name = job_id.rpartition("/")
    scope = ["-n", namespace] if namespace else []
    ok, listed = _run(["kubectl", "get", "pods", *scope, "-l", f"{JOB_LABEL}={name}", "-o", "json"], env)
    if not ok:
        return _nowhere(engine, nodes, f"kubectl get pods of job {job_id} {listed}")
    try:
        pods = {node_of(pod): pod for pod in json.loads(listed).get("items", [])}
    except (ValueError, AttributeError):
        return _nowhere(engine, nodes, f"kubectl get pods of job {job_id} gave no JSON")
    reach = NodeReach(engine, "through kubectl exec into pod {target}")
    for node in nodes:
        pod = pods.get(node)
        phase = (pod or {}).get("status", {}).get("phase")
        if pod is None:
            reach.why_not[node] = f"job {job_id} has no pod for node {node} any more (the job was deleted or ended)"
        elif phase != "Running":
            reach.why_not[node] = f"its pod {pod['metadata']['name']} is {phase}: kubectl exec needs a running pod"
        else:
            reach.commands[node] = ["kubectl", "exec", *scope, pod["metadata"]["name"], "--", "bash", "-c"]
            reach.targets[node] = pod["metadata"]["name"]
    return reach


def _nowhere(engine: str, nodes: Sequence[int], why: str) -> NodeReach:
    reach = NodeReach(engine, "")
    reach.why_not = dict.fromkeys(nodes, why)
    return reach


def _run(argv: list[str], env: dict[str, str]) -> tuple[bool, str]:
    """(True, a short query's output), or (False, why it gave none)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=REACH_S, env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return False, f"did not answer within {REACH_S:.0f} s"
    except OSError as error:
        return False, f"could not start: {error.strerror or error}"
    if done.returncode != 0:
        return False, f"failed: {_tail_words(done.stderr or done.stdout) or f'exit {done.returncode}'}"
    return True, done.stdout


def _tail_words(text: str, limit: int = 300) -> str:
    """The last `limit` characters of `text`, whole words only: a cut through a word could cut a secret (a
    proxy URL's password) past the shape the redactor knows it by, and the word is dropped instead."""
    text = text.strip()
    if len(text) <= limit:
        return text
    tail = text[-limit:]
    return tail.split(None, 1)[1] if len(tail.split(None, 1)) == 2 else ""


def collect_nodes(reach: NodeReach, per_node: dict[int, dict], bundle: Bundle, redactor: Redactor) -> None:
    """Run each node's script through `reach` and add what came back under nodes/node-K/ (see the module text)."""
    for node, why in sorted(reach.why_not.items()):
        bundle.lack(f"nodes/node-{node}/", redactor.text(why))  # a failed query's own words (scontrol, kubectl)
    order = sorted(reach.commands)
    if not order:
        return
    marker = f"npu-wizard-{secrets.token_hex(8)}"
    argvs = []
    for node in order:
        fact = per_node.get(node, {"devices": [], "pids": [], "plog_root": None})
        script = node_script(fact["devices"], fact["pids"], fact["plog_root"], marker)
        command = reach.commands[node]
        # ssh hands a command line to the remote shell; srun and kubectl exec pass bash -c its script as one word
        argvs.append([*command, f"bash -c {shlex.quote(script)}"] if reach.engine == "ssh" else [*command, script])
    per_tool = 2 * max((len(per_node.get(n, {}).get("devices", [])) for n in order), default=0) + 1
    results = run_all(argvs, REACH_S + COMMAND_S * per_tool)
    for node, result in zip(order, results, strict=True):
        _add_node(bundle, node, reach.via.format(target=reach.targets[node]), result, marker, redactor)


def _add_node(
    bundle: Bundle, node: int, via: str, result: subprocess.CompletedProcess[str], marker: str, redactor: Redactor
) -> None:
    prefix = f"nodes/node-{node}/"
    sections, missing, plog_root = read_sections(result.stdout, marker)
    if not sections and not missing:
        said = (result.stderr.strip().splitlines() or [f"exit {result.returncode}"])[-1]
        bundle.lack(prefix, f"could not be reached {via}: {redactor.text(said)}")  # ssh echoes proxies, options
        return
    for tool in dict.fromkeys(missing):
        bundle.lack(f"{prefix}{tool}", f"{tool} is not on node {node}'s PATH nor in {TOOL_FOLDERS}")
    for name, (text, code) in sections.items():
        note = f"from node {node}, {via}" + ("" if code in ("0", "") else f"; exited {code}")
        bundle.add(prefix + name, redactor.text(text).encode(), note=note)
    if not any(name.startswith("plog/") for name in sections):
        bundle.lack(
            f"{prefix}plog/", f"no plog file of node {node}'s ranks' pids under {plog_root or 'its plog folder'}"
        )


def node_facts(started: dict[int, list[dict]], nodes: Sequence[int]) -> dict[int, dict]:
    """What each node's script needs, from its ranks' last started events: devices, pids, plog folder."""
    facts: dict[int, dict] = {node: {"devices": [], "pids": [], "plog_root": None} for node in nodes}
    for events in started.values():
        event = events[-1]
        node = event.get("node")
        if node not in facts:
            continue
        device = _device_id(event)
        if device is not None and device not in facts[node]["devices"]:
            facts[node]["devices"].append(device)
        if isinstance(event.get("pid"), int):
            facts[node]["pids"].append(event["pid"])
        environment = event.get("environment") if isinstance(event.get("environment"), dict) else {}
        facts[node]["plog_root"] = facts[node]["plog_root"] or environment.get("ASCEND_PROCESS_LOG_PATH")
    for fact in facts.values():
        fact["devices"].sort()
    return facts


def _device_id(event: dict) -> int | None:
    match = re.fullmatch(r"npu:(\d+)", str(event.get("device", "")))
    if match:
        return int(match.group(1))
    local = event.get("local_rank")
    return local if isinstance(local, int) and local >= 0 else None


def run_info(run_dir: Path) -> dict:
    """run.json as a dict ({} when it cannot be read, or is no regular file: see wizard/monitor/run_files.py)."""
    try:
        return read_json_object(run_dir / RUN_FILE) or {}
    except RunFileError:
        return {}


def add_other_nodes(
    bundle: Bundle, run_dir: Path, project: Path | None, started: dict[int, list[dict]], redactor: Redactor,
    env: dict[str, str],
) -> None:  # fmt: skip
    """The nodes' tools and plogs through the run's engine (run.json's), or why they cannot be reached."""
    info = run_info(run_dir)
    engine, job_id = str(info.get("engine", "")), str(info.get("job_id") or "")
    nodes = [node for node in info.get("nodes") or [] if isinstance(node, int)]
    if engine == "ssh":
        hosts = _ssh_hosts(project)
        if hosts is None:
            bundle.lack("nodes/", "the run's project (its answers name the ssh hosts) is not there to read")
            return
        reach = ssh_reach(hosts, nodes)
    elif engine == "slurm" and job_id:
        reach = slurm_reach(job_id, nodes, env)
    elif engine in KUBERNETES_ENGINES and job_id:
        reach = kubernetes_reach(engine, job_id, nodes, env)
    else:
        count = info.get("node_count")
        if isinstance(count, int) and count > len(nodes):
            bundle.lack("nodes/", f"the {engine or 'manual'} engine started only this host's nodes: run npu-wizard "
                        "bundle on each other node's host for its tools and plogs")  # fmt: skip
        return
    collect_nodes(reach, node_facts(started, nodes), bundle, redactor)


def _ssh_hosts(project: Path | None) -> list[str] | None:
    """Each node's ssh host as the engine reaches it (cluster.ssh_hosts, else the host IPs); None without answers."""
    if project is None:
        return None
    from wizard.errors import WizardError
    from wizard.run.launch import load_project

    try:
        answers = load_project(project)
    except WizardError:
        return None
    return list(answers.get("cluster.ssh_hosts") or answers["network.host_ips"])
