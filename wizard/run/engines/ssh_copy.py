"""What the ssh engine copies to every host: the files a rank needs, not the repository's history.

git decides, as `git status` does: tracked files and untracked ones it does not
ignore (each .gitignore, nested ones included, .git/info/exclude, core.excludesFile).
A folder outside any repository, or one its repository ignores as a whole (a
project rendered with -o inside someone's checkout), is read through an empty
repository of its own, so its own .gitignore files still count. `.git/`, `runs/`,
`checkpoints/` and `__pycache__/` are never copied. `.npu-wizardignore` at the
project's top takes gitignore lines: `!data/` copies what git ignores there (a data
folder the ranks read), any other line leaves out more. A repository nested in the
project (a submodule, a clone) is copied as its own git keeps it, never its .git/.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from wizard.run.engines.base import EngineError

WIZARD_IGNORE = ".npu-wizardignore"
NEVER_COPIED = (".git", "runs", "checkpoints")
NEVER_COPIED_ANYWHERE = ("__pycache__",)
NESTED_DEPTH = 8  # repositories inside repositories inside the project, at most


@dataclass(frozen=True)
class CopyList:
    """The files copied (relative paths), their bytes, and how many git-ignored files `.npu-wizardignore` kept."""

    files: tuple[str, ...]
    size: int
    kept: int

    def summary(self) -> str:
        """One line: how much is copied to each host."""
        kept = f", {self.kept} of them ignored by git but kept by {WIZARD_IGNORE}" if self.kept else ""
        return (
            f"copies {len(self.files)} file(s), {self.size} bytes ({self.size / 2**20:.1f} MiB){kept}; "
            f"not .git/, runs/, checkpoints/ or what git ignores"
        )

    def encoded(self) -> bytes:
        """The list as rsync --files-from --from0 reads it."""
        return b"".join(os.fsencode(name) + b"\0" for name in self.files)


# git only lists here: a command the repository's config names (its file-system monitor) is never run
NO_COMMANDS = ("-c", "core.fsmonitor=false")


def _git(project: Path, *args: str, git_dir: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    where = ["--git-dir", str(git_dir), "--work-tree", str(project)] if git_dir else []
    return subprocess.run(
        ["git", *NO_COMMANDS, *where, *args], cwd=project, capture_output=True, timeout=120, check=False
    )


def _names(output: bytes) -> set[str]:
    return {os.fsdecode(name) for name in output.split(b"\0") if name}


def _wizard_rules(project: Path) -> tuple[list[str], list[str]]:
    """The lines of .npu-wizardignore: patterns to copy although ignored (`!`), patterns to leave out."""
    try:
        lines = (project / WIZARD_IGNORE).read_text().splitlines()
    except FileNotFoundError:
        return [], []
    except (OSError, UnicodeDecodeError) as error:
        raise EngineError(f"cannot read {project / WIZARD_IGNORE}: {error}; nothing was copied") from None
    rules = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    return [rule[1:] for rule in rules if rule.startswith("!")], [rule for rule in rules if not rule.startswith("!")]


def _matching(project: Path, patterns: list[str], rules: Path, git_dir: Path | None) -> set[str]:
    """The files (tracked or not) that these gitignore patterns (written to `rules`) match."""
    if not patterns:
        return set()
    rules.write_text("\n".join(patterns) + "\n")
    found = _git(
        project, "ls-files", "-z", "--cached", "--others", "--ignored", f"--exclude-from={rules}", git_dir=git_dir
    )
    return _names(found.stdout) if found.returncode == 0 else set()


def _own_repository(project: Path) -> bool:
    """Whether git knows `project` as (a part of) a repository that does not ignore it as a whole."""
    inside = _git(project, "rev-parse", "--is-inside-work-tree")
    if inside.returncode != 0 or inside.stdout.strip() != b"true":
        return False
    return _git(project, "check-ignore", "-q", ".").returncode != 0


def _never_copied(name: str) -> bool:
    parts = name.split("/")
    return parts[0] in NEVER_COPIED or any(part in NEVER_COPIED_ANYWHERE for part in parts[:-1])


def copy_list(project: Path) -> CopyList:
    """The files of `project` a rank needs on its host; EngineError where git is missing or fails."""
    project = Path(project)
    if shutil.which("git") is None:
        raise EngineError(
            "the ssh engine needs git on this machine to tell which of the project's files to copy "
            "(it leaves out what .gitignore ignores); install git, then run again"
        )
    keep, leave = _wizard_rules(project)
    with tempfile.TemporaryDirectory(prefix="npu-wizard-copy-") as scratch_name:
        scratch = Path(scratch_name)
        git_dir: Path | None = None
        if not _own_repository(project):
            git_dir = scratch / "git"
            made = subprocess.run(["git", "init", "-q", "--bare", str(git_dir)], capture_output=True, check=False)
            if made.returncode != 0:
                raise EngineError(f"git init of a scratch repository failed: {made.stderr.decode(errors='replace')}")
        listed = _git(project, "ls-files", "-z", "--cached", "--others", "--exclude-standard", git_dir=git_dir)
        if listed.returncode != 0:
            said = listed.stderr.decode(errors="replace").strip()
            raise EngineError(f"git cannot list the project's files in {project}: {said}; nothing was copied")
        chosen = _names(listed.stdout)
        kept = _matching(project, keep, scratch / "keep", git_dir) - chosen
        chosen = (chosen | kept) - _matching(project, leave, scratch / "leave", git_dir)
    files, size = [], 0
    for name in sorted(_expanded(project, chosen)):
        if _never_copied(name):
            continue
        try:
            info = os.lstat(project / name)  # a tracked file deleted here is not copied
        except OSError:
            continue
        files.append(name)
        size += info.st_size
    return CopyList(tuple(files), size, len(kept.intersection(files)))


def _expanded(project: Path, names: set[str], depth: int = 0) -> set[str]:
    """`names` with each repository nested in the project (a submodule, a clone: git lists it as its folder,
    which rsync would copy empty, or whole with its .git/) replaced by the files its own git keeps."""
    out = set()
    for name in names:
        folder = name.rstrip("/")
        try:
            # a link to a folder is copied as a link; a submodule not checked out (no .git) as its empty folder
            nested = stat.S_ISDIR(os.lstat(project / folder).st_mode) and os.path.lexists(project / folder / ".git")
        except OSError:
            nested = False
        if not nested:
            out.add(name)
            continue
        if depth >= NESTED_DEPTH:
            raise EngineError(f"{project / folder}: repositories nested over {NESTED_DEPTH} deep; nothing was copied")
        listed = _git(project / folder, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
        if listed.returncode != 0:
            said = listed.stderr.decode(errors="replace").strip()
            raise EngineError(f"git cannot list the files of {project / folder}: {said}; nothing was copied")
        inner = _expanded(project / folder, _names(listed.stdout), depth + 1)
        out.update(f"{folder}/{sub}" for sub in inner)
    return out
