"""Quoting for the shell at render time: the `sh` filter of every template.

Every value a template writes into a shell script goes through `sh`, so a
value that slipped past the answer checks is still one inert word. Both render
paths register it: npu-wizard's own environments (`template_environment`) and
plain cookiecutter, whose cookiecutter.json names `ShellQuote` in `_extensions`.
"""

from __future__ import annotations

import re
import shlex

import jinja2
from jinja2.ext import Extension

EXTENSION = f"{__name__}.ShellQuote"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def sh(value: object) -> str:
    """`value` as one bash word on one line: shlex.quote, or $'...' when it holds control characters."""
    text = str(value)
    if not _CONTROL.search(text):
        return shlex.quote(text)
    # A newline inside '...' would still be data, but one in a comment line would
    # start a command: ANSI-C quoting keeps the word on a single line.
    return "$'" + "".join(_ansi_c(char) for char in text) + "'"


def _ansi_c(char: str) -> str:
    if char in "\\'":
        return "\\" + char
    if _CONTROL.match(char):
        return f"\\x{ord(char):02x}"
    return char


def shell_words(text: object) -> list[str]:
    """A context value that carries a list as shell words (training.script_args) back as the list."""
    return shlex.split(str(text))


class ShellQuote(Extension):
    """Jinja extension that adds the `sh` and `shell_words` filters (for cookiecutter's `_extensions`)."""

    def __init__(self, environment: jinja2.Environment) -> None:
        super().__init__(environment)
        environment.filters["sh"] = sh
        environment.filters["shell_words"] = shell_words


def template_environment() -> jinja2.Environment:
    """The Jinja environment npu-wizard renders its own templates with (strict, `sh` filter)."""
    return jinja2.Environment(
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        extensions=[ShellQuote, "wizard.answers.release_facts.ReleaseFacts"],
    )
