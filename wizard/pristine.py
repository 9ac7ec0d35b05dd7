"""The project as generated, kept inside it: the base of `npu-wizard update`'s three-way merge.

Every render stores its files, untouched, in `.npu-wizard/pristine.json.gz`
(a few kilobytes: the per-node scripts compress to almost nothing). An update
merges the user's edits (their copy against this base) with the generator's
changes (a new render against this base), whichever npu-wizard version
rendered the base.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from wizard import __version__

STATE_DIR = ".npu-wizard"
PRISTINE = f"{STATE_DIR}/pristine.json.gz"


@dataclass(frozen=True)
class Pristine:
    """The files of a render as it wrote them, and which of them are executable."""

    generator: str
    files: dict[str, str]
    executable: frozenset[str]


def is_generated(name: str) -> bool:
    """Whether a project-relative path belongs to the render (not npu-wizard's own state)."""
    return not name.startswith(STATE_DIR + "/")


def snapshot(project: Path, names: list[str], known: Mapping[str, str] | None = None) -> Pristine:
    """The named files of `project` as a Pristine of this npu-wizard version (`known` texts are not read again)."""
    known = known or {}
    files = {
        name: known[name] if name in known else (project / name).read_text(encoding="utf-8")
        for name in names
        if is_generated(name)
    }
    executable = frozenset(name for name in files if (project / name).stat().st_mode & 0o111)
    return Pristine(f"npu-wizard {__version__}", files, executable)


def encode(pristine: Pristine) -> bytes:
    """The stored form: deterministic gzip of sorted JSON (the same render gives the same bytes)."""
    document = {
        "generator": pristine.generator,
        "executable": sorted(pristine.executable),
        "files": pristine.files,
    }
    return gzip.compress(json.dumps(document, sort_keys=True).encode(), compresslevel=9, mtime=0)


def decode(data: bytes) -> Pristine:
    """A Pristine from its stored form; ValueError when it is not one."""
    try:
        document = json.loads(gzip.decompress(data))
        files = document["files"]
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
            raise TypeError("file texts must be strings")
        return Pristine(str(document["generator"]), dict(files), frozenset(document["executable"]))
    except (OSError, EOFError, KeyError, TypeError, AttributeError, json.JSONDecodeError) as error:
        raise ValueError(f"{PRISTINE} is damaged ({error})") from None


def record(project: Path, names: list[str], known: Mapping[str, str] | None = None) -> None:
    """Store the named files of a fresh render as the project's pristine copy."""
    target = project / PRISTINE
    target.parent.mkdir(exist_ok=True)
    target.write_bytes(encode(snapshot(project, names, known)))


def load(project: Path) -> Pristine:
    """The project's pristine copy; FileNotFoundError or ValueError when missing or damaged."""
    return decode((project / PRISTINE).read_bytes())
