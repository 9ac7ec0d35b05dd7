"""Rendering into the user's own repository (`npu-wizard --answers A --into REPO`): npu-wizard's files beside theirs.

The project's files go into one folder of the repository, REPO/npu by default (`--folder NAME`), or, in the
older layout (`--folder .`), straight into REPO (not REPO/<project_name>). Its README
as NPU-WIZARD.md and its requirements as requirements-npu-wizard.txt, so the
user's README.md and requirements.txt stay theirs. A file of the user's is
never written, moved or deleted: every path the render would write that DIR
already holds, and npu-wizard did not generate there (the pristine copy names
what it did), is a clash, and a clash refuses the whole render before anything
is written. The files are written through the update journal (all or nothing).
`.npu-wizard/into` marks the folder, so `update` and `--force` know to touch
npu-wizard's own files only; `.npu-wizard/repository` names the folder inside the repository (`.` for the older
layout chosen with `--folder .`; a folder without it was rendered before `npu/` became the default).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import shutil
import stat
import tempfile
from collections.abc import Collection, Iterable
from pathlib import Path

from wizard.answers.model import Answers
from wizard.answers.questions_k8s import KUBERNETES_ENGINES
from wizard.answers.script import GENERATED_FILE, OWN_TRAIN_PY
from wizard.errors import FILE, NO_VALUE, Problem, TargetError, shown
from wizard.render import journal, pristine
from wizard.render.generated import RENAMED
from wizard.render.pristine import INTO_MARKER, PRISTINE, REPOSITORY_MARKER, STATE_DIR, is_into
from wizard.render.project_locks import UPDATE_LOCK, update_lock
from wizard.render.render import RenderResult, render, unedited
from wizard.render.replace import live_runs
from wizard.stopping import stop_signals_raise

README = RENAMED["README.md"]
DEFAULT_FOLDER = "npu"  # --into REPO without --folder: the project goes into REPO/npu
FLAT = "."  # --folder .: the older layout, npu-wizard's files straight into the repository's root
MARKER_TEXT = (
    "This folder is the user's; npu-wizard rendered its files into it (npu-wizard --into).\n"
    "npu-wizard update and --force change only the files npu-wizard generated (pristine.json.gz names them).\n"
)


def requirements_file(project: Path | None) -> str:
    """The name of the project's requirements file: renamed in a folder rendered --into."""
    return RENAMED["requirements.txt"] if project is not None and is_into(project) else "requirements.txt"


def rendered_files(answers: Answers, *, into: bool, repository_folder: str = "") -> pristine.Pristine:
    """The files a render of `answers` gives (npu-wizard's state excluded), named as `into` writes them;
    `repository_folder`: the project's folder inside a repository (pristine.repository_folder)."""
    with tempfile.TemporaryDirectory(prefix="npu-wizard-render-") as scratch:
        result = render(answers, Path(scratch), repository_folder=repository_folder)
        texts = pristine.snapshot(result.project_dir, list(result.files))
    if not into:
        return texts
    files = {RENAMED.get(name, name): text for name, text in texts.files.items()}
    # The README names the requirements file by its usual name; here it has another.
    requirements = RENAMED["requirements.txt"]
    files[README] = files[README].replace("`requirements.txt`", f"`{requirements}`")
    return pristine.Pristine(
        texts.generator,
        files,
        frozenset(RENAMED.get(name, name) for name in texts.executable),
    )


def clashes(folder: Path, names: Iterable[str], ours: Collection[str]) -> list[str]:
    """Each path of `names` that `folder` holds as the user's (not in `ours`), one line each: what is in the way."""
    found: dict[str, str] = {}
    for name in sorted(names):
        parts = name.split("/")
        for depth in range(1, len(parts) + 1):
            path = "/".join(parts[:depth])
            try:
                mode = os.lstat(folder / path).st_mode
            except FileNotFoundError:
                break
            last = depth == len(parts)
            if stat.S_ISLNK(mode):
                found[path] = f"{shown(path)} (a symbolic link: npu-wizard never writes through one)"
            elif not last and not stat.S_ISDIR(mode):
                found[path] = f"{shown(path)} (a file where npu-wizard needs the folder {shown(path)}/)"
            elif last and path not in ours:
                found[path] = f"{shown(path)}" + (" (a folder)" if stat.S_ISDIR(mode) else "")
            else:
                continue
            break
    return [found[path] for path in sorted(found)]


