"""Change many files of a project as one step: stage, commit with one rename, move into place.

`apply` writes every new text under `.npu-wizard/update/` first; nothing in
the project changes until the journal is renamed into place (the commit). An
update killed before that leaves the project as it was (the stale staging is
dropped next time); one killed after it is finished by `roll_forward`, which
the next `npu-wizard update` runs first. Each file moves in with one rename,
so no file is ever half written. Power loss is survived by fsync in the order
the commit needs: the staged files and their folders, the journal and its
rename, each folder a file moved into or out of, and only then the journal's
removal. A journal a crash damaged anyway is reported, never guessed at.

A project may come from anyone, journal and digests included, so
`roll_forward` finishes only what an update or render could have staged:
plain relative names inside the project that a render writes
(wizard.render.generated: never .git, a hidden path or the user's own files),
each write a staged file whose SHA-256 the journal holds, each removal a file
still holding the bytes the update saw, nothing through a symbolic link.
Anything else is refused before a file changes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from wizard import errors
from wizard.errors import TargetError
from wizard.render import generated
from wizard.render.pristine import INTO_MARKER, PRISTINE, REPOSITORY_MARKER, STATE_DIR, is_into
from wizard.stopping import STOP_SIGNALS

STAGING = f"{STATE_DIR}/update"
JOURNAL = "journal.json"
FILES = "files"
FORMAT = 2  # format 1 listed bare names
JOURNAL_LIMIT = 4 << 20
# A removal compares the file with the bytes the update saw; a bigger file was never generated.
REMOVE_LIMIT = 64 << 20
# Test hook (pause_for_test): stop at this point (before-commit, after-first-move; replace.py's after-first-carry),
# say so in the named file, wait for a signal.
PAUSE_AT_ENV, PAUSE_FILE_ENV = "NPU_WIZARD_TEST_PAUSE_AT", "NPU_WIZARD_TEST_PAUSE_FILE"


@dataclass(frozen=True)
class Entries:
    """A journal: the SHA-256 of each staged file to move in, and of each file to remove."""

    write: dict[str, str]
    remove: dict[str, str]


def apply(
    project: Path,
    writes: Mapping[str, str | bytes],
    removes: Iterable[str],
    executable: frozenset[str],
) -> None:
    """Write `writes`, delete `removes` in `project`, all or nothing (see the module docstring)."""
    removes = sorted(removes)
    check_targets(project, writes, removes)
    refuse_pending(project)
    staging = _staging_folder(project)
    _fresh_staging(staging)
    try:
        _stage_and_commit(project, staging, writes, removes, executable)
    except OSError as error:  # a full disk, say: before the commit, so the project is as it was
        shutil.rmtree(staging, ignore_errors=True)
        raise TargetError(
            f"cannot stage the new files of {project} in {staging} ({error.strerror}), so nothing was changed: "
            f"{errors.write_advice(error)}, then run again"
        ) from None
    roll_forward(project)


def _stage_and_commit(
    project: Path,
    staging: Path,
    writes: Mapping[str, str | bytes],
    removes: list[str],
    executable: frozenset[str],
) -> None:
    """Write every new file under `staging`, then the journal, and rename it into place: the commit."""
    files = staging / FILES
    written: dict[str, str] = {}
    for name, content in sorted(writes.items()):
        data = content if isinstance(content, bytes) else content.encode("utf-8")
        target, staged = project / name, files / name
        _staged_folders(staging, f"{FILES}/{name}")
        mode = 0o755 if name in executable else (target.lstat().st_mode & 0o777 if os.path.lexists(target) else 0o644)
        _write_file(staged, data, mode)
        written[name] = _sha256(data)
    removed = {name: digest for name in removes if (digest := _digest_of(project / name))}
    # Durable in this order: the staged files and their folders, the journal, its rename (the commit).
    _sync_folders(project, [f"{STAGING}/{FILES}/{name}" for name in written] + [f"{STAGING}/{JOURNAL}"])
    pause_for_test("before-commit")
    pending_journal = staging / (JOURNAL + ".new")
    document = {"format": FORMAT, "write": written, "remove": removed}
    _write_file(pending_journal, json.dumps(document, sort_keys=True).encode(), 0o644)
    os.replace(pending_journal, staging / JOURNAL)  # the commit
    _sync_folder(staging)


def refuse_pending(project: Path) -> None:
    """TargetError when a committed update of `project` was interrupted and must be finished first."""
    if pending(project):
        raise TargetError(f"an update of {project} was interrupted; run npu-wizard update {project} to finish it first")


def pending(project: Path) -> bool:
    """Whether a committed update of `project` was interrupted before it finished."""
    return os.path.lexists(_staging_folder(project) / JOURNAL)


def roll_forward(project: Path) -> list[str]:
    """Finish a committed update; return the files it kept rather than removed (changed since it was planned)."""
    staging = _staging_folder(project)
    journal = staging / JOURNAL
    entries = _read_journal(project, journal)
    try:
        return _finish(project, staging, entries)
    except OSError as error:  # the journal stays: the next update finishes what is left
        raise TargetError(
            f"the update of {project} is committed but could not be finished ({error.strerror}: "
            f"{error.filename}): {errors.write_advice(error)}, then run npu-wizard update {project} to finish it"
        ) from None


def _finish(project: Path, staging: Path, entries: Entries) -> list[str]:
    """Move every staged file into place and remove what the journal says; drop the journal and the staging."""
    journal = staging / JOURNAL
    for count, name in enumerate(sorted(entries.write)):
        staged = staging / FILES / name
        if os.path.lexists(staged):  # else moved in before an interruption
            (project / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(staged, project / name)
        if count == 0:
            pause_for_test("after-first-move")
    kept = []
    for name, digest in sorted(entries.remove.items()):
        target = project / name
        if not os.path.lexists(target):
            continue
        if _digest_of(target) != digest:
            kept.append(name)
            continue
        target.unlink()
    # Every move and removal durable before the journal goes: after a power loss it is finished again.
    _sync_folders(project, [*entries.write, *entries.remove])
    journal.unlink()
    _sync_folder(staging)
    shutil.rmtree(staging, ignore_errors=True)
    return kept


def _read_journal(project: Path, journal: Path) -> Entries:
    """The journal's entries, each checked; TargetError (nothing changed) when it is damaged or not the update's."""
    try:
        info = journal.lstat()
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("it is not a regular file")
        if info.st_size > JOURNAL_LIMIT:
            raise ValueError(f"{info.st_size} bytes, more than any update writes")
        document = json.loads(journal.read_bytes())
        entries = _entries(document)
    except RecursionError:
        raise _damaged(project, journal, "nested too deep to be a journal") from None
    except (OSError, ValueError) as error:
        raise _damaged(project, journal, str(error)) from None
    into = _rendered_into(project, entries.write)
    for action, names in (("write", entries.write), ("remove", entries.remove)):
        for name, digest in names.items():
            problem = _name_problem(name, action, into)
            if not problem and (obstacle := target_problem(project, name)):
                problem = f"is refused: {obstacle}"
            if not problem and action == "write":
                problem = _staged_problem(journal.parent, name, digest)
            if problem:
                raise _not_ours(project, journal, action, name, problem)
    return entries


def _entries(document: object) -> Entries:
    """The journal's two tables; ValueError when the document is not a journal of this format."""
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ValueError("not a journal of this npu-wizard version")
    tables = []
    for key in ("write", "remove"):
        table = document.get(key)
        if not isinstance(table, dict) or not all(
            isinstance(name, str) and isinstance(digest, str) and _is_sha256(digest) for name, digest in table.items()
        ):
            raise ValueError(f"its {key!r} entry is not a table of names and SHA-256 digests")
        tables.append(dict(table))
    return Entries(*tables)


