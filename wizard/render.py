"""Rendering is a function: answers in, a project folder out, nothing left on failure."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from wizard.answers import Answers, load_text, to_context
from wizard.errors import FILE, NO_VALUE, Problem, RenderError, TargetError, WizardError
from wizard.project import finish, walk_files
from wizard.replace import carry_over, check_replaceable, give_back
from wizard.spec import shorten
from wizard.template_cache import PrivateBytecodeCache, template_cache
from wizard.templates import TEMPLATE_SETTINGS, project_template

# What the project that --force replaces is called in the staging folder until it is deleted.
REPLACED = ".replaced"


@dataclass(frozen=True)
class RenderResult:
    """What a render wrote (or, for a dry run, would write)."""

    project_dir: Path
    files: tuple[str, ...]
    warnings: tuple[Problem, ...]
    replaced: bool


def render(
    answers: Answers, output_dir: Path, *, force: bool = False, dry_run: bool = False, clean: bool = False
) -> RenderResult:
    """Render the project for `answers` into `output_dir/<project_name>`; return what was written.

    With `force`, an existing project is replaced, keeping its checkpoints/, runs/ and data folder unless `clean`.
    """
    output_dir = Path(output_dir)
    target = output_dir / answers["project_name"]
    _refuse_template_syntax(target.absolute())
    exists = _check_target(output_dir, target, force)
    created_output = not output_dir.exists() and not dry_run
    cache, cache_note = template_cache()
    warnings = (*answers.warnings, Problem(FILE, NO_VALUE, cache_note, "warning")) if cache_note else answers.warnings
    if dry_run:
        with tempfile.TemporaryDirectory(prefix="npu-wizard-") as scratch:
            files = walk_files(_generate(answers, Path(scratch), cache))
        return RenderResult(target, tuple(files), warnings, exists)
    if exists:
        check_replaceable(target)
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{answers['project_name']}.staging-", dir=output_dir))
    except OSError as error:
        if created_output:
            shutil.rmtree(output_dir, ignore_errors=True)
        raise TargetError(f"cannot write in {output_dir}: {error.strerror or error}; choose another -o") from None
    try:
        project = _generate(answers, staging, cache)
        files = walk_files(project)
        data_dirs = _data_dirs(answers, target) if exists else []
        _move_into_place(project, target, replace=exists, keep=not clean, data_dirs=data_dirs)
    except TargetError:
        raise
    except Exception as error:  # any failure: nothing may be left behind
        raise RenderError(f"rendering failed and nothing was written: {error}") from error
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if created_output and not target.exists():
            shutil.rmtree(output_dir, ignore_errors=True)
    return RenderResult(target, tuple(files), warnings, exists)


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
    return target.exists()


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


def _data_dirs(answers: Answers, target: Path) -> list[str]:
    """The data folders of the new answers and of the project being replaced (its answers.yaml, if readable)."""
    found = [answers.get("training.data_dir")]
    try:
        found.append(load_text((target / "answers.yaml").read_text()).get("training.data_dir"))
    except (OSError, UnicodeDecodeError, WizardError):
        pass  # a project without readable answers keeps checkpoints/ and runs/ only
    return [str(path) for path in found if path]


def _move_into_place(project: Path, target: Path, *, replace: bool, keep: bool, data_dirs: list[str]) -> None:
    if not replace:
        project.rename(target)
        return
    kept = carry_over(target, project, data_dirs) if keep else []
    # Beside the new project in the staging folder, under a name no project can have (a slug starts with a letter)
    retired = project.parent / REPLACED
    try:
        target.rename(retired)
    except OSError:
        give_back(project, target, kept)
        raise
    try:
        project.rename(target)
    except OSError:
        retired.rename(target)
        give_back(project, target, kept)
        raise
