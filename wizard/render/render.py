"""Rendering is a function: answers in, a project folder out, nothing left on failure."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from wizard.answers.model import Answers, load_text, to_context
from wizard.answers.script import is_foreign
from wizard.answers.source import read_answers_text
from wizard.answers.spec import shorten
from wizard.errors import FILE, NO_VALUE, Problem, RenderError, TargetError, WizardError
from wizard.render.project import finish, walk_files
from wizard.render.replace import carried_paths, check_replaceable
from wizard.render.staging import make_staging, recover_leftovers, replace_project
from wizard.render.template_cache import PrivateBytecodeCache, template_cache
from wizard.render.templates import TEMPLATE_SETTINGS, project_template
from wizard.stopping import stop_signals_raise


@dataclass(frozen=True)
class RenderResult:
    """What a render wrote (or, for a dry run, would write)."""

    project_dir: Path
    files: tuple[str, ...]
    warnings: tuple[Problem, ...]
    replaced: bool
    readme: str = "README.md"  # what to read next, relative to project_dir


def render(
    answers: Answers, output_dir: Path, *, force: bool = False, dry_run: bool = False, clean: bool = False
) -> RenderResult:
    """Render the project for `answers` into `output_dir/<project_name>`; return what was written.

    With `force`, an existing project is replaced, keeping its checkpoints/, runs/ and data folder unless `clean`.
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
            files = walk_files(_generate(answers, Path(scratch), cache))
        return RenderResult(target, tuple(files), warnings, exists)
    if exists:
        check_replaceable(target)
    with stop_signals_raise():  # SIGTERM and SIGHUP clean up as Ctrl-C does
        files = _write(answers, output_dir, target, cache, replace=exists, clean=clean, created_output=created_output)
    return RenderResult(target, tuple(files), warnings, exists)


def _write(
    answers: Answers,
    output_dir: Path,
    target: Path,
    cache: PrivateBytecodeCache | None,
    *,
    replace: bool,
    clean: bool,
    created_output: bool,
) -> list[str]:
    """Render into a staging folder beside `target` and move the project into place; return its files."""
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        staging = make_staging(output_dir, answers["project_name"])
    except OSError as error:
        if created_output:
            shutil.rmtree(output_dir, ignore_errors=True)
        raise TargetError(f"cannot write in {output_dir}: {error.strerror or error}; choose another -o") from None
    try:
        project = _generate(answers, staging, cache)
        files = walk_files(project)
        if replace:
            carried = carried_paths(target, _made(files), _data_dirs(answers, target))
            replace_project(project, target, [] if clean else carried)
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
    return files


def _made(files: list[str]) -> set[str]:
    """Every file a render makes and every folder that holds one, as relative paths."""
    made = set(files)
    for name in files:
        made.update(parent.as_posix() for parent in Path(name).parents if parent != Path("."))
    return made


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
        raise TargetError(f"{target} already exists; use --force to replace it whole, or choose another -o")
    if target.exists():
        _refuse_into_folder(target)
    return target.exists()


def _refuse_into_folder(target: Path) -> None:
    """TargetError for a folder of the user's rendered --into: -o --force would replace their repository whole."""
    from wizard.render.into import is_into  # into renders through this module

    if is_into(target):
        raise TargetError(
            f"{target} was rendered with --into: it is your folder, and --force with -o would replace it whole; "
            f"to replace npu-wizard's files there (yours kept) use npu-wizard --answers FILE --into {target} "
            f"--force, or change its answers with npu-wizard update {target}"
        )


def _generate(answers: Answers, into: Path, cache: PrivateBytecodeCache | None) -> Path:
    from cookiecutter.generate import generate_files

    context = to_context(answers)
    # cookiecutter's `_jinja2_env_vars`: the compiled-template cache, where there is one.
    environment = {"_jinja2_env_vars": {"bytecode_cache": cache}} if cache else {}
    project = Path(
        generate_files(
            repo_dir=str(project_template()),
            context={"cookiecutter": {**context, **TEMPLATE_SETTINGS, **environment}},
            output_dir=str(into),
            accept_hooks=False,
        )
    )
    finish(project, context, answers)
    return project


def _data_dirs(answers: Answers, target: Path) -> list[tuple[str, str]]:
    """The data folders of the new answers and of the project being replaced (its answers.yaml, if readable)."""
    found = [(answers.get("training.data_dir"), "the new answers")]
    script = answers["training.script"]
    if is_foreign(script):  # the user's own code moves with the data: --force replaces only npu-wizard's files
        found.append((script.split("/", 1)[0], "the folder of your script training.script"))
    answers_file = target / "answers.yaml"
    if answers_file.exists():  # a file that cannot be read (a FIFO, not UTF-8, over 4 MiB) is refused, not skipped
        try:
            text = read_answers_text(str(answers_file), plain_file_only=True)
        except TargetError as error:
            raise TargetError(f"{error}; the project was left as it was") from None
        try:
            old = load_text(text)
            found.append((old.get("training.data_dir"), "the answers of the project replaced"))
        except WizardError:
            pass  # a project without valid answers keeps checkpoints/ and runs/ only
    return [(str(path), whose) for path, whose in found if path]
