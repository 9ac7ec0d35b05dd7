"""The project a checkpoint names, read without torch and without unpickling.

runtime/checkpoint.py keeps the project in each checkpoint (PROJECT_KEY); the
ranks read it to prune only their own project's checkpoints from a shared
folder, and the runner (which never imports torch) to set them aside.
"""

from __future__ import annotations

import pickletools
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PROJECT_KEY = "npu_wizard_project"  # the project that wrote a checkpoint, kept in it
# a checkpoint's pickle holds names and shapes, the tensors are apart
PICKLE_READ_LIMIT = 64 * 1024 * 1024
STRING_OPCODES = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE"}


def written_by(path: Path) -> str | None:
    """The project a checkpoint names, read without unpickling.

    None for a checkpoint without a name (written before names were kept), a
    damaged file, or one that is not a torch zip archive.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            inner = next(
                (n for n in archive.namelist() if n.rsplit("/", 1)[-1] == "data.pkl"),
                None,
            )
            if inner is None:
                return None
            with archive.open(inner) as file:
                data = file.read(PICKLE_READ_LIMIT)
        return _value_after(pickletools.genops(data), PROJECT_KEY)
    except Exception:  # noqa: BLE001 - whatever a damaged or crafted file raises (zlib.error, lzma...), it names no project
        return None


def _value_after(opcodes: Iterator[tuple[Any, Any, Any]], key: str) -> str | None:
    """The string pickled right after the string `key` (a dict's item), following the pickle's memo."""
    memo: dict[int, str | None] = {}
    previous = latest = None
    for opcode, argument, _position in opcodes:
        name = opcode.name
        if name in ("PUT", "BINPUT", "LONG_BINPUT"):
            # storing the value just read for later does not end the pair
            memo[argument] = latest
            continue
        if name == "MEMOIZE":
            memo[len(memo)] = latest
            continue
        if name in ("GET", "BINGET", "LONG_BINGET"):
            # a string pickled before is referred to, not repeated
            value = memo.get(argument)
        else:
            value = argument if name in STRING_OPCODES else None
        if previous == key and isinstance(value, str):
            return value
        previous = latest = value
    return None
