"""Training data in fixed-shape batches, each rank taking its DistributedSampler share.

In-memory datasets (synthetic, MNIST) are served by indexing whole tensors
with a batch of indices, with no per-sample Python; image folders go through a
DataLoader. Both walk exactly the order DistributedSampler(shuffle=True,
seed, drop_last=True) gives after `set_epoch(epoch)`, and drop the last
partial batch, so every step has the same shapes on every rank.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

from .errors import SetupError

Batch = tuple[torch.Tensor, torch.Tensor]
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class DataSpec:
    """What the model sees: the shape of one sample and the number of classes."""

    input_shape: tuple[int, ...]
    num_classes: int


def synthetic_tensors(
    samples: int,
    input_shape: tuple[int, ...],
    num_classes: int,
    seed: int,
    noise: float = 3.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A learnable dataset: noisy samples around one fixed random centroid per class."""
    generator = torch.Generator().manual_seed(seed)
    centroids = torch.randn(num_classes, *input_shape, generator=generator)
    labels = torch.randint(num_classes, (samples,), generator=generator)
    spread = torch.randn(samples, *input_shape, generator=generator)
    return centroids[labels] + noise * spread, labels


def mnist_tensors(
    root: Path,
    download: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MNIST's training set as normalised 1x28x28 float tensors and labels."""
    from torchvision import datasets

    try:
        mnist = datasets.MNIST(str(root), train=True, download=download)
    except RuntimeError as error:
        raise SetupError(
            f"MNIST is not under {root}: run once with --download-data on a machine "
            f"that reaches the internet, or copy MNIST/raw there ({error})"
        ) from error
    features = mnist.data.unsqueeze(1).float().div_(255)
    return features.sub_(MNIST_MEAN).div_(MNIST_STD), mnist.targets.clone()


def image_folder(root: Path, image_size: int, augment: bool = True) -> Dataset:
    """torchvision's ImageFolder under `root`: with training augmentation, or resized and centred (to validate)."""
    from torchvision import datasets, transforms

    if not Path(root).is_dir():
        raise SetupError(f"no image folder at {root}: one sub-folder per class")
    if augment:
        shape = [
            transforms.RandomResizedCrop(image_size),
            transforms.RandomHorizontalFlip(),
        ]
    else:
        shape = [transforms.Resize(image_size), transforms.CenterCrop(image_size)]
    transform = transforms.Compose(
        [
            *shape,
            transforms.ToTensor(),
            transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )
    return datasets.ImageFolder(str(root), transform=transform)


def held_out_split(
    samples: int,
    fraction: float,
    seed: int,
    *,
    batch_size: int,
    world_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(kept, held out) indices of `samples`: a seeded draw of `fraction` of them is held out to validate on.

    The draw depends on the seed alone, so every rank, and every run resumed
    with the same seed, holds out the same samples and never trains on them.
    Both index lists are in ascending order; the held-out part fills at least
    one batch on every rank.
    """
    held = max(1, round(samples * fraction))
    if held < batch_size * world_size or held >= samples:
        raise SetupError(
            f"holding out {fraction:.0%} of {samples} samples ({held}) to validate on makes no batch of "
            f"{batch_size} on each of {world_size} ranks, or leaves none to train on: use more samples or a "
            "smaller batch size, or set training.eval_every to 0 (no validation, every sample trains)"
        )
    order = torch.randperm(samples, generator=torch.Generator().manual_seed(seed))
    return order[held:].sort().values, order[:held].sort().values


def rank_sampler(
    dataset: Dataset,
    rank: int,
    world_size: int,
    seed: int,
) -> DistributedSampler:
    """This rank's shuffled, evenly cut share of `dataset` (shapes fixed: drop_last)."""
    return DistributedSampler(
        dataset,
        num_replicas=world_size,
        rank=rank,
        shuffle=True,
        seed=seed,
        drop_last=True,
    )


class TensorBatches:
    """Batches cut from in-memory tensors, in this rank's DistributedSampler order."""

    def __init__(
        self,
        features: torch.Tensor,
        labels: torch.Tensor,
        batch_size: int,
        *,
        rank: int,
        world_size: int,
        seed: int,
    ) -> None:
        self.features = features
        self.labels = labels
        self.batch_size = batch_size
        self.sampler = rank_sampler(
            TensorDataset(features, labels),
            rank,
            world_size,
            seed,
        )
        _check_not_empty(len(self), len(labels), batch_size, world_size)

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        return self.sampler.num_samples // self.batch_size

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle for `epoch`, the same way on every rank."""
        self.sampler.set_epoch(epoch)

    def to(self, device: torch.device) -> TensorBatches:
        """Move the whole dataset to `device` once, so steps copy nothing."""
        self.features = self.features.to(device)
        self.labels = self.labels.to(device)
        return self

    def batches(self, start: int = 0) -> Iterator[Batch]:
        """This epoch's batches, from batch `start` on (to resume mid-epoch)."""
        count = len(self)
        order = torch.as_tensor(list(self.sampler), dtype=torch.long)
        order = order[: count * self.batch_size].view(count, self.batch_size)
        order = order.to(self.features.device)
        for index in order[start:]:
            yield (
                self.features.index_select(0, index),
                self.labels.index_select(0, index),
            )


class LoaderBatches:
    """Batches from a DataLoader over a dataset, in this rank's DistributedSampler order."""

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        *,
        rank: int,
        world_size: int,
        seed: int,
        workers: int = 2,
        device_type: str = "cpu",
    ) -> None:
        self.batch_size = batch_size
        self.sampler = rank_sampler(dataset, rank, world_size, seed)
        self._resume = _StartAt(self.sampler)
        _check_not_empty(len(self), len(self.sampler.dataset), batch_size, world_size)
        self.loader = DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=self._resume,
            shuffle=False,
            drop_last=True,
            num_workers=workers,
            persistent_workers=workers > 0,
            **pinning(device_type),
        )

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        return self.sampler.num_samples // self.batch_size

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle for `epoch`, the same way on every rank."""
        self.sampler.set_epoch(epoch)

    def batches(self, start: int = 0) -> Iterator[Batch]:
        """This epoch's batches, from batch `start` on (to resume mid-epoch)."""
        self._resume.skip = start * self.batch_size
        return iter(self.loader)


def pinning(device_type: str, torch_version: str = torch.__version__) -> dict[str, Any]:
    """DataLoader arguments that pin host memory for copies to `device_type`.

    Before torch 2.6 pinning checks CUDA unless told the device: on an NPU it
    would be silently off without pin_memory_device="npu" (pytorch issue 124908).
    """
    if device_type == "cpu":
        return {"pin_memory": False}
    if device_type == "npu" and _release(torch_version) < (2, 6):
        return {"pin_memory": True, "pin_memory_device": "npu"}
    return {"pin_memory": True}


def _release(version: str) -> tuple[int, int]:
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


class _StartAt(torch.utils.data.Sampler[int]):
    # the DataLoader keeps one sampler; this lets an epoch begin part way through
    def __init__(self, sampler: DistributedSampler) -> None:
        self.sampler = sampler
        self.skip = 0

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(iter(self.sampler), self.skip, None)

    def __len__(self) -> int:
        return len(self.sampler) - self.skip


def _check_not_empty(batches: int, samples: int, batch_size: int, world: int) -> None:
    if batches == 0:
        raise SetupError(
            f"{samples} samples make no full batch of {batch_size} on each of {world} "
            "ranks: use more samples or a smaller batch size"
        )
