"""Finishing a rendered project: per-node scripts, the runtime copy, the answers, the pristine copy.

Cookiecutter renders one file per template file; a project needs one launch
script per node. Those are thin (they set the node's rank and address and run
launch/run-node.sh, rendered once), so a project's size grows linearly in
nodes. `finish` writes them and the rest, and both paths call it: npu-wizard
in-process, plain cookiecutter from its post-generation hook.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path

import runtime
from wizard.answers.model import Answers, dump
from wizard.answers.questions_cluster import SCHEDULERS
from wizard.answers.questions_k8s import KUBERNETES_ENGINES
from wizard.answers.script import GENERATED_FILE, is_foreign
from wizard.render import pristine
from wizard.render.k8s import write_manifests
from wizard.render.shellquote import template_environment

NODE_TEMPLATE = Path("launch") / "_node.sh.j2"
SHARED_SCRIPT = Path("launch") / "run-node.sh"
ENTRY_SCRIPT = Path("launch") / "entry.sh"
SBATCH_FILE = Path("slurm") / "job.sbatch"
MODEL_FILE = Path("model.py")  # the GPT (training.model: gpt)
HF_MODEL_FILE = Path("hf_model.py")  # a local Hugging Face model (training.model: hf)
PREPARE_DATA = Path("prepare_data.py")  # text to token files (training.dataset: tokens)


def node_script_name(node: int) -> str:
    """The file name of a node's launch script."""
    return f"node{node}.sh"


def node_scripts(template_text: str, context: Mapping[str, str]) -> Iterator[tuple[int, str]]:
    """Each node's (thin) launch script from the node template, node by node."""
    template = template_environment().from_string(template_text)
    for node, host_ip in enumerate(context["host_ips"].split(",")):
        yield node, template.render(cookiecutter=context, node_rank=node, host_ip=host_ip)


def finish(project: Path, context: Mapping[str, str], answers: Answers) -> None:
    """Write the launch scripts the engine needs, copy the runtime and the answers into `project`."""
    template_path = project / NODE_TEMPLATE
    written: dict[str, str] = {}
    # Under a scheduler the nodes are chosen at run time: launch/entry.sh, not one script per node.
    scheduled = answers["cluster.engine"] in SCHEDULERS
    if not scheduled:
        for node, text in node_scripts(template_path.read_text(), context):
            name = f"launch/{node_script_name(node)}"
            script = project / name
            script.write_text(text)
            script.chmod(0o755)
            written[name] = text
    template_path.unlink()
    if is_foreign(answers["training.script"]):
        (project / GENERATED_FILE).unlink()  # the user's own script runs instead
    if answers.get("training.model") != "gpt":
        (project / MODEL_FILE).unlink()
    if answers.get("training.model") != "hf":
        (project / HF_MODEL_FILE).unlink()
    if answers.get("training.dataset") != "tokens":
        (project / PREPARE_DATA).unlink()
    (project / SHARED_SCRIPT).chmod(0o755)
    if scheduled:
        (project / ENTRY_SCRIPT).chmod(0o755)
    else:
        (project / ENTRY_SCRIPT).unlink()
    if answers["cluster.engine"] != "slurm":
        shutil.rmtree(project / SBATCH_FILE.parent)
    copy_runtime(project / "runtime")
    (project / "answers.yaml").write_text(dump(answers))
    if answers.get("cluster.engine") in KUBERNETES_ENGINES:
        # After the files above, which the ConfigMap carries
        write_manifests(project, answers, context.get("repository_folder", ""))
    pristine.record(project, walk_files(project), written)  # the base of a later `npu-wizard update`


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