def refuse_clashes(folder: Path, lines: list[str], doing: str) -> None:
    """TargetError naming each clash, one per line, when there is any."""
    if not lines:
        return
    listed = "\n".join(f"  {line}" for line in lines)
    own_script = any(line.split(" (", 1)[0] == GENERATED_FILE for line in lines)
    raise TargetError(
        f"{folder} already has {len(lines)} path(s) npu-wizard would {doing}, and they are not npu-wizard's, "
        f"so nothing was written:\n{listed}\nnpu-wizard never overwrites a file it did not generate: move or "
        "rename those, then run it again" + (f"\n{OWN_TRAIN_PY}" if own_script else "")
    )


def check_folder(folder: Path) -> None:
    """TargetError unless `folder` (the --into folder) exists and is a folder."""
    if folder.is_symlink() and not folder.exists():
        raise TargetError(f"{folder} is a symlink to {os.readlink(folder)}, which does not exist; name a folder")
    if not folder.exists():
        raise TargetError(
            f"{folder} does not exist; --into adds npu-wizard's files to a folder you have (-o makes one)"
        )
    if not folder.is_dir():
        raise TargetError(f"{folder} is not a folder; --into names the folder of your repository")


def refuse_project_made_with_o(folder: Path, answers: Answers, answers_file: str) -> None:
    """TargetError, naming the commands that do work, for a project `-o` made: --into would have to take its
    README.md and requirements.txt (npu-wizard's there) for the user's."""
    if not _has_state(folder) or is_into(folder):
        return
    source = shlex.quote(answers_file) if answers_file != "-" else "FILE"
    ways = [
        f"change its answers with npu-wizard update {shlex.quote(str(folder))} --answers {source} (your edits kept)"
    ]
    place = folder if folder.name not in ("", ".", "..") else Path(os.path.abspath(folder))
    if place.name == answers["project_name"]:
        parent = shlex.quote(str(place.parent))
        ways.insert(
            0,
            f"render it again with npu-wizard --answers {source} -o {parent} --force (npu-wizard's files "
            "replaced, yours kept)",
        )
    raise TargetError(
        f"{folder} is a project npu-wizard rendered with -o, not a folder of yours rendered --into, so --into was "
        f"refused and nothing was changed: {', or '.join(ways)}"
    )


def render_into(
    answers: Answers,
    folder: Path,
    *,
    force: bool = False,
    dry_run: bool = False,
    answers_file: str = "FILE",
    subfolder: str = "",
) -> RenderResult:
    """Add the project of `answers` to `folder`; TargetError naming every clash, with nothing written.

    With `subfolder` (`--folder NAME`), `folder` is the repository and the project goes into `folder/subfolder`
    (made if missing): only that folder is checked for clashes, and the ranks start from the repository's root.
    Without it (or with FLAT, `--folder .`), the older layout: the files go straight into `folder`.

    With `force`, the files an earlier render wrote there are replaced (edits to them dropped); the user's stay,
    and so does each file the new render no longer makes that the user edited (the result's `kept`).
    `answers_file` names the answers in the commands a refusal suggests.
    """
    repository = Path(folder)
    check_folder(repository)
    subfolder = "" if subfolder == FLAT else subfolder
    if not subfolder:
        return _render(answers, repository, "", force=force, dry_run=dry_run, answers_file=answers_file)
    refuse_project_made_with_o(repository, answers, answers_file)  # not a folder of a project -o made
    folder = repository / subfolder
    made = not os.path.lexists(folder)
    folder = _project_folder(repository, subfolder, dry_run)
    try:
        result = _render(answers, folder, subfolder, force=force, dry_run=dry_run, answers_file=answers_file)
    except BaseException:
        if made and not dry_run:  # the folder this render made goes again when nothing was written into it
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    if is_into(repository) and not os.path.lexists(repository / REPOSITORY_MARKER):
        older = (
            f"{repository} also holds npu-wizard's files of the older layout, straight in its root: "
            f"npu-wizard update {shlex.quote(str(repository))} says how to remove them"
        )
        result = dataclasses.replace(result, warnings=(*result.warnings, Problem(FILE, NO_VALUE, older, "warning")))
    return result


