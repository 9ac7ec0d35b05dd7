"""A repository set up the older way (`--into REPO` before `npu/` became the default): npu-wizard's files straight
in its root. `npu-wizard update REPO` updates it as before, then tells exactly what to run to move it into REPO/npu.

The commands are worked out for that repository, from what it holds when update ends: render into the folder from
its answers.yaml, move its checkpoints/ and runs/ (and the generated script's relative data folder) there, remove
npu-wizard's own files of the older layout that are as it wrote them (its pristine copy says), the folders that
held nothing else, and its state. A file of npu-wizard's that the user edited is never removed: each is named, to
move by hand. Nothing here runs a command or writes a file: the user reads them and runs them.
"""

from __future__ import annotations

import os
import posixpath
import shlex
from pathlib import Path

from wizard.errors import WizardError, shown
from wizard.render import pristine
from wizard.render.pristine import REPOSITORY_MARKER, STATE_DIR, is_into
from wizard.render.render import unedited

FOLDER = "npu"
ANSWERS = "answers.yaml"
CARRIED = ("checkpoints", "runs")  # made by the runs: moved whole into the folder
PYCACHE = "__pycache__"


def is_older_layout(project: Path) -> bool:
    """Whether `project` is a repository set up with npu-wizard's files straight in its root before `--folder .`
    recorded that choice (.npu-wizard/into without .npu-wizard/repository)."""
    return is_into(project) and (project / STATE_DIR).is_dir() and not os.path.lexists(project / REPOSITORY_MARKER)


def move_note(project: Path, shown_as: str) -> str:
    """What to run to move the older layout of `project` into project/npu ("" when it is not one, or its pristine
    copy cannot be read); `shown_as`: the repository's path as the user named it, used in the commands."""
    if not is_older_layout(project):
        return ""
    try:
        files = pristine.load(project).files
    except (OSError, ValueError):
        return ""
    repo = shown_as.rstrip("/") or "/"
    repo = f"./{repo}" if repo.startswith("-") else repo  # never read as an option

    def at(name: str) -> str:
        return shlex.quote(posixpath.join(repo, name))

    present = sorted(name for name in files if os.path.lexists(project / name))
    answers = [ANSWERS] if os.path.lexists(project / ANSWERS) else []  # rendered from, so carried into the folder
    removes = sorted({*answers, *(name for name in present if unedited(project / name, files[name]))})
    edited = [name for name in present if name not in removes]
    commands = [["npu-wizard", "--answers", at(ANSWERS), "--into", shlex.quote(repo), "--folder", FOLDER]]
    carried = [*CARRIED, *_data_folder(project, files)]
    commands += [["mv --", at(name), at(f"{FOLDER}/{name}")] for name in carried if os.path.isdir(project / name)]
    folders, caches = _emptied_folders(project, set(removes))
    for command, names in (("rm --", removes), ("rm -rf --", caches), ("rmdir --", folders)):
        if names:
            commands.append([command, *(at(name) for name in names)])
    commands.append(["rm -r --", at(STATE_DIR)])
    lines = [
        f"{repo} has npu-wizard's files straight in its root (the older layout, set up before npu/ became the "
        f"default). To move them into its folder {FOLDER}/, stop any run of it, then run:",
        *(_wrapped(command) for command in commands),
    ]
    if edited:
        lines.append(
            f"These {len(edited)} file(s) of npu-wizard's you edited stay where they are: compare each with its new "
            f"copy in {FOLDER}/, move your changes by hand, then delete it: " + ", ".join(map(shown, edited))
        )
    lines.append(f"To keep the older layout instead (and no longer see this note): echo . > {at(REPOSITORY_MARKER)}")
    return "\n".join(lines)


def _data_folder(project: Path, files: dict[str, str]) -> list[str]:
    """The generated script's data folder when it is a relative folder of the project, there now (it is read
    from the project's folder, so it moves with it)."""
    from wizard.answers.model import load_text

    try:
        answers = load_text((project / ANSWERS).read_text(encoding="utf-8"), project)
        data_dir = answers.get("training.data_dir") if "train.py" in files else None
    except (OSError, ValueError, WizardError):  # a broken answers file: the render command names its problem
        return []
    name = posixpath.normpath(data_dir or "data")
    if name.startswith(("/", "..")) or name in (".", *CARRIED) or not os.path.isdir(project / name):
        return []
    return [name]


def _emptied_folders(project: Path, removes: set[str]) -> tuple[list[str], list[str]]:
    """The folders of npu-wizard's files that hold nothing but files in `removes`, __pycache__ folders and such
    folders, deepest first; and the __pycache__ folders in them."""
    parents = {posixpath.dirname(name) for name in removes} - {""}
    candidates = {
        "/".join(folder.split("/")[:depth]) for folder in parents for depth in range(1, folder.count("/") + 2)
    }
    empty: list[str] = []
    caches: list[str] = []
    for folder in sorted(candidates, key=lambda name: (-name.count("/"), name)):
        try:
            entries = os.listdir(project / folder)
        except OSError:
            continue
        paths = [f"{folder}/{entry}" for entry in entries]
        here = [path for path in paths if posixpath.basename(path) == PYCACHE and (project / path).is_dir()]
        if all(path in removes or path in empty or path in here for path in paths):
            empty.append(folder)
            caches += here
    return empty, sorted(caches)


def _wrapped(words: list[str], width: int = 100) -> str:
    """The command of `words` (each shell-quoted) indented by two spaces, wrapped between words at `width` with a
    backslash (bash reads it as one line)."""
    lines = [""]
    for word in words:
        if lines[-1] and len(lines[-1]) + len(word) >= width:
            lines.append("")
        lines[-1] += (" " if lines[-1] else "") + word
    return " \\\n".join(f"  {'  ' * bool(index)}{line}" for index, line in enumerate(lines))
