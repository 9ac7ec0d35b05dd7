"""The staging folder of a render, beside the project, and what an interrupted --force leaves there.

A render writes the new project into `.NAME.staging-PID-XXXX/NAME` beside
the project folder and moves it into place. --force first sets the old
project aside in the staging folder as `.replaced`, moves the new one in,
carries over what of the old one is not npu-wizard's (the user's files,
checkpoints, runs, the data folder), then deletes what is left (npu-wizard's
files); Ctrl-C, SIGTERM or SIGHUP on the way
puts the old project back whole. A SIGKILL cannot be caught: the next render
of the project finds the staging folder it left, restores the old project
from it when the project folder is missing, and otherwise says what it holds
and what to do.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path

from wizard.render.replace import carry_over, give_back, is_wizard_process
from wizard.stopping import deferred_signals

# What the project that --force replaces is called in the staging folder: a name no project can have.
REPLACED = ".replaced"
_SHOWN_ENTRIES = 4


def make_staging(output_dir: Path, name: str) -> Path:
    """A new staging folder for project `name` in `output_dir`, named with this process's pid."""
    return Path(tempfile.mkdtemp(prefix=f".{name}.staging-{os.getpid()}-", dir=output_dir))


def replace_project(new: Path, target: Path, carried: Sequence[str]) -> None:
    """Put `new` (in its staging folder) in place of the project `target`, carrying `carried` over from it.

    All or nothing: an OSError, Ctrl-C, SIGTERM or SIGHUP before the old
    project is deleted puts it back whole, its folders in it, and raises.
    """
    retired = new.parent / REPLACED
    with deferred_signals() as caught:
        target.rename(retired)
        try:
            new.rename(target)
        except OSError:
            retired.rename(target)
            raise
        try:
            moved = carry_over(retired, target, carried)
        except OSError:
            target.rename(new)
            retired.rename(target)
            raise
        if caught:  # raised when the block ends
            give_back(target, retired, moved)
            target.rename(new)
            retired.rename(target)
            return
        shutil.rmtree(retired, ignore_errors=True)


def recover_leftovers(output_dir: Path, name: str, *, restore: bool) -> list[str]:
    """Notes on the staging folders interrupted renders of project `name` left in `output_dir`.

    Where the project folder is missing and a staging folder of the user's
    holds the project --force was replacing, it is moved back (`restore`).
    A staging folder of a render still running beside this one is left alone.
    """
    pattern = re.compile(rf"^\.{re.escape(name)}\.staging-(?:(\d+)-)?")
    try:
        entries = sorted(output_dir.iterdir())
    except OSError:
        return []
    notes = []
    for folder in entries:
        match = pattern.match(folder.name)
        if not match:
            continue
        pid = int(match.group(1)) if match.group(1) else None
        if pid is not None and pid != os.getpid() and is_wizard_process(pid):
            continue
        notes.append(_recover(folder, output_dir / name, restore))
    return notes


def _recover(folder: Path, target: Path, restore: bool) -> str:
    """Restore `target` from the leftover staging `folder`, or say what the folder holds and what to do."""
    replaced = folder / REPLACED
    if not os.path.lexists(replaced):
        return (
            f"{folder} is left from a render that was interrupted ({_holding(folder)}): "
            f"look inside, then delete it: rm -r {folder}"
        )
    if not os.path.lexists(target) and _own_folder(folder) and _own_folder(replaced):
        if not restore:
            return (
                f"{target} is missing and {folder} holds it, set aside by an interrupted --force: a render restores it"
            )
        try:
            replaced.rename(target)
        except OSError as error:
            return (
                f"{replaced} is {target}, set aside by an interrupted --force; moving it back failed "
                f"({error.strerror or error}): move it back yourself: mv {replaced} {target}"
            )
        shutil.rmtree(folder, ignore_errors=True)  # what is left is the new render only
        return f"restored {target} from {folder}, where an interrupted --force had set it aside"
    return (
        f"{folder} holds the project an interrupted --force replaced, with what was not yet carried over into "
        f"{target} ({_holding(replaced)}): move what you want to keep into {target}, then delete it: rm -r {folder}"
    )


def _own_folder(path: Path) -> bool:
    """Whether `path` is a folder (not a link) of this user's."""
    try:
        info = path.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()


def _holding(folder: Path) -> str:
    """What `folder` holds, in a few words: its first entries and how many there are."""
    try:
        names = sorted(
            entry.name + ("/" if entry.is_dir(follow_symlinks=False) else "") for entry in os.scandir(folder)
        )
    except OSError as error:
        return f"unreadable: {error.strerror or error}"
    if not names:
        return "empty"
    shown = ", ".join(names[:_SHOWN_ENTRIES]) + (", ..." if len(names) > _SHOWN_ENTRIES else "")
    return f"{len(names)} entr{'y' if len(names) == 1 else 'ies'}: {shown}"
