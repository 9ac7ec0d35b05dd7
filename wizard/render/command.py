"""`npu-wizard --answers FILE`: render a project from an answers file (or stdin) and say what was written."""

from __future__ import annotations

from pathlib import Path

from wizard.answers.model import load_text
from wizard.answers.source import answers_base, print_warnings, read_answers_text
from wizard.errors import shown
from wizard.render.render import RenderResult, render
from wizard.render.replace import named


def render_from_file(
    source: str,
    output: Path | None,
    *,
    force: bool,
    dry_run: bool,
    clean: bool,
    into: Path | None = None,
    folder: str = "",
) -> None:
    """Render the answers in `source` ('-': stdin) into `output` (or add them to the folder `into`, or to its
    subfolder `folder`).

    With `dry_run`, list the files instead.
    """
    answers = load_text(read_answers_text(source), answers_base(source))
    if into is not None:
        from wizard.render.into import render_into

        result = render_into(answers, into, force=force, dry_run=dry_run, answers_file=source, subfolder=folder)
        _report(
            result,
            dry_run,
            ("would add {n} files to {dir}:", "would replace npu-wizard's files in {dir} with {n} files:"),
            (
                "added {n} files to {dir} (yours untouched)",
                "replaced npu-wizard's files in {dir} ({n} files; yours untouched)",
            ),
            "of your edited files npu-wizard no longer makes",
        )
        return
    result = render(answers, output or Path("."), force=force, dry_run=dry_run, clean=clean)
    _report(
        result,
        dry_run,
        ("would create {dir} with {n} files:", "would replace {dir} with {n} files:"),
        ("created {dir} ({n} files)", "replaced {dir} ({n} files)"),
    )


def _report(
    result: RenderResult,
    dry_run: bool,
    dry: tuple[str, str],
    done: tuple[str, str],
    kept_what: str = "paths of the old project",
) -> None:
    """Print the warnings and what was (or would be) written: (line when new, line when replaced), {n} {dir};
    then what was (or would be) kept, `kept_what`."""
    print_warnings(result.warnings)
    if dry_run:
        print(dry[result.replaced].format(n=len(result.files), dir=result.project_dir))
        for name in result.files:
            print(f"  {name}")
        if result.kept:
            print(f"would keep {len(result.kept)} {kept_what}:")
            for name in result.kept:
                print(f"  {shown(name)}")
        return
    print(done[result.replaced].format(n=len(result.files), dir=result.project_dir))
    if result.kept:
        print(f"kept {len(result.kept)} {kept_what}: {named(result.kept)}")
    print(f"next: read {result.project_dir / result.readme} for what to run on each node")
