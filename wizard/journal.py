"""Change many files of a project as one step: stage, commit with one rename, move into place.

`apply` writes every new text under `.npu-wizard/update/` first; nothing in
the project changes until the journal is renamed into place (the commit). An
update killed before that leaves the project as it was (the stale staging is
dropped next time); one killed after it is finished by `roll_forward`, which
the next `npu-wizard update` runs first. Each file moves in with one rename,
so no file is ever half written.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from wizard.errors import TargetError
from wizard.pristine import STATE_DIR

STAGING = f"{STATE_DIR}/update"
JOURNAL = "journal.json"
# Test hook: stop at this point (before-commit, after-first-move), say so in the named file, wait to be killed.
PAUSE_AT_ENV, PAUSE_FILE_ENV = "NPU_WIZARD_TEST_PAUSE_AT", "NPU_WIZARD_TEST_PAUSE_FILE"


def apply(
    project: Path,
    writes: Mapping[str, str | bytes],
    removes: Iterable[str],
    executable: frozenset[str],
) -> None:
    """Write `writes`, delete `removes` in `project`, all or nothing (see the module docstring)."""
    check_targets(project, writes, removes)
    staging = _staging_folder(project)
    shutil.rmtree(staging, ignore_errors=True)  # what an update killed before its commit left
    files = staging / "files"
    for name, content in sorted(writes.items()):
        target, staged = project / name, files / name
        staged.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            staged.write_bytes(content)
        else:
            staged.write_text(content, encoding="utf-8")
        mode = 0o755 if name in executable else (target.stat().st_mode & 0o777 if target.exists() else 0o644)
        staged.chmod(mode)
    _pause("before-commit")
    pending = staging / (JOURNAL + ".new")
    pending.write_text(json.dumps({"write": sorted(writes), "remove": sorted(removes)}))
    os.replace(pending, staging / JOURNAL)  # the commit
    roll_forward(project)


def pending(project: Path) -> bool:
    """Whether a committed update of `project` was interrupted before it finished."""
    return (project / STAGING / JOURNAL).is_file()


def roll_forward(project: Path) -> bool:
    """Finish a committed update (True), or drop an uncommitted one's staging (False)."""
    staging = project / STAGING
    journal = staging / JOURNAL
    if not journal.is_file():
        shutil.rmtree(staging, ignore_errors=True)
        return False
    entries = json.loads(journal.read_text())
    check_targets(project, entries["write"], entries["remove"])
    for count, name in enumerate(entries["write"]):
        staged = staging / "files" / name
        if staged.exists():  # else moved in before an interruption
            (project / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(staged, project / name)
        if count == 0:
            _pause("after-first-move")
    for name in entries["remove"]:
        (project / name).unlink(missing_ok=True)
    journal.unlink()
    shutil.rmtree(staging, ignore_errors=True)
    return True


def check_targets(project: Path, writes: Iterable[str], removes: Iterable[str]) -> None:
    """Refuse (TargetError, nothing changed) when a file to write or remove cannot be replaced by a plain file."""
    problems = [problem for name in sorted({*writes, *removes}) if (problem := target_problem(project, name))]
    if problems:
        listed = "\n".join(f"  - {problem}" for problem in problems)
        raise TargetError(
            f"update cannot write {len(problems)} file(s) of {project}, so nothing was changed:\n{listed}"
        )


def target_problem(root: Path, name: str) -> str:
    """Why `name` under `root` cannot be written or removed as a regular file ("" when it can, or is absent)."""
    parts = name.split("/")
    path = root
    for depth, part in enumerate(parts, start=1):
        path = path / part
        shown = "/".join(parts[:depth])
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return ""
        if stat.S_ISLNK(mode) and depth < len(parts):
            return (
                f"{name}: {shown} is a symbolic link ({_link_text(path)}) and update never writes through a link: "
                f"make {shown} a folder of the project (a copy of what it points to), then run update again"
            )
        if stat.S_ISLNK(mode):
            return (
                f"{name} is a symbolic link ({_link_text(path)}) and update neither writes through a link nor turns "
                "it back into a file: replace the link by a copy of its file, then run update again"
            )
        if depth < len(parts) and not stat.S_ISDIR(mode):
            return f"{name}: {shown} is a file where update needs a folder: move it away, then run update again"
        if depth == len(parts) and stat.S_ISDIR(mode):
            return f"{name} is a folder where update writes a file: move the folder away, then run update again"
        if depth == len(parts) and not stat.S_ISREG(mode):
            return f"{name} is not a regular file: move it away, then run update again"
    return ""


def _link_text(path: Path) -> str:
    try:
        target = os.readlink(path)
    except OSError:
        return "unreadable"
    return f"to {target[:200]!r}..." if len(target) > 200 else f"to {target}"


def _staging_folder(project: Path) -> Path:
    """The staging folder, refused (TargetError) when it or `.npu-wizard` is a link or not a folder."""
    for name in (STATE_DIR, STAGING):
        path = project / name
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            raise TargetError(
                f"{path} is {'a symbolic link' if path.is_symlink() else 'not a folder'}; npu-wizard keeps its state "
                "there and never writes through a link: remove it, then run update again"
            )
    return project / STAGING


def _pause(point: str) -> None:
    if os.environ.get(PAUSE_AT_ENV) != point:
        return
    Path(os.environ[PAUSE_FILE_ENV]).write_text(point)
    while True:  # until the test that asked for the pause kills this process
        time.sleep(60)
