"""`npu-wizard update` writes only plain files inside the project, under a lock, durably, from its own journal."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_update import (
    edit_answers,
    files_of,
    kill,
    project_raw,
    render_project,
    start_paused_update,
    update,
)
from wizard.render.pristine import Pristine, encode, load


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


def test_a_staging_folder_update_cannot_remove_is_refused_and_its_link_never_followed(tmp_path: Path) -> None:
    # chattr +i stands in for a 0555 folder from a tarball, or another user's, that a non-root update cannot empty.
    project = four_node_update_of_a_two_node_project(tmp_path)
    staging = project / ".npu-wizard" / "update"
    staging.mkdir()
    (staging / "files").symlink_to("../../..")  # the folder holding the project
    outside = tmp_path / "projects"
    before, around = files_of(project), files_of(outside, skip=(project.name + "/",))
    locked = subprocess.run(["chattr", "+i", str(staging)], capture_output=True, text=True)
    if locked.returncode != 0:
        pytest.skip(f"chattr +i is not supported on {tmp_path}: {locked.stderr.strip()}")
    try:
        result = update(project)
    finally:
        subprocess.run(["chattr", "-i", str(staging)], check=True)

    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert f"{staging}, where update stages its files, is left from an earlier update and it could not be removed" in (
        result.stderr
    )
    assert "then run update again" in result.stderr
    assert files_of(outside, skip=(project.name + "/",)) == around  # no README.md, train.py, launch/ beside it
    assert files_of(project) == before


# ---- a journal the update did not write ------------------------------------------------


def plant_journal(project: Path, document: object, staged: dict[str, bytes]) -> Path:
    """Write `document` as the project's update journal and `staged` files beside it, as a crafted project would."""
    staging = project / ".npu-wizard" / "update"
    for name, data in staged.items():
        path = Path(os.path.normpath(staging / "files" / name))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    staging.mkdir(parents=True, exist_ok=True)
    (staging / "journal.json").write_text(json.dumps(document))
    return staging


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


PLANTED = b"#!/bin/sh\necho planted\n"


@pytest.mark.parametrize("form", ["names", "digests", "absolute"])
def test_a_journal_naming_files_outside_the_project_is_refused_and_nothing_changes(tmp_path: Path, form: str) -> None:
    project = render_project(tmp_path / "projects", project_raw(2))
    victim = tmp_path / "victim.txt"  # two levels above the project
    victim.write_text("someone's file\n")
    removed = "../../victim.txt" if form != "absolute" else str(victim)
    written = "../../planted.sh" if form != "absolute" else str(tmp_path / "planted.sh")
    if form == "names":  # the journal as npu-wizard wrote it before
        document: object = {"write": [written], "remove": [removed]}
    else:
        document = {"format": 2, "write": {written: sha256(PLANTED)}, "remove": {removed: sha256(victim.read_bytes())}}
    staging = plant_journal(project, document, {written: PLANTED} if form != "absolute" else {})
    if form == "absolute":
        (tmp_path / "planted.sh").write_bytes(PLANTED)
    before, around = files_of(project), files_of(tmp_path, skip=("projects/",))

    result = update(project)

    assert result.returncode == 1, result.stdout + result.stderr
    assert "finished the interrupted update" not in result.stdout
    assert "nothing was changed" in result.stderr and f"delete {staging}" in result.stderr
    if form == "names":
        assert "is damaged (not a journal of this npu-wizard version)" in result.stderr
    else:
        which = "an absolute path, outside" if form == "absolute" else "not a plain relative path inside"
        assert f"asks to write {written!r}, which is {which} the project" in result.stderr
    assert victim.read_text() == "someone's file\n"
    assert files_of(project) == before and files_of(tmp_path, skip=("projects/",)) == around


def test_a_journal_writing_through_a_linked_folder_is_refused(tmp_path: Path) -> None:
    project = render_project(tmp_path / "projects", project_raw(2))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.rmtree(project / "sysctl")
    (project / "sysctl").symlink_to(elsewhere)
    name = "sysctl/reserve-ports.sh"
    plant_journal(project, {"format": 2, "write": {name: sha256(PLANTED)}, "remove": {}}, {name: PLANTED})

    result = update(project)

    assert result.returncode == 1
    assert f"asks to write '{name}', which is refused: {name}: sysctl is a symbolic link" in result.stderr
    assert list(elsewhere.iterdir()) == []


def test_a_staged_file_unlike_its_journal_entry_is_refused(tmp_path: Path) -> None:
    project = render_project(tmp_path / "projects", project_raw(2))
    before = files_of(project)
    document = {"format": 2, "write": {"train.py": sha256(b"print('the update')\n")}, "remove": {}}
    plant_journal(project, document, {"train.py": b"import os; os.system('id')\n"})

    result = update(project)

    assert result.returncode == 1
    assert "asks to write 'train.py', which has a staged file whose content is not what the journal says" in (
        result.stderr
    )
    assert files_of(project, skip=(".npu-wizard/update/",)) == before


