"""Checkpoints are atomic: a crash mid-save leaves the previous one whole and latest."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from runtime import checkpoint, distributed


def state(step: int) -> dict[str, Any]:
    """A small checkpoint body whose content names its step."""
    model = torch.nn.Linear(3, 2)
    torch.nn.init.constant_(model.weight, float(step))
    return {"model": model.state_dict(), "epoch": 1, "step": step, "batches_done": 5}


def test_a_saved_checkpoint_loads_back(tmp_path: Path) -> None:
    path = checkpoint.save_checkpoint(tmp_path, 7, state(7))
    assert path == tmp_path / "step-000000007.pt"
    loaded = checkpoint.load_checkpoint(path)
    assert loaded["step"] == 7 and loaded["batches_done"] == 5
    assert torch.equal(loaded["model"]["weight"], torch.full((2, 3), 7.0))


def test_only_the_newest_two_are_kept(tmp_path: Path) -> None:
    for step in (10, 20, 30):
        checkpoint.save_checkpoint(tmp_path, step, state(step))
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["step-000000020.pt", "step-000000030.pt"]


def test_pruning_keeps_another_projects_checkpoints_in_a_shared_folder(tmp_path: Path) -> None:
    theirs = [checkpoint.save_checkpoint(tmp_path, step, state(step), keep=9, project="other") for step in (1, 2)]
    unnamed = checkpoint.save_checkpoint(tmp_path, 3, state(3), keep=9)  # ours, written before names were kept
    for step in (4, 5, 6):
        checkpoint.save_checkpoint(tmp_path, step, state(step), project="mine")
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == [
        *(path.name for path in theirs),
        "step-000000005.pt",
        "step-000000006.pt",
    ]
    assert not unnamed.exists()


def test_latest_goes_by_step_number_not_name_or_time(tmp_path: Path) -> None:
    checkpoint.save_checkpoint(tmp_path, 100, state(100), keep=5)
    checkpoint.save_checkpoint(tmp_path, 9, state(9), keep=5)
    assert checkpoint.latest_checkpoint(tmp_path) == tmp_path / "step-000000100.pt"


def test_latest_ignores_temporary_and_foreign_files(tmp_path: Path) -> None:
    checkpoint.save_checkpoint(tmp_path, 5, state(5))
    # what a rank killed mid-save (SIGKILL, power loss) leaves behind
    (tmp_path / ".step-000000009.pt.abc123.tmp").write_bytes(b"PK\x03\x04 torn")
    (tmp_path / "step-000000008.pt.tmp").write_bytes(b"torn")
    (tmp_path / "notes.txt").write_text("hi")
    assert checkpoint.latest_checkpoint(tmp_path) == tmp_path / "step-000000005.pt"


def test_latest_of_a_missing_folder_is_none(tmp_path: Path) -> None:
    assert checkpoint.latest_checkpoint(tmp_path / "nothing") is None


def test_a_crash_during_save_leaves_the_previous_checkpoint_loadable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint.save_checkpoint(tmp_path, 1, state(1))

    def torn_save(obj: object, file: Any) -> None:
        file.write(b"PK\x03\x04 half a checkpoint")
        raise OSError("No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", torn_save)
    with pytest.raises(OSError, match="No space left"):
        checkpoint.save_checkpoint(tmp_path, 2, state(2))
    monkeypatch.undo()

    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000000001.pt"]
    latest = checkpoint.latest_checkpoint(tmp_path)
    assert latest == tmp_path / "step-000000001.pt"
    assert checkpoint.load_checkpoint(latest)["step"] == 1


def test_the_model_state_is_the_unwrapped_modules() -> None:
    inner = torch.nn.Linear(2, 2)
    wrapper = torch.nn.Module()
    wrapper.module = inner
    assert checkpoint.unwrap(wrapper) is inner
    assert checkpoint.unwrap(inner) is inner


def test_the_parameters_digest_is_bitwise() -> None:
    torch.manual_seed(0)
    first = torch.nn.Linear(4, 4)
    second = torch.nn.Linear(4, 4)
    second.load_state_dict(first.state_dict())
    assert checkpoint.parameters_digest(first) == checkpoint.parameters_digest(second)
    with torch.no_grad():
        second.weight[0, 0] = torch.nextafter(second.weight[0, 0], torch.tensor(2.0))
    assert checkpoint.parameters_digest(first) != checkpoint.parameters_digest(second)


def test_the_checkpoint_folder_follows_flag_then_environment_then_project(tmp_path: Path) -> None:
    env = {"NPU_WIZARD_CHECKPOINT_DIR": "/env/ckpt"}
    assert checkpoint.resolve_checkpoint_dir("/flag", tmp_path, env) == Path("/flag")
    assert checkpoint.resolve_checkpoint_dir(None, tmp_path, env) == Path("/env/ckpt")
    assert checkpoint.resolve_checkpoint_dir(None, tmp_path, {}) == tmp_path / "checkpoints"


# ---- an unreadable checkpoint: set aside, and every rank falls back together ---------


def truncate(path: Path) -> None:
    """What a full disk or a killed copy leaves: the first half of the file."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def zero(path: Path) -> None:
    """What a storage fault leaves: the right length, all zeros."""
    path.write_bytes(bytes(path.stat().st_size))


