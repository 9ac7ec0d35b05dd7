"""A project on a file system that takes no flock (NFS without lockd, Lustre without -o flock).

There flock fails with ENOLCK or EOPNOTSUPP: `run` and `update` used to end in
that OSError's traceback; they go ahead unlocked with one line naming the file
system and what is not guarded. The file system stands in by monkeypatching
fcntl.flock (no such mount exists here).
"""

from __future__ import annotations

import errno
import fcntl
from pathlib import Path

import pytest

from tests.factories import answers
from wizard.cli import main
from wizard.render.project_locks import file_system
from wizard.render.render import render
from wizard.run import command
from wizard.run.launch import RunOptions

NO_LOCKS = [errno.ENOLCK, errno.EOPNOTSUPP]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A rendered CPU project."""
    return render(answers(), tmp_path).project_dir


def no_flock(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    """fcntl.flock as a file system without locks answers it."""

    def refuse(fd: int, operation: int) -> None:
        raise OSError(code, f"{errno.errorcode[code]} (no locks here)")

    monkeypatch.setattr(fcntl, "flock", refuse)


@pytest.mark.parametrize("code", NO_LOCKS, ids=errno.errorcode.get)
def test_a_run_without_flock_goes_ahead_unlocked_and_says_so_in_one_line(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], code: int
) -> None:
    started = []
    monkeypatch.setattr(command, "_run_locked", lambda project, options, lock, **how: started.append(lock))
    no_flock(monkeypatch, code)

    command.run(str(project), RunOptions(), dry_run=False, fresh=False, live=False)

    assert len(started) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"npu-wizard: warning: {project.resolve() / '.npu-wizard'} is on ")
    assert "which takes no file locks (flock: " in err
    assert "this run holds no run lock: nothing stops a second run of this project, or an update under it" in err
    assert not list((project / ".npu-wizard").glob("run-node-*.lock"))


@pytest.mark.parametrize("code", NO_LOCKS, ids=errno.errorcode.get)
def test_an_update_without_flock_goes_ahead_unlocked_and_says_so_in_one_line(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], code: int
) -> None:
    no_flock(monkeypatch, code)

    assert main(["update", str(project)]) == 0

    out, err = capsys.readouterr()
    assert "nothing to change" in out
    assert err.count("\n") == 1, err
    assert err.startswith(f"warning: {project / '.npu-wizard'} is on ")
    assert "this update holds no update lock: nothing stops a second update or a run of this project meanwhile" in err
    assert not (project / ".npu-wizard" / "update.lock").exists()


def test_the_file_system_is_named_by_its_type_and_mount_point(tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
        "40 22 0:50 / /my\\040shared rw,relatime shared:9 - nfs4 server:/export rw,vers=4.2,local_lock=none\n"
    )
    assert file_system(Path("/my shared/team/job/.npu-wizard"), mountinfo) == "nfs4 mounted at /my shared"
    assert file_system(Path("/home/me"), mountinfo) == "ext4 mounted at /"
    assert file_system(Path("/home/me"), tmp_path / "none") == "its file system"
