"""What the review page shows before anything is written: files, the launch script, the sysctl line."""

from __future__ import annotations

import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from wizard.answers.model import Answers, to_context

SYSCTL_TEMPLATE = Path("sysctl") / "reserve-ports.conf"
SBATCH_TEMPLATE = Path("slurm") / "job.sbatch"
# cookiecutter changes the working directory while it renders: one render at a time.
RENDER_LOCK = threading.Lock()


@dataclass(frozen=True)
class Preview:
    """The files a render would write and the texts worth reading first."""

    target: Path
    exists: bool
    files: tuple[str, ...]
    launch_script: str
    sysctl_snippet: str
    sbatch: str | None = None
    """slurm/job.sbatch, for a Slurm project."""


def build_preview(answers: Answers, output_dir: Path) -> Preview:
    """Dry-run the very render `--answers` uses, and render the shared launch script and the sysctl snippet."""
    from wizard.render.project import SHARED_SCRIPT
    from wizard.render.render import render
    from wizard.render.shellquote import template_environment
    from wizard.render.templates import project_template

    target = output_dir / answers["project_name"]
    exists = target.is_dir() and not target.is_symlink()
    with tempfile.TemporaryDirectory(prefix="npu-wizard-preview-") as scratch:
        # Over an existing project the files are the same; what replacing it keeps, or why it is refused,
        # is for the render after asking (and an --edit updates it instead).
        result = render(answers, Path(scratch) if exists else output_dir, force=True, dry_run=True)
    context = to_context(answers)
    folder = project_template() / "{{cookiecutter.project_name}}"
    environment = template_environment()
    launch = environment.from_string((folder / SHARED_SCRIPT).read_text(encoding="utf-8"))
    sysctl = environment.from_string((folder / SYSCTL_TEMPLATE).read_text(encoding="utf-8"))
    sbatch = None
    if answers["cluster.engine"] == "slurm":
        sbatch = environment.from_string((folder / SBATCH_TEMPLATE).read_text(encoding="utf-8")).render(
            cookiecutter=context
        )
    return Preview(
        target=target,
        exists=exists,
        files=result.files,
        launch_script=launch.render(cookiecutter=context),
        sysctl_snippet=sysctl.render(cookiecutter=context),
        sbatch=sbatch,
    )


def file_tree(root: str, files: tuple[str, ...]) -> str:
    """The files as an indented tree, folders before their files."""
    lines = [f"{root}/"]
    shown: set[str] = set()
    for name in sorted(files, key=lambda f: (f.count("/") == 0, f)):
        parts = name.split("/")
        for depth in range(1, len(parts)):
            folder = "/".join(parts[:depth])
            if folder not in shown:
                shown.add(folder)
                lines.append("  " * depth + parts[depth - 1] + "/")
        lines.append("  " * len(parts) + parts[-1])
    return "\n".join(lines)
