"""`npu-wizard --answers FILE`: render a project from an answers file (or stdin) and say what was written."""

from __future__ import annotations

from pathlib import Path

from wizard.answers.model import load_text
from wizard.answers.source import answers_base, print_warnings, read_answers_text
from wizard.render.render import render


def render_from_file(source: str, output: Path, *, force: bool, dry_run: bool, clean: bool) -> None:
    """Render the answers in `source` ('-': stdin) into `output`; list the files instead with `dry_run`."""
    answers = load_text(read_answers_text(source), answers_base(source))
    result = render(answers, output, force=force, dry_run=dry_run, clean=clean)
    print_warnings(result.warnings)
    if dry_run:
        verb = "would replace" if result.replaced else "would create"
        print(f"{verb} {result.project_dir} with {len(result.files)} files:")
        for name in result.files:
            print(f"  {name}")
        return
    action = "replaced" if result.replaced else "created"
    print(f"{action} {result.project_dir} ({len(result.files)} files)")
    print(f"next: read {result.project_dir / 'README.md'} for what to run on each node")
