"""A journal found in a folder finishes only what npu-wizard renders: never .git, a hidden path or the user's files.

A folder may arrive with a crafted `.npu-wizard/update/` (a tarball, an rsync
copy, a shared folder), digests included: `--into` and `update` refuse it,
naming the entry, and change nothing.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.matrix import CASES, case_answers
from tests.test_render_into import USER_FILES, answers_file, git, npu_wizard, tree_hash, user_repo
from tests.test_update import files_of, project_raw, render_project, update
from tests.test_update_journal import plant_journal, sha256
from wizard.render import generated
from wizard.render.into import rendered_files
from wizard.render.pristine import PRISTINE, Pristine, encode, load

HOOK = b"#!/bin/sh\necho planted > planted-by-the-hook\n"


def plant_hook_journal(folder: Path, name: str = ".git/hooks/post-commit") -> Path:
    """The reviewer's crafted journal: write `name` (an executable hook) with a matching SHA-256."""
    staging = plant_journal(folder, {"format": 2, "write": {name: sha256(HOOK)}, "remove": {}}, {name: HOOK})
    (staging / "files" / name).chmod(0o755)
    return staging


def test_a_crafted_journal_in_a_folder_rendered_into_never_plants_a_git_hook(tmp_path: Path) -> None:
    repo = user_repo(tmp_path, USER_FILES)
    answers = answers_file(tmp_path)
    assert npu_wizard("--answers", str(answers), "--into", str(repo), "--folder", ".").returncode == 0
    staging = plant_hook_journal(repo)
    before = tree_hash(repo, lock_taken=True)

    result = npu_wizard("--answers", str(answers), "--into", str(repo), "--folder", ".")

    assert result.returncode == 1, result.stdout + result.stderr
    assert "finished the interrupted" not in result.stdout + result.stderr
    assert "asks to write '.git/hooks/post-commit', which is inside git's own files" in result.stderr
    assert f"delete {staging}" in result.stderr and "nothing was changed" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert tree_hash(repo, lock_taken=True) == before
    assert not (repo / ".git" / "hooks" / "post-commit").exists()
    git(repo, "commit", "-q", "--allow-empty", "-m", "after the render")
    assert not (repo / "planted-by-the-hook").exists()


def test_a_crafted_journal_in_a_project_never_plants_a_git_hook_on_update(tmp_path: Path) -> None:
    project = render_project(tmp_path / "projects", project_raw(2))
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    staging = plant_hook_journal(project)
    before = files_of(project)

    result = update(project)

    assert result.returncode == 1, result.stdout + result.stderr
    assert "asks to write '.git/hooks/post-commit', which is inside git's own files" in result.stderr
    assert f"delete {staging}" in result.stderr
    assert files_of(project) == before
    assert not (project / ".git" / "hooks" / "post-commit").exists()


# A name no render writes, and what the refusal says of it; each with a digest that matches.
REFUSED = {
    "hidden": ("write", ".github/workflows/ci.yml", "is a hidden path (.github): npu-wizard generates none"),
    "gitattributes": ("write", ".gitattributes", "is a hidden path (.gitattributes)"),
    "git-config": ("remove", ".git/config", "is inside git's own files: npu-wizard never writes there"),
    "users-code": ("write", "src/model.py", "is not a file npu-wizard generates"),
    "users-code-removed": ("remove", "src/model.py", "is not a file npu-wizard generates"),
    "users-readme": ("write", "README.md", "is the folder's own README.md (npu-wizard's is NPU-WIZARD.md"),
    "users-requirements": ("remove", "requirements.txt", "is the folder's own requirements.txt"),
    "state": ("write", ".npu-wizard/update.lock", "is npu-wizard's own state"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_a_journal_naming_a_file_no_render_writes_is_refused_in_a_folder_rendered_into(
    tmp_path: Path, case: str
) -> None:
    action, name, problem = REFUSED[case]
    repo = user_repo(tmp_path, USER_FILES)
    answers = answers_file(tmp_path)
    assert npu_wizard("--answers", str(answers), "--into", str(repo), "--folder", ".").returncode == 0
    target = repo / name
    if action == "write":
        plant_journal(repo, {"format": 2, "write": {name: sha256(HOOK)}, "remove": {}}, {name: HOOK})
    else:
        digest = sha256(target.read_bytes())
        plant_journal(repo, {"format": 2, "write": {}, "remove": {name: digest}}, {})
    before = tree_hash(repo, lock_taken=True)

    result = npu_wizard("--answers", str(answers), "--into", str(repo), "--folder", ".", "--force")

    assert result.returncode == 1, result.stdout + result.stderr
    assert f"asks to {action} {name!r}, which {problem}" in result.stderr
    assert tree_hash(repo, lock_taken=True) == before


def test_a_pristine_copy_naming_a_hidden_path_is_damaged_and_update_removes_nothing(tmp_path: Path) -> None:
    project = render_project(tmp_path / "projects", project_raw(2))
    (project / ".bashrc").write_text("export PATH=/mine\n")
    kept = load(project)
    files = {**kept.files, ".bashrc": "export PATH=/mine\n"}
    (project / PRISTINE).write_bytes(encode(Pristine(kept.generator, files, kept.executable)))
    before = files_of(project)

    result = update(project)

    assert result.returncode == 1, result.stdout + result.stderr
    assert f"{PRISTINE} is damaged ('.bashrc' is a hidden path (.bashrc): npu-wizard generates none)" in result.stderr
    assert files_of(project) == before


@pytest.mark.parametrize("command", ["update", "force"])
def test_a_pristine_copy_naming_the_users_readme_in_a_folder_rendered_into_never_removes_it(
    tmp_path: Path, command: str
) -> None:
    repo = user_repo(tmp_path, USER_FILES)
    answers = answers_file(tmp_path)
    assert npu_wizard("--answers", str(answers), "--into", str(repo), "--folder", ".").returncode == 0
    kept = load(repo)
    files = {**kept.files, "README.md": USER_FILES["README.md"]}  # the user's README, bytes and all
    (repo / PRISTINE).write_bytes(encode(Pristine(kept.generator, files, kept.executable)))
    before = tree_hash(repo, lock_taken=True)

    if command == "update":
        result = update(repo)
    else:
        result = npu_wizard("--answers", str(answers), "--into", str(repo), "--folder", ".", "--force")

    assert result.returncode == 1, result.stdout + result.stderr
    assert f"its pristine copy {PRISTINE} names README.md, which is the folder's own README.md" in result.stderr
    assert f"npu-wizard update {repo} --rebase records a new one" in result.stderr
    assert tree_hash(repo, lock_taken=True) == before


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_file_a_render_writes_is_a_name_the_journal_accepts(case: str) -> None:
    for into in (False, True):
        names = rendered_files(case_answers(case), into=into).files
        assert {name: generated.name_problem(name, into=into) for name in names} == dict.fromkeys(names, "")
