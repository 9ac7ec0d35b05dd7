"""The folder the ssh engine copies the project into on every host: refused where it would write over others' files.

rsync writes the project's files over whatever the folder holds, on every host, so
the root and the system folders are refused outright, and a folder that already
holds files is used only when it is this project's (a copy from an earlier run:
its answers.yaml has this project's name); anything else is refused, naming it.
"""

from __future__ import annotations

import posixpath
import shlex
from pathlib import Path

from wizard.run.engines.base import EngineError

SYSTEM_FOLDERS = frozenset(
    {"/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32", "/media", "/mnt", "/opt"}
    | {"/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var", "/var/tmp", "/usr/local"}
)
SYSTEM_TREES = (
    "/bin/",
    "/boot/",
    "/dev/",
    "/etc/",
    "/lib/",
    "/lib32/",
    "/lib64/",
    "/proc/",
    "/sbin/",
    "/sys/",
    "/usr/",
)
FOREIGN_MARK = "npu-wizard-foreign-folder"


def refuse_system_folder(remote: str) -> None:
    """Refuse the root, a system folder or one inside the system's own trees as the folder on the hosts."""
    folder = posixpath.normpath(remote)
    if folder.startswith("/"):
        folder = "/" + folder.lstrip("/")
    if folder in SYSTEM_FOLDERS or folder.startswith(SYSTEM_TREES):
        raise EngineError(
            f"cluster.remote_dir {remote}: the root or a system folder; the project would be copied over it on "
            "every host: choose a folder of its own (a new or empty one, e.g. under your home) and render again"
        )


def project_line(project: Path, name: str) -> str:
    """The project_name line of the project's answers.yaml, as a copy of it on a host holds it."""
    try:
        lines = (project / "answers.yaml").read_text().splitlines()
    except OSError:
        lines = []
    return next((line for line in lines if line.startswith("project_name:")), f"project_name: {name}")


def folder_check(remote: str, line: str, answers_file: str = "answers.yaml") -> str:
    """Shell words that print FOREIGN_MARK when `remote` holds files and is not this project's copy (its
    `answers_file`, a path inside `remote`, holds `line`)."""
    return (
        f'd={shlex.quote(remote)}; if [ -d "$d" ] && [ -n "$(ls -A "$d" 2>/dev/null)" ] && '
        f'! grep -qsxF {shlex.quote(line)} "$d"/{shlex.quote(answers_file)}; then echo {FOREIGN_MARK}; fi'
    )


def refuse_foreign(remote: str, hosts: tuple[str, ...], outputs: list[str], name: str) -> None:
    """Refuse, naming each host, where the check said the folder holds other files."""
    foreign = [node for node, output in enumerate(outputs) if FOREIGN_MARK in output.splitlines()]
    if foreign:
        where = ", ".join(f"node {node} ({hosts[node]})" for node in foreign)
        raise EngineError(
            f"cluster.remote_dir {remote} on {where} holds other files and no copy of project {name} "
            "(its answers.yaml); the copy would write over them, so nothing was started: choose a new or empty "
            "folder of its own"
        )
