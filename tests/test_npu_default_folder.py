"""`--into REPO` puts the project into REPO/npu unless --folder names another; `--folder .` is the older layout."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_one_folder import answers_file, foreign_repository, git, npu_wizard


def test_into_without_folder_puts_the_project_into_npu(tmp_path: Path) -> None:
    repo = foreign_repository(tmp_path)

    result = npu_wizard("--answers", str(answers_file(tmp_path)), "--into", str(repo))

    assert result.returncode == 0, result.stderr
    assert "added " in result.stdout and f"files to {repo / 'npu'}" in result.stdout
    assert git(repo, "status", "--porcelain") == "?? npu/\n"
    assert (repo / "npu" / ".npu-wizard" / "repository").read_text() == "npu\n"
    assert "program=(npu/runtime/start_userscript.py train.py)" in (repo / "npu" / "launch" / "run-node.sh").read_text()


def test_folder_dot_is_the_older_layout_and_records_that_it_was_chosen(tmp_path: Path) -> None:
    repo = tmp_path / "plain-repo"  # without the foreign repository's runtime/ and answers.yaml, which clash here
    repo.mkdir()
    (repo / "train.py").write_text("print('mine')\n")
    git(repo, "init", "-q")

    result = npu_wizard("--answers", str(answers_file(tmp_path)), "--into", str(repo), "--folder", "./")

    assert result.returncode == 0, result.stderr
    assert (repo / "NPU-WIZARD.md").is_file() and (repo / "launch" / "run-node.sh").is_file()
    assert not (repo / "npu").exists()
    assert (repo / ".npu-wizard" / "repository").read_text() == ".\n"
    assert 'cd "$REPOSITORY_DIR"' not in (repo / "launch" / "run-node.sh").read_text()


def test_an_empty_folder_name_is_refused(tmp_path: Path) -> None:
    repo = foreign_repository(tmp_path)

    result = npu_wizard("--answers", str(answers_file(tmp_path)), "--into", str(repo), "--folder", "")

    assert result.returncode == 2 and "--folder needs a folder name inside the repository" in result.stderr
    assert git(repo, "status", "--porcelain") == ""


def test_into_a_project_made_with_o_is_refused_with_the_default_folder_too(tmp_path: Path) -> None:
    answers = answers_file(tmp_path)
    assert npu_wizard("--answers", str(answers), "-o", str(tmp_path / "out")).returncode == 0
    project = tmp_path / "out" / "their-gpt"
    before = sorted(path.name for path in project.iterdir())

    result = npu_wizard("--answers", str(answers), "--into", str(project))

    assert result.returncode == 1, result.stdout + result.stderr
    assert f"{project} is a project npu-wizard rendered with -o, not a folder of yours" in result.stderr
    assert sorted(path.name for path in project.iterdir()) == before


@pytest.mark.parametrize("marker", ["a/b/c", "../outside", "/etc", "npu/../..", ""])
def test_a_repository_marker_that_does_not_name_the_projects_own_folder_is_not_followed(
    tmp_path: Path, marker: str
) -> None:
    from wizard.render.repository import repository_folder, repository_root

    project = tmp_path / "home" / "repo" / "npu"
    (project / ".npu-wizard").mkdir(parents=True)
    (project / ".npu-wizard" / "repository").write_text("npu\n")
    assert (repository_folder(project), repository_root(project)) == ("npu", tmp_path / "home" / "repo")
    # edited by hand or cloned into another layout: the ssh copy and the k8s ConfigMap would carry the folders
    # above the repository (home/, /) if it were followed
    (project / ".npu-wizard" / "repository").write_text(marker + "\n")
    assert (repository_folder(project), repository_root(project)) == ("", project)