def _rendered_into(project: Path, writes: Iterable[str]) -> bool:
    """Whether the journal's files go into a folder rendered --into (the first such render writes its marker)."""
    return is_into(project) or INTO_MARKER in writes


def _name_problem(name: str, action: str, into: bool) -> str:
    """Why `name` is not a name an update writes or removes ("" when it is); `into`: a folder rendered --into."""
    if not name or "\0" in name:
        return "is not a file name"
    if name.startswith("/"):
        return "is an absolute path, outside the project"
    if any(part in ("", ".", "..") for part in name.split("/")):
        return "is not a plain relative path inside the project"
    if (name == STATE_DIR or name.startswith(STATE_DIR + "/")) and not (
        action == "write" and name in (PRISTINE, INTO_MARKER, REPOSITORY_MARKER)
    ):
        return "is npu-wizard's own state, which no update writes or removes"
    if name in (PRISTINE, INTO_MARKER, REPOSITORY_MARKER):
        return ""
    return generated.name_problem(name, into=into)


def _staged_problem(staging: Path, name: str, digest: str) -> str:
    """Why the staged file of `name` is not the one the journal names ("" when it is, or was moved in)."""
    if target_problem(staging, f"{FILES}/{name}"):
        return "is staged as something else than a plain file in a plain folder"
    staged = staging / FILES / name
    if os.path.lexists(staged) and _digest_of(staged, limit=JOURNAL_LIMIT * 16) != digest:
        return "has a staged file whose content is not what the journal says"
    return ""


def _not_ours(project: Path, journal: Path, action: str, name: str, problem: str) -> TargetError:
    shown = repr(name[:200] + "..." if len(name) > 200 else name)
    return TargetError(
        f"{project}: the journal of an interrupted update, {journal}, asks to {action} {shown}, which {problem}; "
        "npu-wizard finishes only an update or render it staged itself, so nothing was changed. "
        f"If you did not start one (a folder you received), delete {journal.parent}, then run npu-wizard again"
    )


def _damaged(project: Path, journal: Path, reason: str) -> TargetError:
    return TargetError(
        f"{project}: the journal of an interrupted update, {journal}, is damaged ({reason}), so whether that "
        f"update finished cannot be told; nothing was changed. Its new files are under {journal.parent / FILES}: "
        f"compare them with yours (diff -r {journal.parent / FILES} {project}), copy over what you want, then "
        f"delete {journal.parent} and run npu-wizard update again"
    )