def _render(
    answers: Answers, folder: Path, subfolder: str, *, force: bool, dry_run: bool, answers_file: str
) -> RenderResult:
    """render_into for the project's own folder `folder` (`subfolder` of its repository, "" for the older layout)."""
    refuse_project_made_with_o(folder, answers, answers_file)
    finished = _finish_interrupted(folder) if not dry_run else ""
    new = rendered_files(answers, into=True, repository_folder=subfolder)
    if subfolder:
        _refuse_too_large_for_a_configmap(answers, folder, subfolder, new)
    state = {PRISTINE: pristine.encode(new), INTO_MARKER: MARKER_TEXT, REPOSITORY_MARKER: (subfolder or FLAT) + "\n"}
    names = sorted([*new.files, *state])
    try:
        earlier, before, note = _check(folder, names, force)
    except TargetError as error:
        raise TargetError("; ".join([*filter(None, [finished]), str(error)])) from None
    notes = [text for text in (finished, note) if text]
    warnings = (*answers.warnings, *(Problem(FILE, NO_VALUE, text, "warning") for text in notes))
    if dry_run:
        return RenderResult(
            folder, tuple(names), warnings, earlier, README, tuple(_no_longer_made(folder, before, new)[1])
        )
    # One render or update of the folder at a time; what it holds is checked again under the lock.
    with update_lock(folder, f"npu-wizard --into {folder}{' --force' if force else ''}") as unlocked:
        earlier, before, note = _check(folder, names, force)
        if earlier:
            alive = live_runs(folder)
            if alive:
                raise TargetError(f"a run of {folder} is alive ({'; '.join(alive)}): stop it first, then render again")
        removes, kept = _no_longer_made(folder, before, new)
        writes: dict[str, str | bytes] = {**new.files, **state}
        _write(folder, writes, removes, new.executable, made_state=not earlier)
    if unlocked:  # a file system without flock: the render went ahead unlocked
        warnings = (*warnings, Problem(FILE, NO_VALUE, unlocked, "warning"))
    return RenderResult(folder, tuple(names), warnings, earlier, README, tuple(kept))


def _refuse_too_large_for_a_configmap(answers: Answers, folder: Path, subfolder: str, new: pristine.Pristine) -> None:
    """TargetError, nothing written, when a Kubernetes engine's pods cannot get the repository around `subfolder`
    and the project's new files in one ConfigMap (1 MiB): the error names the biggest files and the ways out."""
    if answers["cluster.engine"] not in KUBERNETES_ENGINES:
        return
    from wizard.render.k8s import check_repository_fits
    from wizard.render.k8s_code import ConfigMapError

    repository = Path(os.path.normpath(folder.joinpath(*[".."] * len(subfolder.split("/")))))
    try:
        check_repository_fits(repository, subfolder, answers, new.files)
    except ConfigMapError as error:
        raise TargetError(f"{error}; nothing was written") from None


def folder_problem(subfolder: str) -> str:
    """Why `subfolder` names no folder inside the repository ("" when it does; FLAT is the older layout)."""
    if subfolder == FLAT:
        return ""
    if subfolder.startswith("/") or any(part in ("", ".", "..") for part in subfolder.split("/")):
        return (
            f"--folder {shown(subfolder)}: name a folder inside the repository, e.g. --folder npu (no '..', no "
            "leading '/'; '.' for the older layout)"
        )
    return ""


