"""Taking secrets out: the status token and every variable whose name says TOKEN, KEY, SECRET, PASSWORD or
CREDENTIAL, in JSON (by key, {"name": NAME, "value": ...}, an argv's word after --NAME) and in text (NAME=value,
NAME: value, 'NAME': 'value', a quoted value whole, --NAME value, and known values anywhere); secrets of a known
shape (sshpass -p, a URL's password, a bearer header, mysql -p, hf_ tokens: runtime/secret_shapes.py) wherever
they are; NPU_WIZARD_SSH_COMMAND as its program only. ssh's options that say KEY (StrictHostKeyChecking, ...)
are settings, not secrets.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from runtime.provenance import HIDDEN
from runtime.secret_shapes import REDACTED, SSH_COMMAND_VARIABLE, program_only, scrub
from runtime.status import ENV_STATUS_TOKEN
from wizard.run.secret_marks import SecretMarks

WORDS = r"(?:TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL)"
# starts where a run of name characters starts: a match from inside a run would be one from its start anyway,
# and trying every start of a long run (a line of progress dots) took time quadratic in its length
NAME = rf"[A-Za-z0-9_.-]*{WORDS}[A-Za-z0-9_.-]*"
AT_START = r"(?<![A-Za-z0-9_.-])"
# the value: the marker itself, a quoted string (all of it, spaces included), or a word
VALUE = rf"""(?P<value>{re.escape(REDACTED)}|"[^"\n]*"|'[^'\n]*'|[^\s'",;}}\]]+)"""
# a name that says a secret, an optional closing quote, = or :, then the value
ASSIGNMENT = re.compile(rf"(?P<name>{AT_START}{NAME})(?P<sep>['\"]?\s*[=:]\s*['\"]??){VALUE}", re.IGNORECASE)
# a command line's option that says a secret, then its value as the next word: --api-key VALUE
OPTION = re.compile(rf"(?P<name>(?<![^\s'\"(\[,])--?{NAME})(?P<sep>\s+)(?!-){VALUE}", re.IGNORECASE)
NOT_SECRETS = ("error", "exception")  # KeyError: 'lr' says which key, not a secret
# ssh's options whose names say KEY: StrictHostKeyChecking=no is a setting (ssh_config(5))
SSH_SETTINGS = (
    "stricthostkeychecking",
    "hostkeyalgorithms",
    "hostkeyalias",
    "pubkeyauthentication",
    "pubkeyacceptedkeytypes",
    "pubkeyacceptedalgorithms",
    "updatehostkeys",
    "verifyhostkeydns",
    "revokedhostkeys",
    "addkeystoagent",
)
SHORTEST_KNOWN = 6  # a known value shorter than this is too likely to be an ordinary word to replace everywhere


class Redactor:
    """Removes the secrets of one bundle; `known` are secret values to take out wherever they appear, `marks` the
    keyed hashes of the job's secret values its runner recorded (wizard.run.secret_marks)."""

    def __init__(self, known: Iterable[str] = (), marks: SecretMarks | None = None) -> None:
        self.known = sorted({v for v in known if len(v) >= SHORTEST_KNOWN}, key=len, reverse=True)
        self.marks = marks

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ, marks: SecretMarks | None = None) -> Redactor:
        """Knows the values of this process's secret variables and the status token, if set here, and `marks`."""
        names = [name for name in env if HIDDEN.search(name) or name == ENV_STATUS_TOKEN]
        return cls((env[name] for name in names), marks)

    def text(self, text: str) -> str:
        """`text` with every secret it holds replaced by the marker."""
        found = self.marks.found_in(text) if self.marks else set()
        for value in sorted(found, key=len, reverse=True) + self.known:
            text = text.replace(value, REDACTED)
        return OPTION.sub(_hide, ASSIGNMENT.sub(_hide, scrub(text)))

    def value(self, value: Any) -> Any:
        """A JSON value with every secret-named key's value replaced and every string redacted."""
        if isinstance(value, dict):
            # {"name": "HF_TOKEN", "value": ...}: a Kubernetes container's variable
            named = isinstance(value.get("name"), str) and HIDDEN.search(value["name"]) is not None
            return {key: self._item(key, item, named) for key, item in value.items()}
        if isinstance(value, list):  # an argv: the word after an option that says a secret is its value
            return [
                REDACTED
                if index and isinstance(item, str) and not item.startswith("-") and _secret_option(value[index - 1])
                else self.value(item)
                for index, item in enumerate(value)
            ]
        if isinstance(value, str):
            return self.text(value)
        return value

    def _item(self, key: object, item: Any, named: bool) -> Any:
        """The value of `key` in a JSON object (`named`: the object names a secret variable)."""
        if isinstance(key, str) and (HIDDEN.search(key) or (named and key == "value")):
            return REDACTED
        if key == SSH_COMMAND_VARIABLE and isinstance(item, str):  # as an older runtime recorded it: whole
            return program_only(item)
        return self.value(item)

    def json_lines(self, data: bytes) -> bytes:
        """A JSON-lines file (or one JSON document) with its secrets removed; a line that is no JSON as text."""
        out = []
        for line in data.decode("utf-8", "replace").splitlines():
            try:
                out.append(json.dumps(self.value(json.loads(line))))
            except (ValueError, RecursionError):
                out.append(self.text(line))
        return ("\n".join(out) + "\n").encode() if out else b""

    def json_document(self, data: bytes) -> bytes:
        try:
            return (json.dumps(self.value(json.loads(data)), indent=2) + "\n").encode()
        except (ValueError, RecursionError):
            return self.text(data.decode("utf-8", "replace")).encode()


def _hide(match: re.Match[str]) -> str:
    value = match.group("value")
    if value == REDACTED or match.group("name").lower().endswith(NOT_SECRETS + SSH_SETTINGS):
        return match.group(0)
    quote = value[0] if value[0] in "'\"" and len(value) > 1 and value[-1] == value[0] else ""
    return f"{match.group('name')}{match.group('sep')}{quote}{REDACTED}{quote}"


def _secret_option(word: object) -> bool:
    """Whether `word` is a command line's option whose name says a secret and whose value comes next."""
    return isinstance(word, str) and word.startswith("-") and "=" not in word and HIDDEN.search(word) is not None