def empty(path: Path) -> None:
    """A file created and never written."""
    path.write_bytes(b"")


@pytest.mark.parametrize("damage", [truncate, zero, empty])
def test_an_unreadable_newest_checkpoint_is_set_aside_and_the_one_before_resumes(
    tmp_path: Path, damage: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    for step in (10, 20):
        checkpoint.save_checkpoint(tmp_path, step, state(step))
    newest = tmp_path / "step-000000020.pt"
    damage(newest)

    path, resumed = checkpoint.resume_point(tmp_path)

    assert path == tmp_path / "step-000000010.pt" and resumed["step"] == 10
    assert torch.equal(resumed["model"]["weight"], torch.full((2, 3), 10.0))
    aside = tmp_path / "step-000000020.pt.unreadable"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000000010.pt", aside.name]
    warnings = capsys.readouterr().err
    assert f"warning: checkpoint {newest} cannot be loaded; kept aside as {aside}" in warnings
    assert f"the checkpoint of step 20 cannot be loaded on every rank: {newest} (" in warnings


def test_a_set_aside_checkpoint_is_never_overwritten(tmp_path: Path) -> None:
    checkpoint.save_checkpoint(tmp_path, 5, state(5))
    (tmp_path / "step-000000005.pt.unreadable").write_bytes(b"an earlier bad copy")
    zero(tmp_path / "step-000000005.pt")
    assert checkpoint.resume_point(tmp_path) is None  # nothing loadable: start afresh
    assert (tmp_path / "step-000000005.pt.unreadable").read_bytes() == b"an earlier bad copy"
    assert (tmp_path / "step-000000005.pt.unreadable.1").stat().st_size > 0


def test_no_checkpoint_means_no_resume_point(tmp_path: Path) -> None:
    assert checkpoint.resume_point(tmp_path / "none yet") is None


def _resume_on_rank(rank: int, port: int, folders: list[Path], results: Any) -> None:
    """One rank of a real two-process gloo job: each rank reads its own folder, as nodes do."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        found = checkpoint.resume_point(folders[rank])
        results.put((rank, None if found is None else found[1]["step"]))
    finally:
        distributed.destroy_process_group()


@pytest.mark.slow
def test_when_one_nodes_newest_copy_is_corrupt_every_rank_resumes_from_the_older_step(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    from tests.runs import free_port

    folders = [tmp_path / "node0", tmp_path / "node1"]
    for folder in folders:
        for step in (10, 20):
            checkpoint.save_checkpoint(folder, step, state(step))
    truncate(folders[1] / "step-000000020.pt")

    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    ranks = mp.start_processes(
        _resume_on_rank, args=(free_port(), folders, results), nprocs=2, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + 240
    while not ranks.join(timeout=1):
        if time.monotonic() > deadline:
            for process in ranks.processes:
                process.kill()
            pytest.fail("the two ranks did not finish within 240 s")

    assert sorted(results.get() for _ in range(2)) == [(0, 10), (1, 10)]
    assert (folders[1] / "step-000000020.pt.unreadable").is_file()  # node 1's bad copy, kept aside
    assert (folders[0] / "step-000000020.pt").is_file()  # node 0's good copy is left alone


# ---- a full disk ------------------------------------------------------------------------


class DiskFullFileDouble:
    """Stands in for a file on a full disk: every write fails with ENOSPC (as the kernel says it)."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def __enter__(self) -> DiskFullFileDouble:
        return self

    def __exit__(self, *exc: object) -> None:
        self.real.close()

    def write(self, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    def flush(self) -> None:
        self.real.flush()

    def fileno(self) -> int:
        return self.real.fileno()


def test_a_save_on_a_full_disk_says_no_space_left_on_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint.save_checkpoint(tmp_path, 1, state(1))
    real_fdopen = os.fdopen
    monkeypatch.setattr(checkpoint.os, "fdopen", lambda *a, **k: DiskFullFileDouble(real_fdopen(*a, **k)))
    with pytest.raises(checkpoint.CheckpointSpaceError) as raised:
        checkpoint.save_checkpoint(tmp_path, 2, state(2))
    assert str(raised.value).startswith(f"no space left on {tmp_path}: the checkpoint of step 2 was not written")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000000001.pt"]


@pytest.fixture
def full_disk(tmp_path: Path) -> Any:
    """A real 64 KiB tmpfs (needs root, as CI runs): a checkpoint of a few hundred KiB cannot fit."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_save_on_a_real_full_tmpfs_says_no_space_left_on_the_folder(full_disk: Path) -> None:
    big = {"model": {"weight": torch.zeros(256, 1024)}, "step": 3}  # 1 MiB of weights
    with pytest.raises(checkpoint.CheckpointSpaceError, match=f"^no space left on {full_disk}: "):
        checkpoint.save_checkpoint(full_disk, 3, big)
    assert list(full_disk.iterdir()) == []  # the partial temporary file is gone


# ---- a checkpoint that cannot be read is a failure, not damage ------------------------------

NOBODY = 65534


@pytest.fixture
def open_folder() -> Any:
    """A folder every uid can reach and write (pytest's own tmp folders are root's alone)."""
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="npu-wizard-ckpt-"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root)


def _resume_as(rank: int, port: int, folders: list[Path], uids: list[int], results: Any) -> None:
    """A rank of a real two-process gloo job that reads its folder as uid `uids[rank]`."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    os.setresgid(uids[rank], uids[rank], uids[rank])
    os.setresuid(uids[rank], uids[rank], uids[rank])
    try:
        found = checkpoint.resume_point(folders[rank])
        results.put((rank, "resumed", None if found is None else found[1]["step"]))
    except checkpoint.CheckpointReadError as error:
        results.put((rank, "read error", str(error)))
    finally:
        distributed.destroy_process_group()


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to read as another uid")
def test_a_checkpoint_one_rank_may_not_read_stops_every_rank_and_is_not_set_aside(open_folder: Path) -> None:
    import torch.multiprocessing as mp

    from tests.runs import free_port

    folders = [open_folder / "node0", open_folder / "node1"]
    for folder in folders:
        for step in (10, 20):
            checkpoint.save_checkpoint(folder, step, state(step))
        folder.chmod(0o777)  # node 1's rank could rename what it cannot read
    denied = folders[1] / "step-000000020.pt"
    denied.chmod(0o600)  # root's: uid nobody gets EACCES

    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    ranks = mp.start_processes(
        _resume_as, args=(free_port(), folders, [0, NOBODY], results), nprocs=2, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + 240
    while not ranks.join(timeout=1):
        if time.monotonic() > deadline:
            for process in ranks.processes:
                process.kill()
            pytest.fail("the two ranks did not finish within 240 s")

    outcomes = sorted(results.get() for _ in range(2))
    assert [outcome[:2] for outcome in outcomes] == [(0, "read error"), (1, "read error")], outcomes
    assert f"rank 1: {denied} (PermissionError" in outcomes[0][2]
    assert "nothing was set aside" in outcomes[0][2]
    # the folder save_checkpoint made holds a .gitignore too (git leaves it out)
    assert sorted(p.name for p in folders[1].iterdir()) == [".gitignore", "step-000000010.pt", "step-000000020.pt"]


OUT_OF_MEMORY_PROBE = """
import resource, sys
from pathlib import Path
from runtime import checkpoint
# room for the read pass, not for the tensors: RLIMIT_AS just above what is mapped now
mapped = int(next(l for l in open('/proc/self/status') if l.startswith('VmSize:')).split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (mapped + 96 * 1024 * 1024, resource.RLIM_INFINITY))
try:
    found = checkpoint.resume_point(Path(sys.argv[1]))
    print("resumed", found and found[0].name)
except checkpoint.CheckpointReadError as error:
    print("read error:", error)
"""


def test_running_out_of_memory_while_loading_is_reported_not_taken_for_damage(tmp_path: Path) -> None:
    checkpoint.save_checkpoint(tmp_path, 10, state(10))
    big = {"model": {"weight": torch.ones(64 * 1024 * 1024)}, "step": 20}  # 256 MB of tensor
    checkpoint.save_checkpoint(tmp_path, 20, big)

    probe = subprocess.run(
        [sys.executable, "-c", OUT_OF_MEMORY_PROBE, str(tmp_path)], capture_output=True, text=True, timeout=300
    )

    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.startswith("read error: the checkpoint of step 20 could not be read"), probe.stdout
    assert "nothing was set aside" in probe.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000000010.pt", "step-000000020.pt"]


def test_a_full_disk_while_marking_a_new_folder_for_git_says_no_space_left_on_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def disk_full(folder: Path) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "keep_out_of_git", disk_full)
    folder = tmp_path / "checkpoints"
    with pytest.raises(checkpoint.CheckpointSpaceError) as raised:
        checkpoint.save_checkpoint(folder, 1, state(1))
    assert str(raised.value).startswith(f"no space left on {folder}: the checkpoint of step 1 was not written")
