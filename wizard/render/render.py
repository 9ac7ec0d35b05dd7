"""Rendering is a function: answers in, a project folder out, nothing left on failure."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from wizard.answers.model import Answers, load_text, to_context
from wizard.answers.script import is_foreign
from wizard.answers.source import read_answers_text
from wizard.answers.spec import shorten
from wizard.errors import FILE, NO_VALUE, Problem, RenderError, TargetError, WizardError
from wizard.render import pristine
from wizard.render.project import finish, walk_files
from wizard.render.replace import (
    check_replaceable,
    is_under,
    named,
    refuse_overwrites,
    run_time_paths,
    users_paths,
    with_folders,
)
from wizard.render.staging import make_staging, recover_leftovers, replace_project
from wizard.render.template_cache import PrivateBytecodeCache, template_cache
from wizard.render.template_tree import render_tree
from wizard.render.templates import project_template
from wizard.stopping import stop_signals_raise


@dataclass(frozen=True)
class RenderResult:
    """What a render wrote (or, for a dry run, would write)."""

    project_dir: Path
    files: tuple[str, ...]
    warnings: tuple[Problem, ...]
    replaced: bool
    readme: str = "README.md"  # what to read next, relative to project_dir
    kept: tuple[str, ...] = ()  # what --force carried (or would carry) over from the project it replaced


def render(
    answers: Answers,
    output_dir: Path,
    *,
    force: bool = False,
    dry_run: bool = False,
    clean: bool = False,
    repository_folder: str = "",
) -> RenderResult:
    """Render the project for `answers` into `output_dir/<project_name>`; return what was written.

    With `force`, npu-wizard's files of an existing project are replaced: every other path in it (the
    user's files, its checkpoints/, runs/ and data folder) moves into the new one, the run-time folders
    not with `clean`. `repository_folder`: the project's folder inside a repository whose root its ranks start
    from (`--into REPO --folder NAME`).
    """
    output_dir = Path(output_dir)
    target = output_dir / answers["project_name"]
    _refuse_template_syntax(target.absolute())
    # Before the target is checked: a project set aside by a killed --force is put back first.
    notes = recover_leftovers(output_dir, answers["project_name"], restore=not dry_run)
    try:
        exists = _check_target(output_dir, target, force)
    except TargetError as error:
        raise TargetError("; ".join([*notes, str(error)])) from None
    created_output = not output_dir.exists() and not dry_run
    cache, cache_note = template_cache()
    warnings = (
        *answers.warnings,
        *(Problem(FILE, NO_VALUE, note, "warning") for note in [*notes, cache_note] if note),
    )
    if dry_run:
        with tempfile.TemporaryDirectory(prefix="npu-wizard-") as scratch:
            files = walk_files(_generate(answers, Path(scratch), cache, repository_folder))
        kept = _kept(answers, target, files, clean, cache) if exists else []
        return RenderResult(target, tuple(files), warnings, exists, kept=tuple(kept))
    if exists:
        check_replaceable(target)
    with stop_signals_raise():  # SIGTERM and SIGHUP clean up as Ctrl-C does
        files, kept = _write(
            answers,
            output_dir,
            target,
            cache,
            replace=exists,
            clean=clean,
            created_output=created_output,
            repository_folder=repository_folder,
        )
    return RenderResult(target, tuple(files), warnings, exists, kept=tuple(kept))


def _write(
    answers: Answers,
    output_dir: Path,
    target: Path,
    cache: PrivateBytecodeCache | None,
    *,
    replace: bool,
    clean: bool,
    created_output: bool,
    repository_folder: str = "",
) -> tuple[list[str], list[str]]:
    """Render into a staging folder beside `target` and move the project into place; its files, what it kept."""
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        staging = make_staging(output_dir, answers["project_name"])
    except OSError as error:
        if created_output:
            shutil.rmtree(output_dir, ignore_errors=True)
        raise TargetError(f"cannot write in {output_dir}: {error.strerror or error}; choose another -o") from None
    try:
        project = _generate(answers, staging, cache, repository_folder)
        files = walk_files(project)
        kept: list[str] = []
        if replace:
            kept = _kept(answers, target, files, clean, cache)
            replace_project(project, target, kept)
        else:
            project.rename(target)
    except TargetError:
        raise
    except Exception as error:  # any failure: nothing may be left behind
        raise RenderError(f"rendering failed and nothing was written: {error}") from error
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if created_output and not target.exists():
            shutil.rmtree(output_dir, ignore_errors=True)
    return files, kept


def _refuse_template_syntax(target: Path) -> None:
    """cookiecutter renders the output path itself as a template: `{{ ... }}` there would run."""
    for opening in ("{{", "{%", "{#"):
        if opening in str(target):
            raise TargetError(
                f"{shorten(str(target))}: a path with '{opening}' cannot be rendered into; use another -o"
            )


def _check_target(output_dir: Path, target: Path, force: bool) -> bool:
    if output_dir.is_symlink() and not output_dir.exists():
        raise TargetError(f"{output_dir} is a symlink to {os.readlink(output_dir)}, which does not exist")
    if output_dir.exists() and not output_dir.is_dir():
        raise TargetError(f"{output_dir} is not a folder; name a folder with -o")
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise TargetError(f"{target} exists and is not a folder; remove it or choose another -o")
    if target.exists() and not force:
        raise TargetError(
            f"{target} already exists; use --force to render it again (npu-wizard's files replaced, yours kept), "
            "or choose another -o"
        )
    if target.exists():
        _refuse_into_folder(target)
    return target.exists()


def _refuse_into_folder(target: Path) -> None:
    """TargetError for a folder of the user's rendered --into: -o --force would replace their repository whole."""
    if pristine.is_into(target):
        raise TargetError(
            f"{target} was rendered with --into: it is your folder, not a project -o made, so -o --force is refused; "
            f"to replace npu-wizard's files there (yours kept) use npu-wizard --answers FILE --into {target} "
            f"--force, or change its answers with npu-wizard update {target}"
        )


