"""Token windows for a language model: train.bin and val.bin memory-mapped, each rank its own part.

The generated prepare_data.py writes the two files and meta.json beside them
(the dtype, the vocabulary size, each file's token count). A window is
block_size + 1 tokens: the inputs are its first block_size tokens, the targets
the same shifted by one. Each rank reads only its own contiguous part of the
file, cut into windows whose inputs do not overlap (a window's last token, a
target, is the next window's first input); an epoch visits every window of the
part once, in an order seeded by the seed and the epoch. So (epoch, batches
done), which every checkpoint holds, is a position in the stream: a resumed
run continues with the next window, repeating none.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from runtime.errors import SetupError

Batch = tuple[torch.Tensor, torch.Tensor]
META_FILE = "meta.json"
DTYPES = ("uint8", "uint16", "uint32")
PREPARE = "python prepare_data.py SOURCE (a folder of .txt files or a .jsonl file)"


@dataclass(frozen=True)
class TokenMeta:
    """What meta.json says of the token files beside it."""

    dtype: str
    vocab_size: int
    tokenizer: str
    tokens: dict[str, int]  # per split (train, val): the count the file must hold


def read_meta(data_dir: Path) -> TokenMeta:
    """meta.json of `data_dir`; a missing or unreadable one says how to make it."""
    path = data_dir / META_FILE
    if not path.is_file():
        raise SetupError(
            f"no token data in {data_dir} ({META_FILE} is missing): make it with {PREPARE}"
        )
    try:
        meta = json.loads(path.read_text())
        dtype, vocab_size = str(meta["dtype"]), int(meta["vocab_size"])
        tokens = {split: int(count) for split, count in meta["tokens"].items()}
        tokenizer = str(meta.get("tokenizer", "unknown"))
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise SetupError(
            f"{path} is not the metadata prepare_data.py writes ({error!r}): run {PREPARE} again"
        ) from None
    if dtype not in DTYPES:
        raise SetupError(
            f"{path} names dtype {dtype!r}; token files are one of {', '.join(DTYPES)}"
        )
    return TokenMeta(dtype, vocab_size, tokenizer, tokens)


def open_tokens(data_dir: Path, split: str, meta: TokenMeta) -> np.memmap:
    """`<split>.bin` of `data_dir`, memory-mapped read-only, checked against its metadata."""
    path = data_dir / f"{split}.bin"
    if not path.is_file():
        raise SetupError(f"token file {path} is missing: make it with {PREPARE}")
    itemsize = np.dtype(meta.dtype).itemsize
    size = path.stat().st_size
    expected = meta.tokens.get(split)
    if size % itemsize != 0 or (expected is not None and size != expected * itemsize):
        held = (
            f"{size} bytes"
            if expected is None
            else f"{size} bytes, not {expected} tokens x {itemsize} bytes"
        )
        raise SetupError(
            f"token file {path} does not hold {meta.dtype} tokens as {META_FILE} says ({held}): it was written "
            f"with another dtype or cut short; run {PREPARE} again"
        )
    if size == 0:
        raise SetupError(f"token file {path} is empty: give prepare_data.py more text")
    return np.memmap(path, dtype=meta.dtype, mode="r")


class TokenBatches:
    """Batches of windows from this rank's part of a token file, in a seeded order per epoch."""

    def __init__(
        self,
        tokens: np.ndarray,
        block_size: int,
        batch_size: int,
        *,
        rank: int,
        world_size: int,
        seed: int,
        shuffle: bool = True,
        name: str = "the token file",
    ) -> None:
        self.tokens = tokens
        self.block_size = block_size
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        part = len(tokens) // world_size
        self.first = rank * part
        # windows of block_size + 1 tokens that overlap by one: a target is the next window's first input
        self.windows = max(part - 1, 0) // block_size
        if len(self) == 0:
            raise SetupError(
                f"{name} holds {len(tokens)} tokens: each of {world_size} rank(s) gets {part}, which make "
                f"{self.windows} window(s) of {block_size + 1} tokens, fewer than one batch of {batch_size}; "
                "give prepare_data.py more text, or lower block_size or the batch size"
            )

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        return self.windows // self.batch_size

    def set_epoch(self, epoch: int) -> None:
        """Choose the order of `epoch`, the same on every run with this seed."""
        self.epoch = epoch

    def window_order(self) -> torch.Tensor:
        """This epoch's windows in the order they are read (indices into this rank's part)."""
        if not self.shuffle:
            return torch.arange(self.windows)
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self.windows, generator=generator)

    def batches(self, start: int = 0) -> Iterator[Batch]:
        """This epoch's batches, from batch `start` on (to resume mid-epoch)."""
        order = self.window_order()[: len(self) * self.batch_size].view(
            len(self), self.batch_size
        )
        for windows in order[start:]:
            yield self.batch(windows.tolist())

    def batch(self, windows: list[int]) -> Batch:
        """Inputs and targets (batch x block_size, int64) of the given windows."""
        rows = [self._window(index) for index in windows]
        stacked = torch.from_numpy(np.stack(rows).astype(np.int64))
        return stacked[:, :-1], stacked[:, 1:]

    def _window(self, index: int) -> np.ndarray:
        start = self.first + index * self.block_size
        return np.asarray(self.tokens[start : start + self.block_size + 1])
