"""Writing a file so that a reader never sees half of it: a new file beside it, moved into place.

The run folder's records (run.json, summary.json, bandwidth.json, the ask files of RUN/hang/) and the report
are written this way.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write `data` atomically (a reader never sees half a file)."""
    write_atomically(path, (json.dumps(data, indent=2, default=str) + "\n").encode())


def write_atomically(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a new temporary file beside it, moved into place (mode 0666 less the umask).

    The temporary file is made with a name of its own (O_EXCL): a link someone planted in a shared run folder
    is never followed, and `path` itself, a link or not, is replaced, never written through.
    """
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            os.fchmod(file.fileno(), 0o666 & ~_umask())  # what open() gives a new file; mkstemp's is always 0600
            file.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _umask() -> int:
    """The process's umask: read from /proc where it says, else set to 077 and put back at once."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)  # a file another thread makes meanwhile is private, never open to all
    os.umask(mask)
    return mask
