"""`npu-wizard doctor`: preflight checks of this node against a project's answers.

Each check is a small function returning a `Result` (PASS, WARN, FAIL or
SKIP, what was found, and the fix). The machine's facts (environment, /proc
paths, the software probe) come in through `System`, so tests can build real
conditions. Doctor reads only: it binds and closes sockets, opens and closes
one connection to the master, and reads files; it changes nothing.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from runtime.checks import FAIL, PASS, SKIP, WARN, Result
from runtime.preflight import NONLOCAL_BIND
from runtime.shadowing import check_shadowing
from wizard.answers.model import Answers, load_text, resolve
from wizard.answers.script import is_foreign
from wizard.answers.source import read_answers_text
from wizard.doctor import device_network, network, project_files, software
from wizard.doctor.memory_check import check_memory, device_capacity
from wizard.doctor.probe import Software, probe_software
from wizard.errors import TargetError
from wizard.memory.fit import MEMINFO
from wizard.render import conflict_markers
from wizard.render.into import requirements_file
from wizard.render.pristine import repository_root

STATUSES = (PASS, WARN, FAIL, SKIP)
ENV_RESERVED_FILE = "NPU_WIZARD_RESERVED_PORTS_FILE"  # the same override as sysctl/reserve-ports.sh


def _reserved_ports_default() -> Path:
    return Path(os.environ.get(ENV_RESERVED_FILE) or network.RESERVED_PORTS)


@dataclass(frozen=True)
class System:
    """The facts of this machine that doctor reads; tests pass their own."""

    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    reserved_ports: Path = field(default_factory=_reserved_ports_default)
    port_range: Path = network.PORT_RANGE
    nonlocal_bind: Path = NONLOCAL_BIND
    connect_timeout_s: float = 1.0
    meminfo: Path = MEMINFO
    probe: Callable[[Mapping[str, str]], Software] = probe_software


@dataclass(frozen=True)
class Report:
    """Everything doctor found for one node of one project."""

    project: str
    node: network.Node
    device: str
    nodes: int
    results: tuple[Result, ...]
    engine: str = "manual"

    @property
    def failed(self) -> bool:
        """Whether any check failed."""
        return any(r.status == FAIL for r in self.results)

    def counts(self) -> dict[str, int]:
        """How many checks ended in each status."""
        return {status: sum(1 for r in self.results if r.status == status) for status in STATUSES}


def examine(
    answers: Answers,
    *,
    project_dir: Path | None = None,
    node: int | None = None,
    system: System | None = None,
) -> Report:
    """Run every check of this node against `answers`; `project_dir` adds the launch script's own values."""
    system = system or System()
    this = network.which_node(answers, node, system.nonlocal_bind)
    found = system.probe(system.env)
    ports = network.read_port_facts(system.reserved_ports, system.port_range)
    if_ip = network.check_if_ip(answers, this, system.nonlocal_bind)
    script = project_dir / "launch" / "run-node.sh" if project_dir else None
    own_script = is_foreign(answers["training.script"])
    root = repository_root(project_dir) if project_dir else None  # where the ranks start, and the script is
    results = (
        software.check_python(found),
        software.check_torch(found, answers, requirements_file(project_dir)),
        software.check_torch_npu(found, answers),
        software.check_cann_files(answers, system.env),
        software.check_devices(found, answers, system.env),
        device_network.check_device_network(answers, system.env),
        if_ip,
        network.check_hccl_reserved(answers, ports, system.env),
        network.check_hccl_free(answers, this, if_ip, system.env),
        network.check_device_port(answers, system.env),
        network.check_master_port(answers, this, ports),
        network.check_master(answers, this, system.connect_timeout_s, system.nonlocal_bind),
        network.check_timeouts(answers, script),
        network.check_rank_table(answers, system.env),
        check_memory(answers, device_capacity(answers, found, this, system.meminfo), project_dir),
        *((project_files.check_conflict_markers(project_dir),) if project_dir else ()),
        *((project_files.check_user_script(project_dir, answers, root),) if root and own_script else ()),
        *((check_shadowing(root, answers["training.script"]),) if root and own_script else ()),
    )
    name = project_dir.name if project_dir else "(no project: the default answers)"
    return Report(name, this, answers["device"], answers["nodes"], results, answers["cluster.engine"])


def format_text(report: Report) -> list[str]:
    """The report for people: a header, one line per check (plus its fix), a summary."""
    how = {
        "--node": "",
        "simulated": ", every node simulated on this host",
        "found": ", found by its host IP",
        "guessed": ", assumed: no host IP of the project is here",
    }[report.node.how]
    lines = [
        f"npu-wizard doctor: {report.project}, node {report.node.index} of {report.nodes} "
        f"({report.node.address}{how}), device {report.device}"
    ]
    width = max(len(r.name) for r in report.results)
    for result in report.results:
        lines.append(f"{result.status}  {result.name:<{width}}  {result.detail}")
        if result.status in (WARN, FAIL) and result.fix:
            lines.append(f"      {'':<{width}}  fix: {result.fix}")
    counts = report.counts()
    verdict = "checks failed: fix the FAIL lines first" if report.failed else "ready"
    lines.append(
        f"{counts[PASS]} passed, {counts[WARN]} warning(s), {counts[FAIL]} failed, {counts[SKIP]} skipped: {verdict}"
    )
    if report.engine == "ssh" and report.nodes > 1:
        lines.append(
            "every host of this ssh project from here: npu-wizard run PROJECT --smoke "
            "(copies the project, then runs each node's preflight and a smoke test on its host)"
        )
    return lines


def to_json(report: Report) -> str:
    """The report for machines."""
    document = {
        "project": report.project,
        "node": report.node.index,
        "host_ip": report.node.address,
        "node_from": report.node.how,
        "device": report.device,
        "ok": not report.failed,
        "counts": report.counts(),
        "checks": [asdict(result) for result in report.results],
    }
    return json.dumps(document, indent=2)


def load_project(project: str | None) -> tuple[Answers, Path | None]:
    """The project's answers (PROJECT, else the current folder if it is one, else the defaults)."""
    folder = Path(project) if project else Path.cwd()
    answers_file = folder / "answers.yaml"
    if answers_file.exists():
        if conflict_markers.first_marker(answers_file) is not None:  # no answers to check the node against
            conflict_markers.refuse_unresolved(folder, "run npu-wizard doctor again")
        return load_text(read_answers_text(str(answers_file), plain_file_only=True)), folder.resolve()
    if project:
        raise TargetError(f"{project} is not an npu-wizard project (no answers.yaml); render one with --answers")
    return resolve({}), None


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `npu-wizard doctor`."""
    parser = argparse.ArgumentParser(
        prog="npu-wizard doctor",
        description="Check this node against a rendered project: Python, torch and torch_npu, CANN, "
        "devices, addresses, ports and the master. Reads only; changes nothing.",
        epilog="Exit codes: 0 nothing failed, 1 a check failed (or no such project), 2 usage error.",
    )
    parser.add_argument("project", nargs="?", help="the project folder (default: this folder, else the defaults)")
    parser.add_argument("--node", type=int, help="which node this host is (default: found by its host IP)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def command(argv: Sequence[str], system: System | None = None, out: Callable[[str], None] = print) -> int:
    """`npu-wizard doctor ARGS`: print the report; 0 when nothing failed, else 1."""
    args = build_parser().parse_args(list(argv))
    answers, project_dir = load_project(args.project)
    report = examine(answers, project_dir=project_dir, node=args.node, system=system)
    if args.json:
        out(to_json(report))
    else:
        for line in format_text(report):
            out(line)
    return 1 if report.failed else 0
