"""The folders a run makes in the project (runs/, checkpoints/) keep git out: a .gitignore inside each.

A `.gitignore` holding `*` leaves the folder, itself included, out of `git status` in
whatever repository the project lives in, without touching the repository's own
.gitignore. `git add -f` still adds a file from it on purpose.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

GITIGNORE_TEXT = "# npu-wizard's run output: git leaves this folder out (git add -f adds a file of it anyway)\n*\n"


def keep_out_of_git(folder: Path) -> None:
    """Write `folder`/.gitignore ignoring everything in the folder, unless it has one."""
    path = Path(folder) / ".gitignore"
    try:
        handle = path.open("x")
    except (
        FileExistsError
    ):  # the user's, or another rank's written a moment ago: never touched
        return
    try:
        with handle:
            handle.write(GITIGNORE_TEXT)
    except OSError:
        # a full disk: an empty .gitignore would be taken as ours and never written again
        with contextlib.suppress(OSError):
            path.unlink()
        raise