def _fresh_staging(staging: Path) -> None:
    """Drop what an update killed before its commit left, and make the staging folder anew (0700, only ours).

    What cannot be removed (a folder of mode 0555 restored from a tarball, or another user's) is refused:
    staged files never go through anything the update did not make itself.
    """
    shutil.rmtree(staging, ignore_errors=True)
    try:
        os.mkdir(staging.parent, 0o700)  # .npu-wizard, gone with the pristine copy (update --rebase)
    except FileExistsError:
        pass  # _staging_folder refused it already when it is not a plain folder
    except OSError:
        pass  # the staging folder cannot be made either: refused below
    leftover = "it could not be removed"
    if not os.path.lexists(staging):
        try:
            os.mkdir(staging, 0o700)
            return
        except FileExistsError:
            leftover = "something made it again while the update was starting"
        except OSError as error:
            leftover = f"it cannot be made: {error.strerror}"
    raise TargetError(
        f"{staging}, where update stages its files, is left from an earlier update and {leftover}, so nothing "
        f"was changed: remove it yourself (check its permissions, e.g. chmod -R u+w, and chattr -i on it; it "
        "may belong to another user), then run update again"
    )


def _staged_folders(staging: Path, name: str) -> None:
    """Make the folders of staged file `name` under `staging`, refusing any that is a link or not a folder."""
    path = staging
    for part in name.split("/")[:-1]:
        path = path / part
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(path).st_mode):  # lstat: a link is refused, never followed
                raise TargetError(
                    f"{path} is not a folder the update made (a link, or a file, put there by someone else), so "
                    f"nothing was changed: remove {staging}, then run update again"
                ) from None
    if os.path.lexists(path / name.rsplit("/", 1)[-1]):
        raise TargetError(
            f"{path / name.rsplit('/', 1)[-1]} was already there in the fresh staging folder (put there by someone "
            f"else), so nothing was changed: remove {staging}, then run update again"
        )


def _write_file(path: Path, data: bytes, mode: int) -> None:
    """Create or truncate `path` (never through a link) with `data` and permission bits `mode`."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb", closefd=False) as stream:
            stream.write(data)
        os.fchmod(fd, mode)
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_folders(root: Path, names: Iterable[str]) -> None:
    """fsync the folder of each name and every folder above it up to `root`, deepest first."""
    folders = {root}
    for name in names:
        parts = name.split("/")[:-1]
        folders.update(root.joinpath(*parts[:depth]) for depth in range(1, len(parts) + 1))
    for folder in sorted(folders, key=lambda path: (-len(path.parts), path)):
        if folder.is_dir():
            _sync_folder(folder)


def _sync_folder(folder: Path) -> None:
    """Make the entries of `folder` (created, renamed, removed) durable."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _digest_of(path: Path, limit: int = REMOVE_LIMIT) -> str:
    """The SHA-256 of a regular file of at most `limit` bytes, never through a link ("" otherwise)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as stream:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return ""
        return _sha256(stream.read(limit + 1))


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _is_sha256(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def check_targets(project: Path, writes: Iterable[str], removes: Iterable[str]) -> None:
    """Refuse (TargetError, nothing changed) a file to write or remove that is not one a render writes (named by a
    pristine copy npu-wizard did not write), or that cannot be replaced by a plain file."""
    writes, removes = sorted(writes), sorted(removes)
    into = _rendered_into(project, writes)
    for action, names in (("write", writes), ("remove", removes)):
        for name in names:
            if problem := _name_problem(name, action, into):
                raise TargetError(
                    f"{project}: its pristine copy {PRISTINE} names {errors.shown(name)}, which {problem}; "
                    "npu-wizard did not write that copy (a folder you received?), so nothing was changed: "
                    f"npu-wizard update {project} --rebase records a new one"
                )
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
    name = errors.shown(name)  # as printed: a crafted name's control characters escaped
    for depth, part in enumerate(parts, start=1):
        path = path / part
        shown = errors.shown("/".join(parts[:depth]))
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
    return f"to {target[:200]!r}..." if len(target) > 200 else f"to {errors.shown(target)}"


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


def pause_for_test(point: str) -> None:
    """Where a test asked to stop at `point` (PAUSE_AT_ENV, with PAUSE_FILE_ENV): say so in that file, then wait.

    Until the test kills this process, or sends it Ctrl-C, SIGTERM or SIGHUP: that signal then reaches the
    handler in force as if it came now (at "after-first-carry" a block that defers signals only notes it and goes
    on). The signals are blocked from before the file is written, so one sent as soon as the test sees the file
    is never missed, in a process of one thread as the command line is (another thread could take it). A
    point the process passes again after such a signal (an interrupted update finishing its journal passes
    "after-first-move" again) stops it again: send those a SIGKILL.
    """
    flag = os.environ.get(PAUSE_FILE_ENV)
    if os.environ.get(PAUSE_AT_ENV) != point or not flag:
        return
    stops = {signal.SIGINT, *STOP_SIGNALS}
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    try:
        Path(flag).write_text(point)
        received = signal.sigwait(stops)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    signal.raise_signal(received)
