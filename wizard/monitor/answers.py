"""The ranks' answers to the runner's asks, as the status stream brings them back.

The runner asks every rank something (`StatusServer.ask`, say {"ask": "stacks"})
under an id of its own; each rank answers with an event carrying that id, in
one line or in parts (runtime/status.py). `Answers` keeps, per id, what each
rank answered, joining the parts, and leaves every other event to the state.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any

from runtime.status import ANSWER_PART_CHARS, ASK_FIELD, MAX_ANSWER_CHARS

MAX_PARTS = MAX_ANSWER_CHARS // ANSWER_PART_CHARS + 1


@dataclass
class _Asked:
    name: str
    answers: dict[int, dict[str, Any]] = field(default_factory=dict)
    parts: dict[int, dict[int, str]] = field(default_factory=dict)


class Answers:
    """What each rank answered to each open ask."""

    def __init__(self) -> None:
        self._asked: dict[str, _Asked] = {}

    def open(self, name: str, **fields: Any) -> dict[str, Any]:
        """A new ask named `name` with a fresh id, to send with StatusServer.ask."""
        ask_id = secrets.token_hex(8)
        self._asked[ask_id] = _Asked(name)
        return {ASK_FIELD: name, "id": ask_id, **fields}

    def take(self, event: dict[str, Any]) -> bool:
        """Keep `event` if it answers an open ask (True); otherwise leave it to the caller."""
        asked = self._asked.get(event.get("id")) if isinstance(event.get("id"), str) else None
        if asked is None or event.get("event") != asked.name:
            return False
        rank = event["rank"]
        parts, index = event.get("parts"), event.get("part")
        if parts is None:
            asked.answers[rank] = event
            return True
        if not (isinstance(parts, int) and isinstance(index, int) and 0 <= index < parts <= MAX_PARTS):
            return True  # a part that cannot belong: dropped
        received = asked.parts.setdefault(rank, {})
        received[index] = str(event.get("text", ""))
        if len(received) == parts:
            del asked.parts[rank]
            try:
                whole = json.loads("".join(received[i] for i in range(parts)))
            except (ValueError, KeyError, RecursionError):  # nested past what json can read: no answer
                whole = {"error": "its answer's parts did not join"}
            if not isinstance(whole, dict):
                whole = {"error": "its answer is no JSON object"}
            asked.answers[rank] = {**whole, "event": asked.name, "id": event["id"], "rank": rank}
        return True

    def received(self, ask_id: str) -> dict[int, dict[str, Any]]:
        """Each rank's whole answer to `ask_id` so far."""
        asked = self._asked.get(ask_id)
        return dict(asked.answers) if asked is not None else {}

    def close(self, ask_id: str) -> dict[int, dict[str, Any]]:
        """Stop listening for `ask_id`; return what came."""
        asked = self._asked.pop(ask_id, None)
        return dict(asked.answers) if asked is not None else {}
