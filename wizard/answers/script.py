"""The user's own training script: its path inside the project and its arguments, as answers.

`training.script` names the user's own file every rank runs, relative to the
project folder, whatever its name (`train.py` included: no name is reserved).
Left out (or empty), the ranks run the train.py npu-wizard generates. A set
script is "foreign": npu-wizard starts it through runtime/userscript.py and does
not render its own train.py.
"""

from __future__ import annotations

import posixpath
import shlex
from typing import Any


class Invalid(ValueError):
    """A script path or argument list that does not check; wizard.answers.spec reports it at its question."""


# The answer that picks the generated script: no script of the user's.
GENERATED_SCRIPT = ""
# The file npu-wizard generates when no script of the user's is named.
GENERATED_FILE = "train.py"
# What to do when a user's own train.py is where the generated one goes.
OWN_TRAIN_PY = (
    "to run your own train.py instead of the generated one, set `training.script: train.py` in the answers "
    "(npu-wizard then generates no train.py)"
)
# Folders npu-wizard writes (and replaces on update): a script there would be overwritten.
GENERATED_FOLDERS = ("launch", "runtime", "slurm", "k8s", "sysctl", ".npu-wizard", "runs", "checkpoints")
MAX_ARGS = 256
MAX_ARG_LENGTH = 4096


def is_foreign(script: str | None) -> bool:
    """Whether `script` names the user's own file (any name), rather than leaving the generated train.py."""
    return script not in (None, GENERATED_SCRIPT)


def script_file(script: str | None) -> str:
    """The file every rank runs: the user's script, else the generated train.py."""
    return script if script else GENERATED_FILE


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
