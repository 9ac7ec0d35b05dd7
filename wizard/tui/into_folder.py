"""Into a repository from the wizard: the project's folder inside it (as --into REPO --folder NAME), shown and
changed on the review page; --edit of a project rendered --into finds its repository and folder again."""

from __future__ import annotations

from pathlib import Path

from wizard.render.into import FLAT, folder_problem
from wizard.render.pristine import repository_folder, repository_root


def into_target(repository: Path, folder: str) -> Path:
    """The folder a render into `repository` writes: its `folder`, or the repository itself for the older layout."""
    folder = folder.strip()
    return repository if folder == FLAT else repository / folder


def problem_of(folder: str) -> str:
    """Why `folder` (as typed on the review page) names no folder inside the repository; "" when it does."""
    folder = folder.strip()
    folder = folder.rstrip("/") or folder  # npu/ is npu, as --folder takes it ("/" alone stays refused)
    if not folder:
        return "name the project's folder inside the repository (npu by default; '.' for the older layout)"
    return folder_problem(folder).replace("--folder ", "the folder ", 1)


def where_rendered(project: Path) -> tuple[Path, str]:
    """The repository and the folder a project rendered --into lies in (FLAT: straight in the repository)."""
    return repository_root(project), repository_folder(project) or FLAT
