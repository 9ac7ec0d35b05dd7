"""The code a Kubernetes pod gets of the project, carried in one ConfigMap, and how the pod puts it back.

The pods need the code, never the data (that comes from the data volume):
the runtime, the launch scripts, the answers, and every Python file a rank
can import as launch/run-node.sh starts it. A rank runs from the project
folder with the script's folder first on sys.path and, for a user's script,
the project folder on PYTHONPATH (for train.py the two are the same). So the
pods get the script's folder tree (src/**/*.py for a user's src/main.py), the
top-level modules and every top-level folder a rank can import: a package
(with __init__.py) or a namespace package (without), sub-folders included.
Hidden folders, runs/, checkpoints/, caches, virtual environments (venv or conda) and the
data folder are never code: the data folder is train.py's training.data_dir,
or data/ where the pods mount a data volume for a user's script (which has
no data folder otherwise, so its data/ is code like any other). Nor is a
symbolic link, to a file or a folder: the pods get the project's own files,
never what a link points to (which may lie anywhere on this machine).

A ConfigMap key cannot hold a '/', so each file travels under a key of its
own and the key LAYOUT_KEY lists each key and, after a space, the path it
goes back to; each pod's command (`restore_command`) copies every file there. The job
mounts the whole ConfigMap, so a file added to the project travels with the
next `npu-wizard run`, which writes the ConfigMap again.
"""

from __future__ import annotations

import json
import keyword
import os
import posixpath
import re
import shlex
import stat
from pathlib import Path

from wizard.answers.script import is_foreign
from wizard.errors import WizardError, shown

LAYOUT_KEY = "npu-wizard.paths"  # never a file's key: those end in .py, .sh, .txt or .yaml
# `npu-wizard run` submits with `kubectl apply --server-side`: client-side apply would keep the whole object, as
# JSON, in its kubectl.kubernetes.io/last-applied-configuration annotation, which the API server refuses over
# 256 KiB ("metadata.annotations: Too long"); server-side apply keeps only the keys' owners (managedFields).
# A ConfigMap's data may come to 1 MiB: the files' JSON (keys, escapes and all) may take 1000 KiB, leaving the rest
# for the name, namespace, labels and managedFields.
CONFIGMAP_LIMIT = 1000 * 1024
# Go's JSON (kubectl's) escapes these where Python's does not ('<' as \u003c): at most 5 bytes more each.
_GO_ESCAPED = re.compile("[<>&\u2028\u2029]")
KEY_LIMIT = 253
BIGGEST_SHOWN = 5
_NOT_KEY = re.compile(r"[^-._a-zA-Z0-9]")
# Folders that hold no code the pods need, wherever they are.
_NEVER_CODE = frozenset({"__pycache__", "runs", "checkpoints", "site-packages", "node_modules"})


class ConfigMapError(WizardError):
    """The project's code cannot travel in one ConfigMap."""


class ConfigMapTooLarge(ConfigMapError):
    """The project's code does not fit in one ConfigMap."""


def project_files(project: Path, script: str | None = None, data_dir: str | None = None) -> list[str]:
    """The files a pod needs, relative to the project: the code, the launch scripts, the answers.

    The user's own `script` (training.script) is listed even before it exists: the ConfigMap carries it once it
    is there. `data_dir`, the project's data folder in the pods (`pods_data_folder`; None where it has none), is
    never carried, whatever it holds.
    """
    skip = _inside(data_dir)
    if is_foreign(script):
        _refuse_linked_script(project, str(script))
    names = code_files(project, script, skip)
    if is_foreign(script):
        names.append(str(script))
    names += _tree(project, "runtime", skip)
    names += sorted(p.relative_to(project).as_posix() for p in (project / "launch").glob("*.sh") if _own(project, p))
    names += [name for name in ("requirements.txt", "answers.yaml") if _own(project, project / name)]
    return list(dict.fromkeys(names))  # in this order, each once (runtime/ is a top-level package too)


def folder_files(repository: Path, folder: str, script: str | None, data_dir: str | None = None) -> list[str]:
    """The files a pod needs of a project that is the folder `folder` of `repository`, relative to the repository:
    the repository's code as its ranks import it from the repository's root (the script's folder tree, the
    top-level modules and packages: `code_files`), the user's script, and the project's own files in `folder`
    (its runtime, launch scripts and answers). `data_dir`, the data folder of the pods relative to the
    repository's root, is never carried."""
    if is_foreign(script):
        _refuse_linked_script(repository, str(script))
    names = [
        name
        for name in code_files(repository, script, _inside(data_dir))
        if not name.startswith(folder + "/")  # the project's folder: its own files below, never its runs
    ]
    if is_foreign(script):
        names.append(str(script))
    names += [f"{folder}/{name}" for name in project_files(repository / folder)]
    return list(dict.fromkeys(names))


