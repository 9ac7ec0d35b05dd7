"""`npu-wizard update` writes only plain files inside the project, under a lock, durably, from its own journal."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.test_update import edit_answers, files_of, project_raw, render_project, update


def four_node_update_of_a_two_node_project(tmp_path: Path) -> Path:
    """A rendered 2-node project whose answers now ask for 4 nodes."""
    project = render_project(tmp_path / "projects", project_raw(2))
    edit_answers(project, nodes=4, network__host_ips=["127.0.0.1"] * 4)
    return project


# ---- targets that are not plain files ------------------------------------------------


def test_a_folder_where_update_must_write_a_node_script_is_refused_before_anything_changes(tmp_path: Path) -> None:
    project = four_node_update_of_a_two_node_project(tmp_path)
    (project / "launch" / "node2.sh").mkdir()
    (project / "launch" / "node2.sh" / "notes.txt").write_text("mine\n")
    before = files_of(project)

    for _ in range(2):  # and the next update says the same: nothing was left half done
        result = update(project)
        assert result.returncode == 1, result.stdout + result.stderr
        assert "Traceback" not in result.stderr
        refusal = f"npu-wizard: update cannot write 1 file(s) of {project}, so nothing was changed"
        assert result.stderr.startswith(refusal)
        assert "  - launch/node2.sh is a folder where update writes a file: move the folder away" in result.stderr
        assert files_of(project) == before
        assert not (project / ".npu-wizard" / "update").exists()


def test_a_file_where_update_needs_a_folder_is_refused(tmp_path: Path) -> None:
    project = four_node_update_of_a_two_node_project(tmp_path)
    shutil.rmtree(project / "launch")
    (project / "launch").write_text("the scripts live on the shared disk now\n")
    before = files_of(project)

    result = update(project, "--write-conflicts")

    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "  - launch/node2.sh: launch is a file where update needs a folder: move it away" in result.stderr
    assert files_of(project) == before