def test_a_journal_removes_only_files_still_holding_the_bytes_the_update_saw(tmp_path: Path) -> None:
    project = render_project(tmp_path / "projects", project_raw(2))
    (project / "launch" / "node1.sh").write_bytes(b"my own node script\n")
    unedited = (project / "sysctl" / "README.md").read_bytes()
    document = {
        "format": 2,
        "write": {},
        "remove": {"launch/node1.sh": sha256(b"the generated script\n"), "sysctl/README.md": sha256(unedited)},
    }
    plant_journal(project, document, {})

    result = update(project)

    assert result.returncode == 0, result.stderr
    assert "  kept     launch/node1.sh (changed since that update began: not removed)" in result.stdout
    assert (project / "launch" / "node1.sh").read_bytes() == b"my own node script\n"
    assert not (project / "sysctl" / "README.md").exists()


def test_names_from_a_crafted_journal_or_pristine_copy_reach_the_terminal_escaped(tmp_path: Path) -> None:
    project = render_project(tmp_path / "projects", project_raw(2))
    kept = "a\x1b]0;owned\x07\x1b[2J.txt"  # sets the terminal's title, clears its screen
    (project / kept).write_bytes(b"mine\n")
    staging = plant_journal(project, {"format": 2, "write": {}, "remove": {kept: sha256(b"mine\n")}}, {})
    removed = "b\x1b[31m.txt"
    (project / removed).write_text("generated once\n")
    copy = load(project)
    (project / ".npu-wizard" / "pristine.json.gz").write_bytes(
        encode(Pristine(copy.generator, {**copy.files, removed: "generated once\n"}, copy.executable))
    )

    refused_journal = update(project)
    shutil.rmtree(staging)
    refused_copy = update(project)

    for result in (refused_journal, refused_copy):
        assert result.returncode == 1, result.stdout + result.stderr
        assert "\x1b" not in result.stdout + result.stderr and "\x07" not in result.stdout + result.stderr
    assert f"asks to remove {kept!r}, which is not a file npu-wizard generates" in refused_journal.stderr
    assert f"is damaged ({removed!r} is not a file npu-wizard generates)" in refused_copy.stderr
    assert (project / removed).exists() and (project / kept).read_bytes() == b"mine\n"


# ---- durable: fsync in the order the commit needs, a damaged journal reported ------------

# Runs `npu-wizard update PROJECT` in this interpreter, recording each fsync (by the path of its descriptor),
# rename and unlink as it happens, then the real call; the log goes to the file named second.
RECORDER = """
import json, os, sys

log = []
real = {"fsync": os.fsync, "replace": os.replace, "unlink": os.unlink}

def fsync(fd):
    log.append(["fsync", os.readlink(f"/proc/self/fd/{fd}")])
    return real["fsync"](fd)

def replace(source, target, **kw):
    log.append(["replace", os.path.abspath(source), os.path.abspath(target)])
    return real["replace"](source, target, **kw)

def unlink(path, **kw):
    if "dir_fd" not in kw:  # shutil.rmtree's removals, after the commit is done, are left out
        log.append(["unlink", os.path.abspath(path)])
    return real["unlink"](path, **kw)

os.fsync, os.replace, os.unlink = fsync, replace, unlink
from wizard.cli import main

code = main(["update", sys.argv[1]])
with open(sys.argv[2], "w") as out:
    json.dump(log, out)
sys.exit(code)
"""


def test_an_update_fsyncs_staged_files_then_the_journal_then_each_changed_folder_then_drops_the_journal(
    tmp_path: Path,
) -> None:
    project = four_node_update_of_a_two_node_project(tmp_path)
    (tmp_path / "recorder.py").write_text(RECORDER)
    log_file = tmp_path / "log.json"

    result = subprocess.run(
        [sys.executable, str(tmp_path / "recorder.py"), str(project), str(log_file)],
        capture_output=True,
        text=True,
        timeout=180,
    )

    assert result.returncode == 0, result.stderr
    log = [tuple(entry) for entry in json.loads(log_file.read_text())]
    staging, launch = str(project / ".npu-wizard" / "update"), str(project / "launch")

    def between(entry: tuple[str, ...], after: int, before: int) -> bool:
        return entry in log[after + 1 : before]

    commit = log.index(("replace", f"{staging}/journal.json.new", f"{staging}/journal.json"))
    moves = [at for at, entry in enumerate(log) if entry[0] == "replace" and entry[1].startswith(f"{staging}/files/")]
    drop = log.index(("unlink", f"{staging}/journal.json"))
    for name in ("launch/node2.sh", "launch/node3.sh", "train.py", ".npu-wizard/pristine.json.gz"):
        assert between(("fsync", f"{staging}/files/{name}"), -1, commit), name
    for folder in (f"{staging}/files/launch", f"{staging}/files", staging):
        assert between(("fsync", folder), -1, commit), folder
    assert between(("fsync", f"{staging}/journal.json.new"), -1, commit)
    assert commit < min(moves) and between(("fsync", staging), commit, min(moves))  # the commit durable first
    for folder in (launch, str(project), str(project / ".npu-wizard")):
        assert between(("fsync", folder), max(moves), drop), folder
    # The journal goes last, durably: after it only the update's lock file is removed.
    assert between(("fsync", staging), drop, len(log))
    assert [entry for entry in log[drop + 1 :] if entry[0] != "fsync"] == [
        ("unlink", str(project / ".npu-wizard" / "update.lock"))
    ]


