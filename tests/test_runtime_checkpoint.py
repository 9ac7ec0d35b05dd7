"""Checkpoints are atomic: a crash mid-save leaves the previous one whole and latest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from runtime import checkpoint


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