def check_fits(repository: Path, names: list[str], more: dict[str, str]) -> None:
    """ConfigMapTooLarge when the files `names` of `repository` and the texts `more` (path: text, files not
    written yet) are over what one ConfigMap carries."""
    data = configmap_data(repository, names)
    size = sum(_applied_size(key, text) for key, text in data.items())
    size += sum(_applied_size(configmap_keys([name])[name], text) for name, text in more.items())
    if size > CONFIGMAP_LIMIT:
        sizes = {name: len(text.encode()) for name, text in more.items()}
        layout = dict(line.split(" ", 1) for line in data[LAYOUT_KEY].splitlines())
        sizes.update({layout[key]: len(text.encode()) for key, text in data.items() if key != LAYOUT_KEY})
        raise _too_large(str(size), sorted(sizes.items(), key=lambda item: -item[1]))


def pods_data_folder(script: str | None, data_dir: str | None, data_volume: bool) -> str | None:
    """The project's data folder in the pods: train.py's training.data_dir (data/ by default); for a user's
    script, which has none, data/ only where the pods mount a data volume there (`data_volume`)."""
    if is_foreign(script):
        return "data" if data_volume else None
    return data_dir or "data"


def code_files(project: Path, script: str | None, skip: str = "") -> list[str]:
    """Every Python file a rank can import as launch/run-node.sh starts it: the script's folder tree (first on
    sys.path), the top-level modules and the top-level packages and namespace packages (the project folder)."""
    folder = posixpath.dirname(script) if is_foreign(script) else ""
    names = _tree(project, folder, skip) if folder else []
    names += sorted(path.name for path in project.glob("*.py") if _own(project, path) and not path.name.startswith("."))
    for package in sorted(project.iterdir()) if project.is_dir() else []:
        if _importable(package.name) and package.is_dir() and not package.is_symlink():
            names += _tree(project, package.name, skip)
    return names


def _importable(name: str) -> bool:
    """Whether `import name` can find a folder of that name on sys.path (a package, or a namespace package)."""
    return name.isidentifier() and not keyword.iskeyword(name)


def _tree(project: Path, folder: str, skip: str) -> list[str]:
    """Every *.py file under `folder` of `project`, never in a folder that holds no code, never a link nor
    through one (os.walk follows none, but would start in a linked `folder`)."""
    if _linked(project, folder):
        return []
    found = []
    for place, dirs, files in os.walk(project / folder):
        relative = Path(place).relative_to(project).as_posix()
        if not _is_code_folder(Path(place), relative, skip):
            dirs[:] = []
            continue
        dirs[:] = sorted(name for name in dirs if not name.startswith(".") and not os.path.islink(Path(place, name)))
        found += [
            f"{relative}/{name}" for name in sorted(files) if name.endswith(".py") and _own(project, Path(place, name))
        ]
    return found


def _linked(project: Path, name: str) -> str:
    """The first part of the project path `name` that is a symbolic link ("" when none is)."""
    parts = Path(name).parts
    for depth in range(1, len(parts) + 1):
        if os.path.islink(project.joinpath(*parts[:depth])):
            return "/".join(parts[:depth])
    return ""


def _own(project: Path, path: Path) -> bool:
    """Whether `path` is a regular file of `project`: no link on its way, and inside the project once resolved."""
    try:
        name = path.relative_to(project).as_posix()
        regular = stat.S_ISREG(os.lstat(path).st_mode)
        return regular and not _linked(project, name) and path.resolve().is_relative_to(project.resolve())
    except (OSError, ValueError):
        return False


def _refuse_linked_script(project: Path, script: str) -> None:
    """ConfigMapError when the user's `script` is, or lies in a folder that is, a symbolic link."""
    link = _linked(project, script)
    if link:
        raise ConfigMapError(
            f"training.script {shown(script)}: {shown(link)} is a symbolic link, and the pods get the project's own "
            "files, never what a link points to: put the file itself there"
        )


def _is_code_folder(path: Path, relative: str, skip: str) -> bool:
    """Whether a folder may hold code the pods need: not data, runs, checkpoints, caches or a virtual environment."""
    return (
        relative != skip
        and path.name not in _NEVER_CODE
        and not path.name.startswith(".")
        and not (path / "pyvenv.cfg").exists()  # a virtual environment
        and not (path / "conda-meta").is_dir()  # a conda environment (conda create -p), which has no pyvenv.cfg
    )


def _inside(data_dir: str | None) -> str:
    """The data folder as a project-relative path ("" when there is none, or it lies outside the project)."""
    if data_dir is None:
        return ""
    folder = posixpath.normpath(data_dir)
    return "" if folder.startswith(("/", "..")) else folder