@pytest.mark.parametrize(
    "damage",
    [
        b"",
        b'{"format": 2, "write": {"launch/no',
        b"\x00\x00\x00\x00",
        b"[1, 2]",
        b'{"format": 2, "write": ["x"]}',
        b"[" * 100_000,
    ],
    ids=["empty", "truncated", "zeros", "list", "wrong-shape", "nested"],
)
def test_a_damaged_journal_is_reported_with_what_to_do_and_changes_nothing(tmp_path: Path, damage: bytes) -> None:
    project = four_node_update_of_a_two_node_project(tmp_path)
    kill(start_paused_update(project, "after-first-move", tmp_path / "paused"))
    journal = project / ".npu-wizard" / "update" / "journal.json"
    journal.write_bytes(damage)  # what a power loss left of it
    stale_lock = (".npu-wizard/update.lock",)  # the killed update's, which the next one takes and drops
    before = files_of(project, skip=stale_lock)

    for _ in range(2):
        result = update(project)
        assert result.returncode == 1
        assert "Traceback" not in result.stderr
        assert result.stderr.startswith(f"npu-wizard: {project}: the journal of an interrupted update, {journal}, is")
        assert "so whether that update finished cannot be told; nothing was changed" in result.stderr
        assert f"diff -r {journal.parent / 'files'} {project}" in result.stderr
        assert files_of(project, skip=stale_lock) == before


# ---- one update at a time ----------------------------------------------------------------


def test_a_second_update_while_one_is_at_work_is_refused_naming_the_first(tmp_path: Path) -> None:
    project = four_node_update_of_a_two_node_project(tmp_path)
    first = start_paused_update(project, "before-commit", tmp_path / "paused")  # it has staged, not committed
    try:
        during = files_of(project)
        edit_answers(project, nodes=3, network__host_ips=["127.0.0.1"] * 3)
        during["answers.yaml"] = ((project / "answers.yaml").read_bytes(), during["answers.yaml"][1])

        second = update(project)

        assert second.returncode == 1
        assert second.stderr == (
            f"npu-wizard: another npu-wizard update of {project} is running (held by pid {first.pid}: "
            f"npu-wizard update {project}), so nothing was changed: wait for it to finish (or stop it), "
            "then run this one again\n"
        )
        assert files_of(project) == during  # the first one's staging included
    finally:
        kill(first)
    after = update(project)  # the lock died with its holder
    assert after.returncode == 0, after.stderr
    assert sorted(p.name for p in (project / "launch").iterdir()) == ["node0.sh", "node1.sh", "node2.sh", "run-node.sh"]
    assert not (project / ".npu-wizard" / "update.lock").exists()


def test_two_rebases_of_a_project_without_its_state_folder_are_refused_naming_the_first(tmp_path: Path) -> None:
    project = four_node_update_of_a_two_node_project(tmp_path)
    shutil.rmtree(project / ".npu-wizard")  # the pristine copy lost with its folder: update --rebase
    first = start_paused_update(project, "before-commit", tmp_path / "paused", "--rebase")
    try:
        during = files_of(project)

        second = update(project, "--rebase")

        assert second.returncode == 1, second.stdout + second.stderr
        assert second.stderr == (
            f"npu-wizard: another npu-wizard update of {project} is running (held by pid {first.pid}: "
            f"npu-wizard update {project} --rebase), so nothing was changed: wait for it to finish (or stop it), "
            "then run this one again\n"
        )
        assert files_of(project) == during  # the first one's staging included
    finally:
        kill(first)
    assert (project / ".npu-wizard").stat().st_mode & 0o777 == 0o700
    after = update(project, "--rebase")  # the lock died with its holder; the files differ, so markers
    assert "with conflicts written with <<<<<<< markers" in after.stderr, after.stdout + after.stderr
    assert (project / ".npu-wizard" / "pristine.json.gz").is_file()
    assert not (project / ".npu-wizard" / "update.lock").exists()


def test_an_update_refused_in_a_folder_without_state_leaves_no_state_folder(tmp_path: Path) -> None:
    folder = tmp_path / "not-a-project"
    folder.mkdir()

    result = update(folder, "--rebase")

    assert result.returncode == 1
    assert "answers.yaml does not exist" in result.stderr
    assert list(folder.iterdir()) == []
