"""The compiled-template cache: jinja2's bytecode of the project templates, kept between renders.

An entry is Python code that a render runs, so the cache is used only in a
folder that is the user's own and that no one else can write: a folder owned
by another user, writable by the group or others, or a symlink is passed by
(the render goes on without it, with a note). Each read and write goes
through the folder opened without following links and checked again, so a
folder swapped after the check is never used. An entry is never unpickled:
its header must equal, byte for byte, the one this render would write (the
template source's checksum); a damaged or stale entry is deleted and the
template compiled anew.
"""

from __future__ import annotations

import hashlib
import marshal
import os
import pickle
import secrets
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from types import CodeType
from typing import TYPE_CHECKING

import jinja2
from jinja2.bccache import Bucket, BytecodeCache, bc_magic

if TYPE_CHECKING:
    from jinja2 import Environment

CACHE_VARIABLE = "NPU_WIZARD_CACHE_DIR"
_LARGEST_ENTRY = 16 * 1024 * 1024
_OPEN_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def cache_root(env: Mapping[str, str]) -> Path | None:
    """The cache folder `env` names: $NPU_WIZARD_CACHE_DIR, $XDG_CACHE_HOME/npu-wizard or $HOME/.cache/npu-wizard.

    None where there is none: NPU_WIZARD_CACHE_DIR='' turns the cache off, and
    without an absolute HOME (unset, empty) there is no home to keep it in.
    """
    if env.get(CACHE_VARIABLE) == "":
        return None
    if env.get(CACHE_VARIABLE):
        return Path(env[CACHE_VARIABLE]).absolute()
    for base, below in ((env.get("XDG_CACHE_HOME", ""), ""), (env.get("HOME", ""), ".cache")):
        if os.path.isabs(base):
            return Path(base, below, "npu-wizard")
    return None


def template_cache(env: Mapping[str, str] | None = None) -> tuple[PrivateBytecodeCache | None, str]:
    """The cache of compiled templates (or None) and, where a folder was passed by, a one-line note why.

    Compiling the project's templates is most of a render's time; like
    Python's own __pycache__ this cache only saves work (delete it freely).
    A folder that cannot be made (no home, a read-only disk) means no cache,
    silently: a render never fails for want of one.
    """
    root = cache_root(os.environ if env is None else env)
    if root is None:
        return None, ""
    try:
        _make_private(root)
    except OSError:
        return None, ""
    # Nothing is made in a folder before it is found to be the user's own: templates/ is made through the root
    # opened and checked, never through a link or in a folder another user could write.
    problem = unsafe_folder(root)
    if problem:
        return None, _passed_by(root, problem)
    folder = root / "templates"
    try:
        problem = _make_inside(root, folder.name)
    except OSError:
        return None, ""
    if problem:  # the root changed since it was checked
        return None, _passed_by(root, problem)
    problem = unsafe_folder(folder)
    if problem:
        return None, _passed_by(folder, problem)
    return PrivateBytecodeCache(folder), ""


def _passed_by(folder: Path, problem: str) -> str:
    """The note of a cache folder not used for `problem`."""
    return (
        f"not using the template cache {folder}: {problem}; delete it, or set {CACHE_VARIABLE} "
        "to a folder of your own (renders are slower without it, never different)"
    )


def _make_inside(root: Path, name: str) -> str:
    """Make the folder `name` (mode 0700) in `root`, opened without following a link; why `root` may not hold it
    ('' where it may, and the folder is there)."""
    parent = os.open(root, _OPEN_FOLDER)
    try:
        problem = unsafe_folder(parent)
        if not problem:
            try:
                os.mkdir(name, 0o700, dir_fd=parent)
            except FileExistsError:
                pass  # made by an earlier render, or one beside this one: checked like any other
        return problem
    finally:
        os.close(parent)


def _make_private(folder: Path) -> None:
    """Make `folder` and any missing folder above it with mode 0700 (Path.mkdir's parents follow the umask)."""
    missing = []
    for path in (folder, *folder.parents):
        if os.path.lexists(path):
            break
        missing.append(path)
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass  # made meanwhile by a render beside this one: checked like any other


