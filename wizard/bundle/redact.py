"""Taking secrets out: the status token and every variable whose name says TOKEN, KEY, SECRET, PASSWORD or
CREDENTIAL, in JSON (by key) and in text (NAME=value, NAME: value, 'NAME': 'value', and known values anywhere).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from runtime.provenance import HIDDEN, REDACTED
from runtime.status import ENV_STATUS_TOKEN

WORDS = r"(?:TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL)"
# a name that says a secret, an optional closing quote, = or :, optional quotes, then the value
ASSIGNMENT = re.compile(
    rf"(?P<name>[A-Za-z0-9_.-]*{WORDS}[A-Za-z0-9_.-]*)(?P<sep>['\"]?\s*[=:]\s*['\"]?)(?P<value>[^\s'\",;}}\]]+)",
    re.IGNORECASE,
)
SHORTEST_KNOWN = 6  # a known value shorter than this is too likely to be an ordinary word to replace everywhere


class Redactor:
    """Removes the secrets of one bundle; `known` are secret values to take out wherever they appear."""

    def __init__(self, known: Iterable[str] = ()) -> None:
        self.known = sorted({v for v in known if len(v) >= SHORTEST_KNOWN}, key=len, reverse=True)

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Redactor:
        """Knows the values of this process's secret variables and the status token, if set here."""
        names = [name for name in env if HIDDEN.search(name) or name == ENV_STATUS_TOKEN]
        return cls(env[name] for name in names)

    def text(self, text: str) -> str:
        for value in self.known:
            text = text.replace(value, REDACTED)

        def hide(match: re.Match[str]) -> str:
            if match.group("value") == REDACTED:
                return match.group(0)
            return f"{match.group('name')}{match.group('sep')}{REDACTED}"

        return ASSIGNMENT.sub(hide, text)

    def value(self, value: Any) -> Any:
        """A JSON value with every secret-named key's value replaced and every string redacted."""
        if isinstance(value, dict):
            return {
                key: REDACTED if isinstance(key, str) and HIDDEN.search(key) else self.value(item)
                for key, item in value.items()
            }
        if isinstance(value, list):
            return [self.value(item) for item in value]
        if isinstance(value, str):
            return self.text(value)
        return value

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