def _generate(answers: Answers, into: Path, cache: PrivateBytecodeCache | None, repository_folder: str = "") -> Path:
    context = to_context(answers)
    if repository_folder:  # not an answer: where the project sits, known to --into and update only
        context["repository_folder"] = repository_folder
    project = render_tree(project_template(), context, into, cache)  # as cookiecutter would, without cookiecutter
    finish(project, context, answers)
    return project


def _kept(
    answers: Answers, target: Path, files: list[str], clean: bool, cache: PrivateBytecodeCache | None
) -> list[str]:
    """What --force carries from the project `target` into the render of `answers` (`files`).

    Every path the earlier render did not write (or wrote, and the user
    edited, where the new render does not write it); with `clean`, not its
    checkpoints/, runs/ and data folder. TargetError, nothing changed, where
    that would lose a file of the user's: one the new render writes, a script
    in a data folder --clean deletes, or any file not npu-wizard's in a
    project without a record of what npu-wizard wrote there.
    """
    old = _old_answers(target)
    made = with_folders(files)
    run_time = run_time_paths(target, made, _data_dirs(answers, old))
    dropped = run_time if clean else []
    _refuse_dropping_scripts(target, dropped, answers, old)
    written, why = _written_before(target, set(files))
    if written is None:  # an older npu-wizard's project, or not one at all
        kept = users_paths(target, _files_of(old, cache) if old else set(files), made, dropped)
        _refuse_strays(target, [path for path in kept if not any(is_under(path, gone) for gone in run_time)], why)
    else:
        kept = users_paths(target, written, made, dropped)
    refuse_overwrites(target, kept, set(files), made)
    return kept


