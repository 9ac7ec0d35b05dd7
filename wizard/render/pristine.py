"""The project as generated, kept inside it: the base of `npu-wizard update`'s three-way merge.

Every render stores its files, untouched, in `.npu-wizard/pristine.json.gz`
(about 120 KB with the runtime copy; the per-node scripts compress to almost
nothing). An update
merges the user's edits (their copy against this base) with the generator's
changes (a new render against this base), whichever npu-wizard version
rendered the base.
"""

from __future__ import annotations

import gzip
import json
import os
import posixpath
import stat
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from wizard import __version__
from wizard.render.generated import RENAMED, name_problem

# the repository's folder facts live in wizard.render.repository (k8s reads them too); named here as before
from wizard.render.repository import REPOSITORY_MARKER as REPOSITORY_MARKER
from wizard.render.repository import STATE_DIR as STATE_DIR
from wizard.render.repository import repository_folder as repository_folder
from wizard.render.repository import repository_root as repository_root

PRISTINE = f"{STATE_DIR}/pristine.json.gz"
INTO_MARKER = f"{STATE_DIR}/into"  # a folder of the user's that npu-wizard rendered into (wizard.render.into)
# The most a pristine copy may unpack to: a 4096-node project's unpacks to about 2 MiB, a gzip bomb to gigabytes.
MAX_UNPACKED = 64 * 1024 * 1024
UNPACK_STEP = 1024 * 1024  # unpacked a MiB at a time: never a second copy of the whole


@dataclass(frozen=True)
class Pristine:
    """The files of a render as it wrote them, and which of them are executable."""

    generator: str
    files: dict[str, str]
    executable: frozenset[str]


def is_into(folder: Path) -> bool:
    """Whether `folder` was rendered --into: its marker, or (the state lost) NPU-WIZARD.md in place of README.md."""
    return os.path.lexists(folder / INTO_MARKER) or (folder / RENAMED["README.md"]).is_file()


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
    # level 1: 3.6 ms a render against 12.7 at zlib's default 6, for 139 KB against 116 KB of a 385 KB document
    # (the 1 x 2 CPU project); level 9 took 25 ms for 0.4% fewer bytes than 6
    return gzip.compress(json.dumps(document, sort_keys=True).encode(), compresslevel=1, mtime=0)


def same_copy(stored: bytes, new: bytes) -> bool:
    """Whether the stored copy holds what `new` holds, whatever gzip level wrote it (a no-op update then writes none).

    A damaged or missing (empty) stored copy never matches.
    """
    if stored == new:
        return True
    try:
        return decode(stored) == decode(new)
    except ValueError:
        return False


def decode(data: bytes) -> Pristine:
    """A Pristine from its stored form; ValueError when it is not one."""
    try:
        document = json.loads(_gunzip(data, MAX_UNPACKED))
        files = document["files"]
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
            raise TypeError("file texts must be strings")
        executable = document["executable"]
        if not isinstance(executable, list) or not all(isinstance(name, str) for name in executable):
            raise TypeError("executable must be a list of names")
        strays = [name for name in [*files, *executable] if not is_project_name(name)]
        if strays:
            raise ValueError(f"{strays[0]!r} is not a file name inside a project")
        # Whoever wrote the copy wrote its names: an update removes what it names, so only what a render writes.
        foreign = next(((name, problem) for name in files if (problem := name_problem(name))), None)
        if foreign:
            raise ValueError(f"{foreign[0]!r} {foreign[1]}")
        return Pristine(str(document["generator"]), dict(files), frozenset(executable))
    except (ValueError, EOFError, KeyError, TypeError, AttributeError, RecursionError, zlib.error) as error:
        raise ValueError(f"{PRISTINE} is damaged ({error})") from None


def _gunzip(data: bytes, limit: int) -> bytes:
    """The gzip `data` unpacked, refused (ValueError) past `limit` bytes without unpacking more than that."""
    out = bytearray()
    while data:  # one gzip member after another, as gzip.decompress reads them
        unpacker = zlib.decompressobj(wbits=31)
        pending = data
        while not unpacker.eof:
            chunk = unpacker.decompress(pending, min(UNPACK_STEP, limit + 1 - len(out)))
            out += chunk
            if len(out) > limit:
                raise ValueError(
                    f"it unpacks to more than {limit // 2**20} MiB; a real project's copy unpacks to a few MiB"
                )
            pending = unpacker.unconsumed_tail
            if not pending and not chunk and not unpacker.eof:
                raise EOFError("it ends before its gzip stream does: truncated")
        data = unpacker.unused_data
    return bytes(out)


def is_project_name(name: str) -> bool:
    """Whether `name` is a normalised relative path inside a project (never absolute, never through ..)."""
    return (
        name not in ("", ".")
        and not name.startswith("/")
        and posixpath.normpath(name) == name
        and ".." not in name.split("/")
        and "\0" not in name
        and is_generated(name)
    )


def record(project: Path, names: list[str], known: Mapping[str, str] | None = None) -> None:
    """Store the named files of a fresh render as the project's pristine copy."""
    target = project / PRISTINE
    target.parent.mkdir(exist_ok=True)
    target.write_bytes(encode(snapshot(project, names, known)))


def load(project: Path) -> Pristine:
    """The project's pristine copy; FileNotFoundError or ValueError when missing or damaged."""
    return decode(read_stored(project))


def read_stored(project: Path) -> bytes:
    """The stored bytes of the project's pristine copy, read only from a regular file of a sane size."""
    path = project / PRISTINE
    if (project / STATE_DIR).is_symlink():  # never read through a link
        raise ValueError(f"{PRISTINE} is damaged ({STATE_DIR} is a symbolic link)")
    info = path.lstat()
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(f"{PRISTINE} is damaged (not a regular file)")
    if info.st_size > MAX_UNPACKED:
        raise ValueError(f"{PRISTINE} is damaged ({info.st_size} bytes; a real project's copy is kilobytes)")
    return path.read_bytes()
