"""Each rank's batches follow DistributedSampler's order exactly, with fixed shapes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from runtime import data
from runtime.errors import SetupError

SEED = 1234


def reference_batches(
    features: torch.Tensor, labels: torch.Tensor, batch: int, rank: int, world: int, epoch: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """What the textbook DataLoader + DistributedSampler would hand this rank."""
    dataset = TensorDataset(features, labels)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=SEED, drop_last=True)
    sampler.set_epoch(epoch)
    return list(DataLoader(dataset, batch_size=batch, sampler=sampler, shuffle=False, drop_last=True))


@pytest.mark.parametrize(("samples", "world", "batch"), [(1000, 4, 16), (97, 3, 8), (64, 2, 32)])
def test_tensor_batches_equal_distributed_sampler_batches(samples: int, world: int, batch: int) -> None:
    features, labels = data.synthetic_tensors(samples, (5,), 10, SEED)
    for epoch in (0, 1, 7):
        for rank in range(world):
            ours = data.TensorBatches(features, labels, batch, rank=rank, world_size=world, seed=SEED)
            ours.set_epoch(epoch)
            got = list(ours.batches())
            expected = reference_batches(features, labels, batch, rank, world, epoch)
            assert len(got) == len(expected) == len(ours)
            for (x, y), (ex, ey) in zip(got, expected, strict=True):
                assert torch.equal(x, ex) and torch.equal(y, ey)


def test_ranks_get_disjoint_samples_and_epochs_reshuffle() -> None:
    features = torch.arange(256, dtype=torch.float32).unsqueeze(1)
    labels = torch.zeros(256, dtype=torch.long)
    seen: list[set[int]] = []
    for rank in range(4):
        batches = data.TensorBatches(features, labels, 8, rank=rank, world_size=4, seed=SEED)
        seen.append({int(v) for x, _y in batches.batches() for v in x.flatten()})
    assert all(len(s) == 64 for s in seen) and len(set().union(*seen)) == 256
    batches = data.TensorBatches(features, labels, 8, rank=0, world_size=4, seed=SEED)
    first = torch.cat([x for x, _y in batches.batches()])
    batches.set_epoch(1)
    assert not torch.equal(first, torch.cat([x for x, _y in batches.batches()]))


def test_a_resumed_epoch_starts_at_the_saved_batch() -> None:
    features, labels = data.synthetic_tensors(200, (3,), 4, SEED)
    batches = data.TensorBatches(features, labels, 10, rank=1, world_size=2, seed=SEED)
    batches.set_epoch(2)
    whole = list(batches.batches())
    rest = list(batches.batches(start=4))
    assert len(rest) == len(whole) - 4
    assert all(torch.equal(a[0], b[0]) for a, b in zip(whole[4:], rest, strict=True))


def test_the_first_batches_of_any_number_of_ranks_are_the_same_first_samples_of_the_epoch() -> None:
    # what train.py relies on to resume on another number of ranks: b batches done on 4 ranks and 2b on 2
    # ranks are the same samples, so the epoch goes on after them with b * 4 // 2 batches skipped
    features, labels = data.synthetic_tensors(480, (3,), 4, SEED)
    features[:, 0] = torch.arange(480, dtype=features.dtype)  # each sample tells which it is

    def samples(world: int, start: int = 0, stop: int | None = None) -> list[int]:
        """The samples every rank of `world` reads in its batches start to stop of epoch 1."""
        taken: list[int] = []
        for rank in range(world):
            ranks = data.TensorBatches(features, labels, 10, rank=rank, world_size=world, seed=SEED)
            ranks.set_epoch(1)
            for batch, _ in list(ranks.batches(start=start))[: None if stop is None else stop - start]:
                taken += batch[:, 0].int().tolist()
        return sorted(taken)

    done = samples(4, 0, 3)
    assert done == samples(2, 0, 6) == samples(1, 0, 12) and len(done) == 3 * 4 * 10
    after = samples(2, start=3 * 4 // 2)  # what two ranks resumed there read
    assert not set(done) & set(after)  # nothing read twice
    assert sorted(done + after) == samples(2) == list(range(480))  # nothing of the epoch left out


def test_loader_batches_follow_the_same_order_and_resume() -> None:
    features, labels = data.synthetic_tensors(120, (1, 4, 4), 3, SEED)
    dataset = TensorDataset(features, labels)
    loader = data.LoaderBatches(dataset, 8, rank=2, world_size=3, seed=SEED, workers=0)
    loader.set_epoch(3)
    got = list(loader.batches())
    expected = reference_batches(features, labels, 8, 2, 3, 3)
    assert len(got) == len(expected) == len(loader) == 5
    assert all(torch.equal(a[0], b[0]) for a, b in zip(got, expected, strict=True))
    resumed = list(loader.batches(start=2))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(got[2:], resumed, strict=True))
    assert len(list(loader.batches())) == 5  # the skip applied to one epoch only


def test_synthetic_data_is_seeded_and_learnable() -> None:
    features, labels = data.synthetic_tensors(2000, (16,), 4, SEED)
    again, _ = data.synthetic_tensors(2000, (16,), 4, SEED)
    assert torch.equal(features, again)
    assert features.shape == (2000, 16) and labels.shape == (2000,)
    # nearest class mean beats chance by far: there is something to learn
    means = torch.stack([features[labels == c].mean(0) for c in range(4)])
    predicted = torch.cdist(features, means).argmin(1)
    assert (predicted == labels).float().mean() > 0.6


def test_too_few_samples_for_one_batch_per_rank_is_a_clear_error() -> None:
    features, labels = data.synthetic_tensors(30, (2,), 2, SEED)
    with pytest.raises(SetupError, match=r"30 samples make no full batch of 16 on each of 2 ranks"):
        data.TensorBatches(features, labels, 16, rank=0, world_size=2, seed=SEED)


def test_missing_mnist_says_how_to_get_it(tmp_path: Path) -> None:
    with pytest.raises(SetupError, match=r"MNIST is not under .*--download-data"):
        data.mnist_tensors(tmp_path)


@pytest.mark.parametrize(
    ("device_type", "torch_version", "arguments"),
    [
        ("npu", "2.1.0", {"pin_memory": True, "pin_memory_device": "npu"}),
        ("npu", "2.5.1+cpu", {"pin_memory": True, "pin_memory_device": "npu"}),
        ("npu", "2.6.0", {"pin_memory": True}),
        ("npu", "2.10.0", {"pin_memory": True}),
        ("cuda", "2.1.0", {"pin_memory": True}),
        ("cpu", "2.1.0", {"pin_memory": False}),
    ],
)
def test_pinning_names_the_npu_where_torch_would_check_cuda(
    device_type: str, torch_version: str, arguments: dict[str, object]
) -> None:
    assert data.pinning(device_type, torch_version) == arguments


def test_an_npu_loader_pins_for_the_npu_on_torch_before_2_6() -> None:
    dataset = TensorDataset(torch.randn(64, 3), torch.randint(2, (64,)))
    loader = data.LoaderBatches(dataset, 8, rank=0, world_size=1, seed=0, workers=0, device_type="npu").loader
    assert loader.pin_memory
    before_2_6 = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2]) < (2, 6)
    assert (loader.pin_memory_device == "npu") is before_2_6


def test_the_held_out_split_is_seeded_disjoint_and_the_stated_fraction() -> None:
    kept, held = data.held_out_split(1000, 0.1, SEED, batch_size=16, world_size=2)
    assert len(held) == 100 and len(kept) == 900
    assert sorted(torch.cat([kept, held]).tolist()) == list(range(1000))  # each sample in exactly one part
    assert kept.tolist() == sorted(kept.tolist()) and held.tolist() == sorted(held.tolist())
    again_kept, again_held = data.held_out_split(1000, 0.1, SEED, batch_size=16, world_size=2)
    assert torch.equal(kept, again_kept) and torch.equal(held, again_held)  # every rank, every run: the same
    _, other = data.held_out_split(1000, 0.1, SEED + 1, batch_size=16, world_size=2)
    assert not torch.equal(held, other)
    assert held[-1] > 900  # drawn from the whole set, not its tail cut off


def test_a_held_out_part_too_small_for_a_batch_per_rank_says_what_to_change() -> None:
    with pytest.raises(SetupError, match=r"holding out 10% of 200 samples \(20\) .* no batch of 16 on each of 2 ranks"):
        data.held_out_split(200, 0.1, SEED, batch_size=16, world_size=2)
    with pytest.raises(SetupError, match="training.eval_every to 0"):
        data.held_out_split(200, 0.1, SEED, batch_size=16, world_size=2)


def test_the_image_folder_for_validation_is_resized_and_centred_without_augmentation(tmp_path: Path) -> None:
    pytest.importorskip("torchvision")
    from PIL import Image

    for label in ("a", "b"):
        (tmp_path / label).mkdir()
        Image.new("RGB", (40, 30), (10, 200, 30)).save(tmp_path / label / "one.png")
    plain = data.image_folder(tmp_path, 16, augment=False)
    first, second = plain[0][0], plain[0][0]
    assert first.shape == (3, 16, 16) and torch.equal(first, second)  # the same every time: no random crop or flip
