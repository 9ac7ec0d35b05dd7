"""`npu-wizard bundle RUN [-o FILE] [--force]`: write the run's bundle, never over a file without --force."""

from __future__ import annotations

import io
import os
import tarfile
import time
from pathlib import Path

from runtime.provenance import REDACTED
from wizard.bundle.collect import Bundle, collect
from wizard.bundle.redact import Redactor
from wizard.errors import TargetError
from wizard.monitor.attach import run_folder_path
from wizard.monitor.run_files import RunFileError
from wizard.run.secret_marks import MARKS_FILE, SecretMarks, read_secret_marks


def bundle(path: Path, output: Path | None = None, *, force: bool = False) -> Path:
    """Bundle the run folder at `path` (or the newest run of the project there) into `output`; return its path.

    Default: RUN/bundle-<UTC time>.tar.gz. An existing file there is replaced only with `force`, and nothing
    is written anywhere else (the archive is made beside its target and moved in place).
    """
    if not path.exists():
        raise TargetError(f"{path}: no such run folder")
    if not path.is_dir():
        raise TargetError(f"{path} is not a folder: give a run folder (runs/<stamp>) or a project folder")
    run_dir = run_folder_path(path)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = (output if output is not None else run_dir / f"bundle-{stamp}.tar.gz").absolute()
    _refuse_target(target, force)
    env = dict(os.environ)
    marks = read_secret_marks(run_dir)
    try:
        found = collect(run_dir, Redactor.from_env(env, marks), env)
    except RunFileError as refused:  # a file of the run folder that is no regular file, or cannot be read
        raise TargetError(f"{refused}; nothing was written") from None
    found.secrets_note = _secrets_note(marks, env)
    archive = _archive(run_dir, found, stamp)
    _write(target, archive, force)
    return target


def _secrets_note(marks: SecretMarks | None, env: dict[str, str]) -> str:
    """What the manifest says of the job's own secret values: found by the runner's marks, or not checked."""
    if marks is None:
        return (
            f"Not checked: this run holds no secret marks ({MARKS_FILE}: its runner wrote none, or it cannot be "
            "read), so a secret value the job printed without its name is removed only where this shell has the "
            "same variable set; bundle from the job's shell, or read the logs before sending."
        )
    if not marks.names():
        return ""
    return f"Also removed wherever they appear: the values of {', '.join(marks.names())}, as the runner marked them."


def bundle_line(run_dir: Path) -> str:
    """The line `run` prints after a failure or a hang."""
    return f"for whoever must help: npu-wizard bundle {run_dir}"


def _refuse_target(target: Path, force: bool) -> None:
    if target.is_dir():
        raise TargetError(f"-o {target}: that is a folder; give a file name for the bundle")
    if (target.exists() or target.is_symlink()) and not force:
        raise TargetError(f"{target} is there already; nothing was written (add --force to replace it)")
    if not target.parent.is_dir():
        raise TargetError(f"-o {target}: the folder {target.parent} does not exist")


def manifest(run_dir: Path, found: Bundle, stamp: str) -> bytes:
    lines = [
        f"npu-wizard bundle of {run_dir}, written {stamp}",
        f"Secrets removed: the status token and the value of every variable whose name says TOKEN, KEY, SECRET, "
        f"PASSWORD or CREDENTIAL, and every secret of a known shape (sshpass -p, a URL's password, a bearer header, "
        f"mysql -p, hf_ and other service tokens) read {REDACTED}; NPU_WIZARD_SSH_COMMAND keeps only its program.",
        *([found.secrets_note] if found.secrets_note else []),
        "",
        "In this bundle:",
        *(f"  {line}" for line in found.included),
        "",
        "Missing, and why:",
        *(f"  {line}" for line in found.missing or ["nothing"]),
    ]
    return ("\n".join(lines) + "\n").encode()


def _archive(run_dir: Path, found: Bundle, stamp: str) -> bytes:
    top = f"bundle-{stamp}"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in [("MANIFEST.txt", manifest(run_dir, found, stamp)), *found.members]:
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _write(target: Path, data: bytes, force: bool) -> None:
    """Write beside `target` and move it in: without `force`, a file that appeared meanwhile is kept."""
    temporary = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as error:
        raise TargetError(f"cannot write beside {target}: {error.strerror or error}") from error
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        if force:
            os.replace(temporary, target)
        else:
            os.link(temporary, target)  # fails, never replaces, where a file is there
    except FileExistsError as error:
        raise TargetError(f"{target} is there already; nothing was written (add --force to replace it)") from error
    except OSError as error:
        raise TargetError(f"cannot write {target}: {error.strerror or error}") from error
    finally:
        temporary.unlink(missing_ok=True)
