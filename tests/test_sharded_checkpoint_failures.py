"""Sharded step folders that fail: cut short after they were completed, or not written for a full disk.

A step folder is complete once its marker is there (runtime/sharded_checkpoint.py);
the marker records each file's size as written, so a shard cut short or lost
later (a partial copy, a full disk) is found at resume time, before
torch.distributed.checkpoint reads it, and the step before it resumes. A save
that runs out of disk says so and leaves no partial folder. The saves are real:
one rank of a gloo process group in this process, torch.distributed.checkpoint
writing its shards, a real 64 KiB tmpfs as the full disk.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from runtime import checkpoint, sharded_checkpoint
from runtime.sharded_checkpoint import MARKER, complete_folders, damage, resume_point, save_sharded
from tests.test_runtime_checkpoint import full_disk  # noqa: F401  (a fixture: a real 64 KiB tmpfs)


@pytest.fixture
def one_rank(tmp_path: Path) -> Iterator[None]:
    """This process as the one rank of a gloo process group, for the length of a test."""
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def saved_steps(folder: Path, steps: list[int], width: int = 16) -> list[Path]:
    """Step folders of a small model and its Adam state, one per step."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Linear(width, 4))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 8)).sum().backward()
    optimizer.step()
    training = {"epoch": 0, "batches_done": 0}
    return [save_sharded(folder, step, model, optimizer, {**training, "step": step}, project="p") for step in steps]


def test_the_marker_records_the_size_of_every_file_as_written(tmp_path: Path, one_rank: None) -> None:
    (folder,) = saved_steps(tmp_path / "checkpoints", [10])
    recorded = json.loads((folder / MARKER).read_text())["files"]
    on_disk = {path.name: path.stat().st_size for path in folder.iterdir() if path.name != MARKER}
    assert recorded == on_disk
    assert any(name.endswith(".distcp") for name in recorded) and "training.pt" in recorded
    assert damage(folder) is None


def test_a_shard_cut_short_sets_its_step_aside_and_the_step_before_resumes(
    tmp_path: Path, one_rank: None, capsys: pytest.CaptureFixture[str]
) -> None:
    older, newest = saved_steps(tmp_path / "checkpoints", [10, 20])
    shard = next(newest.glob("*.distcp"))
    written = shard.stat().st_size
    os.truncate(shard, written // 2)
    assert damage(newest) == f"{newest}: {shard.name} holds {written // 2} bytes, {written} were written"
    resumed = resume_point(tmp_path / "checkpoints", project="p")
    assert resumed is not None and resumed[0] == older and resumed[1]["step"] == 10
    aside = newest.with_name(newest.name + ".unreadable")
    assert aside.is_dir() and not newest.exists() and complete_folders(tmp_path / "checkpoints") == [older]
    warned = " ".join(capsys.readouterr().err.split())
    assert f"checkpoint {newest} cannot be loaded ({newest}: {shard.name} holds" in warned
    assert f"kept aside as {aside}" in warned


def test_a_lost_shard_and_a_marker_naming_a_path_outside_are_damage(tmp_path: Path, one_rank: None) -> None:
    (folder,) = saved_steps(tmp_path / "checkpoints", [10])
    marker = json.loads((folder / MARKER).read_text())
    shard = next(folder.glob("*.distcp"))
    shard.unlink()
    assert damage(folder) == f"{folder}: {shard.name} is missing"
    (folder / MARKER).write_text(json.dumps({**marker, "files": {"../../etc/passwd": 1}}))
    assert damage(folder) == f"{folder / MARKER} names '../../etc/passwd', not a file of the folder"


def test_a_marker_without_sizes_from_an_earlier_release_still_resumes(tmp_path: Path, one_rank: None) -> None:
    (folder,) = saved_steps(tmp_path / "checkpoints", [10])
    marker = json.loads((folder / MARKER).read_text())
    del marker["files"]
    (folder / MARKER).write_text(json.dumps(marker))
    assert damage(folder) is None
    resumed = resume_point(tmp_path / "checkpoints", project="p")
    assert resumed is not None and resumed[0] == folder


def test_a_marker_the_disk_would_not_give_is_no_proof_of_damage_and_one_that_is_not_json_is(tmp_path: Path) -> None:
    # an error of the disk (here: no marker at all) proves nothing about the shards: the folder is not set aside
    assert sharded_checkpoint.damage(tmp_path) is None
    (tmp_path / MARKER).write_text('{"step": 10, "files": {"__0_0.distcp"')  # cut short
    assert sharded_checkpoint.damage(tmp_path) == f"{tmp_path / MARKER} cannot be read (JSONDecodeError)"
    (tmp_path / MARKER).write_text(json.dumps({"files": {"a\0b": 1}}))
    assert sharded_checkpoint.damage(tmp_path) == f"{tmp_path / MARKER} names 'a\\x00b', not a file of the folder"


def test_a_save_that_runs_out_of_disk_says_so_and_leaves_no_partial_folder(
    full_disk: Path,  # noqa: F811  (the fixture imported above)
    one_rank: None,
) -> None:
    with pytest.raises(checkpoint.CheckpointSpaceError) as raised:
        saved_steps(full_disk, [10], width=4096)  # 8 x 4096 weights and Adam's two moments: about 600 KiB
    assert str(raised.value).startswith(f"no space left on {full_disk}: the checkpoint of step 10 was not written")
    assert list(full_disk.iterdir()) == []  # the hidden partial folder is gone
