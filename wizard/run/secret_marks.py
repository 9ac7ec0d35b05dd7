"""Marks of the job's secret values, so a bundle made later, from any shell, can still find and remove them.

The runner knows the job's environment; `npu-wizard bundle` may run from a shell that lacks HF_TOKEN or a
password the job printed. So the runner writes RUN/secret-marks.json: for each secret variable its name, the
length of its value and a keyed hash (HMAC-SHA256) of the value under a key drawn for this run, never the
value. The bundle hashes the words of its texts that have one of those lengths and removes those that match.
The file is readable by its owner only, and the bundle never takes it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from runtime.provenance import HIDDEN
from runtime.status import ENV_STATUS_TOKEN

MARKS_FILE = "secret-marks.json"
SHORTEST = 6  # a shorter value is too likely an ordinary word to remove wherever it appears
# a value starts and ends where a word does, or next to one of these (NAME=value, 'value', user:value@host)
EDGES = "=:,;()[]{}<>@&?#|/\\'\"`"
WORD = re.compile(r"[^\s'\"`]+")
MOST_EDGES = 64  # edges of one word tried in pairs: a longer run of them (a line of separators) is no secret


@dataclass(frozen=True)
class SecretMarks:
    """The recorded marks of one run: its key, and each secret's name, length and hash."""

    key: bytes
    marks: tuple[tuple[str, int, str], ...]

    @classmethod
    def of(cls, env: Mapping[str, str], key: bytes | None = None) -> SecretMarks:
        """Marks of every secret variable of `env` (by name, and the status token) long enough to find."""
        key = key or secrets.token_bytes(32)
        marks = tuple(
            (name, len(value), _hash(key, value))
            for name, value in sorted(env.items())
            if (HIDDEN.search(name) or name == ENV_STATUS_TOKEN) and len(value) >= SHORTEST
        )
        return cls(key, marks)

    def found_in(self, text: str) -> set[str]:
        """The pieces of `text` whose keyed hash is a recorded secret's."""
        lengths = {length for _, length, _ in self.marks}
        hashes = {digest for _, _, digest in self.marks}
        if not lengths:
            return set()
        found = set()
        for word in WORD.finditer(text):
            for piece in _pieces(word.group(), lengths):
                if _hash(self.key, piece) in hashes:
                    found.add(piece)
        return found

    def names(self) -> list[str]:
        """The variables marked, for the manifest."""
        return [name for name, _, _ in self.marks]


def record_secret_marks(run_dir: Path, env: Mapping[str, str]) -> None:
    """Write RUN/secret-marks.json (owner-only) for the secret variables of the job's environment `env`."""
    marks = SecretMarks.of(env)
    data = {"key": marks.key.hex(), "marks": [{"name": n, "length": n_, "hmac_sha256": d} for n, n_, d in marks.marks]}
    fd = os.open(run_dir / MARKS_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as file:
        json.dump(data, file)


def read_secret_marks(run_dir: Path) -> SecretMarks | None:
    """The marks a runner recorded in `run_dir`, or None when it recorded none (an older npu-wizard) or they
    cannot be read."""
    try:
        data = json.loads((run_dir / MARKS_FILE).read_text())
        marks = tuple((str(m["name"]), int(m["length"]), str(m["hmac_sha256"])) for m in data["marks"])
        return SecretMarks(bytes.fromhex(data["key"]), marks)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _hash(key: bytes, value: str) -> str:
    return hmac.new(key, value.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()


def _pieces(word: str, lengths: set[int]) -> Iterator[str]:
    """The pieces of `word` between two of its edges (its ends, or beside an EDGES character) of a length in
    `lengths`."""
    starts = [0] + [i + 1 for i, c in enumerate(word) if c in EDGES]
    ends = [i for i, c in enumerate(word) if c in EDGES] + [len(word)]
    if len(starts) > MOST_EDGES:
        starts, ends = [0], [len(word)]
    for start in starts:
        for end in ends:
            if end - start in lengths:
                yield word[start:end]
