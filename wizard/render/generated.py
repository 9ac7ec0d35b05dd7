"""The names of the files npu-wizard renders into a project, whatever the answers.

A journal or a pristine copy found in a project may have been written by
anyone (projects travel as tarballs, rsync copies, shared folders), and so
may their digests. What they name is therefore checked against what a render
of this npu-wizard can write at all: the template's files, one launch script
per node, the runtime's modules, the answers, the Kubernetes manifests and,
in a folder rendered --into, the renamed README and requirements. Never a
hidden path (.git/hooks, .github, .ssh), never a file of the user's code.
"""

from __future__ import annotations

import functools
import os
import re

# The generated files whose usual names a user's repository has already: renamed when rendering --into.
RENAMED = {"README.md": "NPU-WIZARD.md", "requirements.txt": "requirements-npu-wizard.txt"}
# One launch script per node (wizard.render.project.node_script_name) and the runtime package's modules.
_PATTERNS = re.compile(r"launch/node[0-9]+\.sh|runtime/[A-Za-z_][A-Za-z0-9_]*\.py")
# A template file with this ending is not copied as it is: finish() renders it into other files (the node scripts).
_RENDERED_BY_FINISH = ".j2"


def name_problem(name: str, *, into: bool = False) -> str:
    """Why `name` is not a file npu-wizard renders ("" when it is); `into`: a folder rendered --into."""
    parts = name.split("/")
    if ".git" in parts:
        return "is inside git's own files: npu-wizard never writes there"
    hidden = next((part for part in parts if part.startswith(".")), None)
    if hidden:  # .github, .gitmodules, .ssh, .bashrc, .venv: whoever runs them would run the planted file
        return f"is a hidden path ({hidden}): npu-wizard generates none"
    if into and name in RENAMED:
        return f"is the folder's own {name} (npu-wizard's is {RENAMED[name]} in a folder rendered --into)"
    if name not in _fixed_names() and not _PATTERNS.fullmatch(name):
        return "is not a file npu-wizard generates"
    return ""


@functools.cache
def _fixed_names() -> frozenset[str]:
    """The template's files as a project holds them, with the answers, the manifests and the renamed files."""
    from wizard.render.k8s import CONFIGMAP_FILE, ENGINES, manifest_file
    from wizard.render.templates import project_template

    root = next(path for path in project_template().iterdir() if path.name.startswith("{{"))
    names = {"answers.yaml", CONFIGMAP_FILE, *map(manifest_file, ENGINES), *RENAMED.values()}
    for folder, _dirs, files in os.walk(root):
        relative = os.path.relpath(folder, root)
        names.update(
            os.path.normpath(os.path.join(relative, file)).replace(os.sep, "/")
            for file in files
            if not file.endswith(_RENDERED_BY_FINISH)
        )
    return frozenset(names)