def configmap_data(project: Path, names: list[str], prefix: str = "") -> dict[str, str]:
    """The ConfigMap's data: each existing file under its key, and LAYOUT_KEY naming each key's path (with
    `prefix` before it: the project's folder in the repository, where its files go back to in a pod)."""
    present = [name for name in names if _own(project, project / name)]
    keys = configmap_keys(present)
    data: dict[str, str] = {}
    for name in present:
        if name != name.strip() or any(ord(character) < 32 for character in name):
            raise ConfigMapError(
                f"{shown(name)}: a file name that starts or ends with a space, or holds a tab or a line break, "
                "cannot travel to the pods; rename it"
            )
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigMapError(
                f"{os.fsencode(name)!r}: a file name that is not UTF-8 cannot travel to the pods (the ConfigMap "
                "names each file's path in text); rename it"
            ) from None
    # A file's bytes are at most what its JSON takes: the sizes on disk refuse a project far over the limit (a
    # dataset of gigabytes in the script's folder) before a byte is read; each read then stops past the limit.
    on_disk = {name: _file_size(project, name) for name in present}
    if sum(on_disk.values()) > CONFIGMAP_LIMIT:
        raise _too_large(f"at least {sum(on_disk.values())}", sorted(on_disk.items(), key=lambda item: -item[1]))
    for name in present:
        try:
            data[keys[name]] = _read_head(project, name, CONFIGMAP_LIMIT + 1).decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigMapError(
                f"{shown(name)} is not UTF-8 text, and a ConfigMap carries text: save it as UTF-8 (iconv -t UTF-8)"
            ) from None
    data[LAYOUT_KEY] = "".join(f"{keys[name]} {prefix}{name}\n" for name in present)
    _check_size(data, {keys[name]: name for name in present})
    return data


def _file_size(project: Path, name: str) -> int:
    """The size of the file `name` of `project` on disk (ConfigMapError when it cannot be read)."""
    try:
        return os.lstat(project / name).st_size
    except OSError as error:
        raise _unreadable(name, error) from None


def _read_head(project: Path, name: str, limit: int) -> bytes:
    """At most `limit` bytes of the file `name` of `project` (one that grew since it was measured is over the
    limit)."""
    try:
        with (project / name).open("rb") as stream:
            return stream.read(limit)
    except OSError as error:
        raise _unreadable(name, error) from None


def _unreadable(name: str, error: OSError) -> ConfigMapError:
    return ConfigMapError(
        f"{shown(name)} cannot be read ({error.strerror or error}), and the pods get it: make it readable, or "
        "move it out of the project's code"
    )


def configmap_keys(names: list[str]) -> dict[str, str]:
    """A ConfigMap key for each project path, each unique ('/' and any other character a key refuses become '.'
    and '_'), so `src/model.py` travels as `src.model.py`."""
    keys: dict[str, str] = {}
    taken = {LAYOUT_KEY}
    for name in sorted(names):
        base = _NOT_KEY.sub("_", name.replace("/", "."))[: KEY_LIMIT - 8]
        key, count = base, 1
        while key in taken:
            count += 1
            key = f"{base}-{count}"
        keys[name] = key
        taken.add(key)
    return keys


def _check_size(data: dict[str, str], paths: dict[str, str]) -> None:
    """ConfigMapTooLarge naming the biggest files when `data` is over what a ConfigMap can carry."""
    sizes = {key: _applied_size(key, text) for key, text in data.items()}
    size = sum(sizes.values())
    if size <= CONFIGMAP_LIMIT:
        return
    biggest = sorted(paths, key=lambda key: -sizes[key])
    raise _too_large(str(size), [(paths[key], len(data[key].encode())) for key in biggest])


def _too_large(size: str, biggest: list[tuple[str, int]]) -> ConfigMapTooLarge:
    """ConfigMapTooLarge for code of `size` bytes as kubectl sends it, naming the first of `biggest`
    ((path, bytes), biggest first)."""
    listed = ", ".join(f"{shown(name)} ({count} bytes)" for name, count in biggest[:BIGGEST_SHOWN])
    return ConfigMapTooLarge(
        f"the project's code comes to {size} bytes as kubectl sends it, over the {CONFIGMAP_LIMIT} a "
        f"ConfigMap can carry (1 MiB, less room for its name and labels); the biggest: {listed}. "
        "The pods get code only (data comes from the data volume): move data out of the script's folder, or build "
        "the code (the repository, for a project in a folder of one) into the image, or put it on a volume, and "
        "drop the project volume from the manifest"
    )


def _applied_size(key: str, text: str) -> int:
    """The bytes of `"key": "text",` in the JSON kubectl sends (an upper bound)."""
    encoded = json.dumps({key: text}, ensure_ascii=False).encode()
    return len(encoded) + 5 * len(_GO_ESCAPED.findall(text))


def restore_command(source: str, workdir: str) -> str:
    """Shell that copies each file of the mounted ConfigMap at `source` to its path under `workdir`."""
    source, workdir = shlex.quote(source), shlex.quote(workdir)
    return (
        f"mkdir -p {workdir}; while read -r key path; do "
        f'mkdir -p "$(dirname {workdir}/"$path")"; cp -L {source}/"$key" {workdir}/"$path"; '
        f"done < {source}/{LAYOUT_KEY}"
    )