def unsafe_folder(folder: Path | int) -> str:
    """Why `folder` (a path, not followed, or an open folder) may not hold the cache; '' where it may."""
    try:
        info = os.fstat(folder) if isinstance(folder, int) else os.lstat(folder)
    except OSError as error:
        return f"it cannot be read ({error.strerror or error})"
    if stat.S_ISLNK(info.st_mode):
        return "it is a symlink"
    if not stat.S_ISDIR(info.st_mode):
        return "it is not a folder"
    if info.st_uid != os.getuid():
        return f"it belongs to uid {info.st_uid}, not to you (uid {os.getuid()})"
    writable = [who for who, bit in (("group", stat.S_IWGRP), ("others", stat.S_IWOTH)) if info.st_mode & bit]
    if writable:
        return f"it is writable by {' and '.join(writable)} (mode {stat.S_IMODE(info.st_mode):04o})"
    return ""


class PrivateBytecodeCache(BytecodeCache):
    """jinja2's bytecode cache in a folder only the user can write; a damaged entry is deleted, never fatal."""

    def __init__(self, directory: Path) -> None:
        self.directory = str(directory)

    def get_bucket(self, environment: Environment, name: str, filename: str | None, source: str) -> Bucket:
        """The bucket of a template, keyed by its name, file, source and the jinja2 and Python that compile it."""
        checksum = self.get_source_checksum(source)
        version = f"jinja2 {jinja2.__version__} python {sys.version_info[0]}.{sys.version_info[1]}"
        key = hashlib.sha256(f"{name}\0{filename}\0{checksum}\0{version}".encode()).hexdigest()
        bucket = Bucket(environment, key, checksum)
        self.load_bytecode(bucket)
        return bucket

    def load_bytecode(self, bucket: Bucket) -> None:
        """Fill `bucket` from its entry; an entry that is not exactly what this render would write is deleted."""
        folder = self._open_folder()
        if folder is None:
            return
        try:
            data = _read_entry(folder, _entry_name(bucket))
            if data is None:
                return
            code = _code_of(data, _header(bucket))
            if code is None:
                _remove(folder, _entry_name(bucket))
            else:
                bucket.code = code
        finally:
            os.close(folder)

    def dump_bytecode(self, bucket: Bucket) -> None:
        """Write the bucket's entry whole or not at all (a scratch file renamed into place); a failure is skipped."""
        if bucket.code is None:
            return
        folder = self._open_folder()
        if folder is None:
            return
        scratch = f".{_entry_name(bucket)}.{secrets.token_hex(8)}.tmp"
        try:
            entry = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=folder)
            with os.fdopen(entry, "wb") as out:
                out.write(_header(bucket) + marshal.dumps(bucket.code))
            os.replace(scratch, _entry_name(bucket), src_dir_fd=folder, dst_dir_fd=folder)
        except OSError:
            _remove(folder, scratch)
        finally:
            os.close(folder)

    def _open_folder(self) -> int | None:
        """The cache folder, opened without following a link, if it is still the user's own; else None."""
        try:
            folder = os.open(self.directory, _OPEN_FOLDER)
        except OSError:
            return None
        if unsafe_folder(folder):
            os.close(folder)
            return None
        return folder


def _entry_name(bucket: Bucket) -> str:
    return f"{bucket.key}.cache"


def _header(bucket: Bucket) -> bytes:
    """What an entry of `bucket` starts with: jinja2's magic and the pickled source checksum, as jinja2 writes it."""
    return bc_magic + pickle.dumps(bucket.checksum, 2)


def _read_entry(folder: int, name: str) -> bytes | None:
    """An entry's bytes, if it is a plain file of the user's that no one else can write; else None."""
    try:
        entry = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
    except OSError:
        return None
    with os.fdopen(entry, "rb") as source:
        info = os.fstat(source.fileno())
        mode = info.st_mode
        if not stat.S_ISREG(mode) or info.st_uid != os.getuid() or mode & (stat.S_IWGRP | stat.S_IWOTH):
            return None
        return source.read(_LARGEST_ENTRY + 1)


def _code_of(data: bytes, header: bytes) -> CodeType | None:
    """The compiled template in an entry, or None where it is damaged or for another source."""
    if len(data) > _LARGEST_ENTRY or not data.startswith(header):
        return None
    try:
        code = marshal.loads(data[len(header) :])
    except (EOFError, ValueError, TypeError):
        return None
    return code if isinstance(code, CodeType) else None


def _remove(folder: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=folder)
    except OSError:
        pass  # already gone, or made read-only: the next render compiles it again
