"""A rank's hang/rank-N.json record as compact JSON within its bound: parts left out whole, never text cut."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

MAX_RECORD_BYTES = 2 << 20


def bounded_record(record: dict[str, Any], limit: int = MAX_RECORD_BYTES) -> str:
    """`record` as compact JSON of at most `limit` bytes.

    A bigger one loses parts in turn (LEFT_OUT: the least needed by the verdict first) until it fits, and its
    "truncated" names them: the text is never cut, so it stays JSON and the rank is still read as answered.
    """
    text = _compact(record)
    left_out: list[str] = []
    for what, leave_out in LEFT_OUT:
        if len(text.encode()) <= limit:
            break
        record = leave_out(record)
        left_out.append(what)
        text = _compact({**record, "truncated": left_out})
    return text


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), default=str)


def _threads(record: dict[str, Any], keep: Callable[[Any], Any]) -> dict[str, Any]:
    threads = record.get("threads")
    return {**record, "threads": keep(threads)} if isinstance(threads, list) else record


def _collectives(record: dict[str, Any], keep: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
    found = record.get("collectives")
    return {**record, "collectives": keep(found)} if isinstance(found, dict) else record


def _entries_without_sizes(collectives: dict[str, Any]) -> dict[str, Any]:
    entries = collectives.get("entries")
    if not isinstance(entries, list):
        return collectives
    shapeless = [
        {key: value for key, value in entry.items() if key not in ("sizes", "dtypes")}
        if isinstance(entry, dict)
        else entry
        for entry in entries
    ]
    return {**collectives, "entries": shapeless}


def _no_entries(collectives: dict[str, Any]) -> dict[str, Any]:
    return {**collectives, "entries": []}


def _frameless(threads: list[Any]) -> list[Any]:
    return [{**thread, "frames": []} if isinstance(thread, dict) else {} for thread in threads[:1]]


def _scalars(value: dict[str, Any]) -> dict[str, Any]:
    """The numbers, booleans and short words of a mapping: what is left of a record that fits no other way."""
    return {
        key: item
        for key, item in value.items()
        if item is None or isinstance(item, (bool, int, float)) or (isinstance(item, str) and len(item) <= 200)
    }


def _essentials(record: dict[str, Any]) -> dict[str, Any]:
    collectives = record.get("collectives")
    kept = {**_scalars(record), "threads": []}
    return {**kept, "collectives": _scalars(collectives)} if isinstance(collectives, dict) else kept


LEFT_OUT: list[tuple[str, Callable[[dict[str, Any]], dict[str, Any]]]] = [
    ("the threads but the main one", lambda record: _threads(record, lambda threads: threads[:1])),
    ("the sizes and dtypes of its collectives", lambda record: _collectives(record, _entries_without_sizes)),
    ("its collectives but the last entered and completed", lambda record: _collectives(record, _no_entries)),
    ("its main thread's frames", lambda record: _threads(record, _frameless)),
    ("every other long value", _essentials),
]
