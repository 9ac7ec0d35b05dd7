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


def test_write_conflicts_never_writes_through_a_linked_folder_out_of_the_project(tmp_path: Path) -> None:
    project = four_node_update_of_a_two_node_project(tmp_path)
    edit_answers(project, launcher="shell")  # changes launch/run-node.sh
    elsewhere = tmp_path / "elsewhere"
    (project / "launch").rename(elsewhere)
    (project / "launch").symlink_to(elsewhere)
    with (elsewhere / "run-node.sh").open("a") as script:
        script.write("# my edit, on the shared disk\n")
    outside, before = files_of(elsewhere), files_of(project)

    result = update(project, "--write-conflicts")

    assert result.returncode == 1
    assert "written with <<<<<<< markers" not in result.stderr
    assert (
        f"  - launch/run-node.sh: launch is a symbolic link (to {elsewhere}) and update never writes through a link"
        in result.stderr
    )
    assert files_of(elsewhere) == outside
    assert files_of(project) == before and (project / "launch").is_symlink()


def test_a_node_script_replaced_by_a_link_is_reported_and_stays_a_link(tmp_path: Path) -> None:
    project = four_node_update_of_a_two_node_project(tmp_path)
    shared = tmp_path / "shared-node0.sh"
    shared.write_bytes((project / "launch" / "node0.sh").read_bytes())
    (project / "launch" / "node0.sh").unlink()
    (project / "launch" / "node0.sh").symlink_to(shared)
    before = shared.read_bytes()

    result = update(project)

    assert result.returncode == 1
    assert f"  - launch/node0.sh is a symbolic link (to {shared}) and update neither writes" in result.stderr
    assert (project / "launch" / "node0.sh").is_symlink() and shared.read_bytes() == before
    assert not (project / "launch" / "node2.sh").exists()


def test_a_staging_folder_that_is_a_link_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    project = four_node_update_of_a_two_node_project(tmp_path)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine\n")
    (project / ".npu-wizard" / "update").symlink_to(victim)
    before = files_of(project)

    result = update(project)

    assert result.returncode == 1
    assert f"{project / '.npu-wizard' / 'update'} is a symbolic link" in result.stderr
    assert files_of(victim) == {"keep.txt": (b"mine\n", 0o644)}
    assert files_of(project) == before