def _project_folder(repository: Path, subfolder: str, dry_run: bool) -> Path:
    """`repository/subfolder`, made if missing (not on a dry run); TargetError for a name that leaves the
    repository or a path in the way."""
    problem = folder_problem(subfolder)
    if problem:
        raise TargetError(problem)
    folder = repository / subfolder
    in_the_way = clashes(repository, [subfolder + "/x"], ())
    if in_the_way:
        raise TargetError(f"--folder {shown(subfolder)}: {in_the_way[0]} is in the way; choose another --folder")
    if not dry_run:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise TargetError(f"cannot make {folder}: {error.strerror or error}; choose another --folder") from None
    return folder


def _no_longer_made(folder: Path, before: dict[str, str], new: pristine.Pristine) -> tuple[list[str], list[str]]:
    """The files of the earlier render (`before`) the new one no longer makes: those to remove, as npu-wizard
    wrote them, and those to keep, edited by the user (or no longer a regular file), so theirs now."""
    gone = sorted(name for name in set(before) - set(new.files) if os.path.lexists(folder / name))
    removes = [name for name in gone if unedited(folder / name, before[name])]
    return removes, [name for name in gone if name not in removes]


def _finish_interrupted(folder: Path) -> str:
    """Finish a render or update of `folder` killed after its commit; a note if so.

    The journal came with the folder: journal.roll_forward refuses it, changing nothing, unless each file it
    writes or removes is one a render writes.
    """
    if not journal.pending(folder):
        return ""
    with update_lock(folder, f"npu-wizard --into {folder}"):
        if not journal.pending(folder):
            return ""
        journal.roll_forward(folder)
    return f"finished the interrupted render or update of {folder} first"


def _check(folder: Path, names: list[str], force: bool) -> tuple[bool, dict[str, str], str]:
    """Whether `folder` holds an earlier render, the files it wrote (each as written), a note when they cannot be
    told; TargetError for an earlier render without `force` and for every clash."""
    earlier = _has_state(folder)
    if earlier and not force:
        raise TargetError(
            f"{folder} already holds npu-wizard's files ({STATE_DIR}/ is there): change them with "
            f"npu-wizard update {folder} (your edits kept), or render again with --force (npu-wizard's own files "
            "replaced, yours kept)"
        )
    before, note = _earlier_files(folder) if earlier else ({}, "")
    refuse_clashes(folder, clashes(folder, names, {*before, PRISTINE, INTO_MARKER, REPOSITORY_MARKER}), "write")
    return earlier, before, note


def _has_state(folder: Path) -> bool:
    """Whether `folder` holds npu-wizard's state from a render (a link or a file there is a clash).

    A lock and an uncommitted staging folder alone are what a render killed before its commit leaves.
    """
    state = folder / STATE_DIR
    if state.is_symlink() or not state.is_dir():
        return False
    try:
        return bool(set(os.listdir(state)) - {os.path.basename(UPDATE_LOCK), os.path.basename(journal.STAGING)})
    except OSError:
        return True


def _earlier_files(folder: Path) -> tuple[dict[str, str], str]:
    """The files an earlier render wrote into `folder`, each as written (its pristine copy), and a note when that
    copy is lost."""
    try:
        return dict(pristine.load(folder).files), ""
    except (OSError, ValueError) as error:
        return {}, (
            f"{PRISTINE} cannot be read ({error}), so npu-wizard cannot tell its files in {folder} from yours: "
            "each is named as a clash"
        )


def _write(
    folder: Path, writes: dict[str, str | bytes], removes: list[str], executable: frozenset[str], *, made_state: bool
) -> None:
    """Write through the journal; an interruption before its commit leaves `folder` as it was."""
    with stop_signals_raise():  # SIGTERM and SIGHUP clean up as Ctrl-C does
        try:
            journal.apply(folder, writes, removes, executable)
        except BaseException:
            if journal.pending(folder):  # committed: finish it, every file npu-wizard's
                journal.roll_forward(folder)
            elif made_state:
                shutil.rmtree(folder / STATE_DIR, ignore_errors=True)
            raise
