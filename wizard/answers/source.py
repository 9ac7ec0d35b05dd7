"""Answers from where the user keeps them: a file, stdin, or a project's answers.yaml.

Reads the text with the limits every answers source shares (at most 4 MiB, UTF-8, a plain file where asked)
and hands it to wizard.answers.model; the CLI, `update` and `--edit` all come through here.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Sequence
from pathlib import Path

from wizard.answers.model import flatten
from wizard.answers.strict_yaml import MAX_BYTES, read_document
from wizard.errors import FILE, NO_VALUE, AnswersError, Problem, TargetError


def read_answers_text(source: str, plain_file_only: bool = False) -> str:
    """An answers file's text (at most 4 MiB is read); `plain_file_only` refuses what is not a plain file."""
    if source == "-":
        data = sys.stdin.buffer.read(MAX_BYTES * 4 + 1)
        if len(data) > MAX_BYTES * 4:
            raise TargetError(f"the answers on stdin hold over 4 MiB; at most {MAX_BYTES:,} characters are read")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as error:
            raise TargetError(
                f"the answers on stdin are not UTF-8 text (byte {data[error.start]:#04x} at offset {error.start})"
            ) from None
    try:
        if plain_file_only and not stat.S_ISREG(os.stat(source).st_mode):
            raise TargetError(
                f"{source} is not a plain file (a FIFO, a device or a folder): a project's answers.yaml is one; "
                "put back the answers the project was rendered from"
            )
        with open(source, "rb") as file:
            data = file.read(MAX_BYTES * 4 + 1)  # UTF-8 text of MAX_BYTES characters; /dev/zero never ends
        if len(data) > MAX_BYTES * 4:
            raise TargetError(f"answers file {source} holds over 4 MiB; at most {MAX_BYTES:,} characters are read")
        return data.decode("utf-8")
    except FileNotFoundError:
        raise TargetError(f"answers file {source} does not exist") from None
    except UnicodeDecodeError as error:
        raise TargetError(f"answers file {source} is not UTF-8 text (bad byte at offset {error.start})") from None
    except OSError as error:
        raise TargetError(f"cannot read answers file {source}: {error.strerror or error}") from None


def answers_base(source: str) -> Path:
    """The folder a relative path in an answers file is taken from: the file's own (stdin: the current one)."""
    return Path.cwd() if source == "-" else Path(source).absolute().parent


def print_warnings(warnings: Sequence[Problem]) -> None:
    """Each warning on stderr, one a line."""
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)


def answers_to_edit(source: str | None) -> tuple[dict[str, object], list[Problem], Path]:
    """`--edit`: raw answers to pre-fill the wizard from; problems in them are shown in the wizard, not refused."""
    if source in (None, "-"):
        raise TargetError("--edit needs an answers file to start from: npu-wizard --answers FILE --edit")
    text = read_answers_text(source)
    document = read_document(text) if text.strip() else {}
    if not isinstance(document, dict):
        raise AnswersError([Problem(FILE, NO_VALUE, "the answers file must be a mapping of answers (key: value)")])
    raw, problems = flatten(document)
    return raw, problems, Path(source)
