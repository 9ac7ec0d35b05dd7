"""The user's own training script: its path inside the project and its arguments, as answers.

`training.script` names the file every rank runs, relative to the project
folder; the default, `train.py`, is the script npu-wizard generates. Any other
file is "foreign": npu-wizard starts it through runtime/userscript.py and does
not render train.py.
"""

from __future__ import annotations

import posixpath
import shlex
from typing import Any


class Invalid(ValueError):
    """A script path or argument list that does not check; wizard.answers.spec reports it at its question."""


GENERATED_SCRIPT = "train.py"
# What to do when a user's own train.py is where the generated one goes.
OWN_TRAIN_PY = (
    "`training.script: train.py` names the model script npu-wizard generates; to use your own train.py, "
    "rename it (e.g. to my_train.py) and set training.script to that name"
)
# Folders npu-wizard writes (and replaces on update): a script there would be overwritten.
GENERATED_FOLDERS = ("launch", "runtime", "slurm", "k8s", "sysctl", ".npu-wizard", "runs", "checkpoints")
MAX_ARGS = 256
MAX_ARG_LENGTH = 4096


def is_foreign(script: str | None) -> bool:
    """Whether `script` is the user's own file rather than the generated train.py."""
    return script not in (None, GENERATED_SCRIPT)


def script_path(raw: Any) -> str:
    """A script path relative to the project folder, normalised; Invalid with the reason otherwise."""
    if not isinstance(raw, str):
        raise Invalid("must be a path relative to the project folder, such as train.py or src/main.py")
    text = raw.strip()
    if text.startswith(("/", "~")):
        raise Invalid("is absolute: give the path relative to the project folder, such as src/main.py")
    if ".." in text.split("/"):
        raise Invalid("leaves the project folder ('..'): the script must lie inside the project")
    if "\\" in text:
        raise Invalid("separate folders with '/', not '\\'")
    path = posixpath.normpath(text)
    if path.startswith("-"):
        raise Invalid("starts with '-': a launcher would read it as an option; rename the file")
    if not path.endswith(".py") or path.rsplit("/", 1)[-1] == ".py":
        raise Invalid("not a Python file: the script's name must end in .py")
    top = path.split("/", 1)[0]
    if "/" in path and top in GENERATED_FOLDERS:
        raise Invalid(f"lies in {top}/, which npu-wizard writes and replaces: move it elsewhere")
    return path


def script_args(raw: Any) -> tuple[str, ...]:
    """The script's arguments: a list of strings, or one line split as a shell splits it."""
    if isinstance(raw, str):
        try:
            items: Any = shlex.split(raw)
        except ValueError as error:  # an unclosed quote
            raise Invalid(f"cannot split the line into arguments: {error}") from None
    elif isinstance(raw, list | tuple):
        items = raw
    else:
        raise Invalid("must be a list of strings, such as [--data, /data/set, --epochs, '3']")
    if len(items) > MAX_ARGS:
        raise Invalid(f"{len(items)} arguments: at most {MAX_ARGS}")
    for index, item in enumerate(items, 1):
        if not isinstance(item, str):
            raise Invalid(f"argument {index} ({item!r}) is not a string: quote it, e.g. '{item}'")
        if len(item) > MAX_ARG_LENGTH:
            raise Invalid(f"argument {index} is too long: at most {MAX_ARG_LENGTH} characters")
    return tuple(items)


def args_text(args: tuple[str, ...] | list[str]) -> str:
    """Arguments as one shell-quoted line: how the wizard shows them and the template context carries them."""
    return shlex.join(args)
