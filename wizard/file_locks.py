"""File systems that take no flock: NFS without lockd, Lustre mounted without `-o flock`.

There `flock` fails with ENOLCK, EOPNOTSUPP or ENOSYS. The run and update
locks then go ahead unlocked, and say so in one line that names the file
system (its type and mount point, from /proc/self/mountinfo) and what is not
guarded.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

NO_LOCKS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS})
MOUNTINFO = Path("/proc/self/mountinfo")


def takes_no_locks(error: OSError) -> bool:
    """Whether `error` from flock says the file system takes no locks (rather than a held lock or a bad file)."""
    return error.errno in NO_LOCKS


def file_system(path: Path, mountinfo: Path = MOUNTINFO) -> str:
    """The file system `path` lies on, as 'nfs4 mounted at /shared'; 'its file system' where that cannot be told."""
    where = os.path.realpath(path)
    try:
        lines = mountinfo.read_text(errors="replace").splitlines()
    except OSError:
        return "its file system"
    best: tuple[str, str] | None = None
    for line in lines:
        fields, _, after = line.partition(" - ")
        parts, kind = fields.split(), after.split()
        if len(parts) < 5 or not kind:
            continue
        mount_point = _unescaped(parts[4])
        inside = where == mount_point or where.startswith(mount_point.rstrip("/") + "/")
        if inside and (best is None or len(mount_point) >= len(best[1])):  # the last of equal mounts is on top
            best = (kind[0], mount_point)
    return f"{best[0]} mounted at {best[1]}" if best else "its file system"


def unlocked_warning(path: Path, error: OSError, unguarded: str) -> str:
    """The one line that says `path` could not be locked, on which file system, and what goes unguarded."""
    return (
        f"{path.parent} is on {file_system(path.parent)}, which takes no file locks (flock: {error.strerror}): "
        f"{unguarded}; for the lock, mount it with locking (NFS: with lockd, without nolock; Lustre: -o flock) "
        "or keep the project on a local disk"
    )


def _unescaped(field: str) -> str:
    """A mountinfo path: space, tab, newline and backslash are written as octal escapes."""
    for code in ("040", "011", "012", "134"):
        field = field.replace("\\" + code, chr(int(code, 8)))
    return field
