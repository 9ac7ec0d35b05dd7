"""Finishing a rendered project: per-node launch scripts, the runtime copy, the answers.

Cookiecutter renders one file per template file; a project needs one launch
script per node. `finish` does the rest, and both paths call it: npu-wizard
in-process, plain cookiecutter from its post-generation hook.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import jinja2

import runtime
from wizard.answers import Answers, dump

NODE_TEMPLATE = Path("launch") / "_node.sh.j2"
PREVIEW_TEMPLATE = Path("launch") / "_node.sh.j2"


def node_script_name(node: int) -> str:
    """The file name of a node's launch script."""
    return f"node{node}.sh"


def render_node_script(template_text: str, context: Mapping[str, str], node: int) -> str:
    """One node's launch script from the node template."""
    environment = jinja2.Environment(keep_trailing_newline=True, undefined=jinja2.StrictUndefined, autoescape=False)
    template = environment.from_string(template_text)
    host_ips = context["host_ips"].split(",")
    return template.render(cookiecutter=context, node_rank=node, host_ip=host_ips[node])


def finish(project: Path, context: Mapping[str, str], answers: Answers) -> None:
    """Write the per-node launch scripts, copy the runtime and the answers into `project`."""
    template_path = project / NODE_TEMPLATE
    template_text = template_path.read_text()
    for node in range(answers["nodes"]):
        script = project / "launch" / node_script_name(node)
        script.write_text(render_node_script(template_text, context, node))
        script.chmod(0o755)
    template_path.unlink()
    copy_runtime(project / "runtime")
    (project / "answers.yaml").write_text(dump(answers))


def copy_runtime(target: Path) -> None:
    """Copy the runtime package's Python files (no caches) into `target`."""
    source = Path(runtime.__file__).parent
    target.mkdir(parents=True, exist_ok=False)
    for path in sorted(source.glob("*.py")):
        shutil.copyfile(path, target / path.name)


def walk_files(root: Path) -> list[str]:
    """Every file under `root`, as sorted POSIX paths relative to it."""
    found = []
    for folder, _dirs, files in os.walk(root):
        for name in files:
            found.append((Path(folder) / name).relative_to(root).as_posix())
    return sorted(found)