def _written_before(target: Path, files: set[str]) -> tuple[set[str] | None, str]:
    """The files the earlier render of the project `target` wrote (its pristine copy) that --force replaces or
    drops: those the new render (`files`) writes, and the others as npu-wizard wrote them (an edited one is the
    user's, as `update` keeps it); None and why where there is no record.
    """
    try:
        texts = pristine.load(target).files
    except FileNotFoundError:
        return None, "missing"
    except (OSError, ValueError) as error:
        return None, str(error)
    return {name for name, text in texts.items() if name in files or unedited(target / name, text)}, ""


def unedited(path: Path, text: str) -> bool:
    """Whether `path` is a regular file holding `text` as npu-wizard wrote it (a link, a FIFO or a folder is not).

    Only a regular file is ever read: opening a FIFO would wait for a writer forever.
    """
    data = text.encode("utf-8")
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as stream:
            info = os.fstat(fd)  # what was opened, should the path have changed since the lstat
            return stat.S_ISREG(info.st_mode) and info.st_size == len(data) and stream.read(len(data) + 1) == data
    except OSError:
        return False


def _refuse_strays(target: Path, strays: list[str], why: str) -> None:
    """TargetError naming what a project without a record of npu-wizard's files holds besides them."""
    if not strays:
        return
    if not (target / "answers.yaml").exists():
        raise TargetError(
            f"{target} is not an npu-wizard project (no answers.yaml) and holds {len(strays)} path(s) a render "
            f"would not make: {named(strays)}; --force never deletes them: choose another -o or project_name; "
            "nothing was changed"
        )
    raise TargetError(
        f"{target} has no record of the files npu-wizard generated there ({pristine.PRISTINE}: {why}), "
        f"and it holds {len(strays)} path(s) a render would not make: {named(strays)}; --force would "
        f"delete them: move them out of the project (delete those an older npu-wizard made), or keep them "
        f"with npu-wizard update {target} --rebase (it records what npu-wizard wrote), then render again; "
        "nothing was changed"
    )


def _files_of(answers: Answers, cache: PrivateBytecodeCache | None) -> set[str]:
    """The files a render of `answers` makes."""
    with tempfile.TemporaryDirectory(prefix="npu-wizard-") as scratch:
        return set(walk_files(_generate(answers, Path(scratch), cache)))


def _refuse_dropping_scripts(target: Path, dropped: list[str], answers: Answers, old: Answers | None) -> None:
    """TargetError where --clean would delete the user's training script with a data folder that holds it."""
    for script in {source["training.script"] for source in (answers, old) if source is not None}:
        if not is_foreign(script) or not os.path.lexists(target / script):
            continue
        for gone in dropped:
            if is_under(script, gone):
                raise TargetError(
                    f"training.script {script} lies in {gone}, the data folder --clean deletes: --clean never "
                    "deletes your code; render with --force alone, or move the data into a folder of its own and "
                    "set training.data_dir to it; nothing was changed"
                )


def _old_answers(target: Path) -> Answers | None:
    """The answers of the project `target` (its answers.yaml), None where they do not load."""
    answers_file = target / "answers.yaml"
    if not answers_file.exists():
        return None
    try:  # a file that cannot be read (a FIFO, not UTF-8, over 4 MiB) is refused, not skipped
        text = read_answers_text(str(answers_file), plain_file_only=True)
    except TargetError as error:
        raise TargetError(f"{error}; the project was left as it was") from None
    try:
        return load_text(text)
    except WizardError:
        return None  # its data folder is not known: only what it holds besides npu-wizard's files is kept


def _data_dirs(answers: Answers, old: Answers | None) -> list[tuple[str, str]]:
    """The data folders of the new answers and of the project being replaced."""
    found = [(answers.get("training.data_dir"), "the new answers")]
    if old is not None:
        found.append((old.get("training.data_dir"), "the answers of the project replaced"))
    return [(str(path), whose) for path, whose in found if path]
