"""What the ranks warned about (a checkpoint set aside, where they resumed, AMP falling back), merged across ranks.

Ranks send `warning` events (runtime/events.py `warn`); the same words from
many ranks become one notice naming them all. Bounded: a run that warns
without end keeps the first LIMIT notices and counts the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field

LIMIT = 50
SHOWN = 500  # characters of one notice's words


@dataclass
class Notice:
    """One warning, and every rank that gave it."""

    kind: str
    message: str
    at: float
    ranks: list[int] = field(default_factory=list)

    def line(self) -> str:
        """`rank 0: ...` or `ranks 0, 1, 3: ...`."""
        ranks = ", ".join(map(str, sorted(self.ranks)))
        return f"rank{'s' if len(self.ranks) > 1 else ''} {ranks}: {self.message}"


class Notices:
    """The run's notices in the order they first arrived; `fresh()` hands out each new one once."""

    def __init__(self) -> None:
        self._by_words: dict[tuple[str, str], Notice] = {}
        self._unread: list[Notice] = []
        self.dropped = 0

    def add(self, rank: int, kind: str, message: str, at: float) -> None:
        """Fold in a rank's warning."""
        message = message[len("warning: ") :] if message.lower().startswith("warning: ") else message
        message = message if len(message) <= SHOWN else message[:SHOWN] + " [...]"
        notice = self._by_words.get((kind, message))
        if notice is None:
            if len(self._by_words) >= LIMIT:
                self.dropped += 1
                return
            notice = self._by_words[(kind, message)] = Notice(kind, message, at)
            self._unread.append(notice)
        if rank not in notice.ranks:
            notice.ranks.append(rank)

    def all(self) -> list[Notice]:
        """Every notice kept, first arrived first."""
        return list(self._by_words.values())

    def fresh(self) -> list[Notice]:
        """The notices that arrived since the last call (each is handed out once)."""
        unread, self._unread = self._unread, []
        return unread

    def as_dicts(self) -> list[dict]:
        """For summary.json."""
        found = [{"kind": n.kind, "ranks": sorted(n.ranks), "message": n.message} for n in self.all()]
        if self.dropped:
            found.append({"kind": "dropped", "ranks": [], "message": f"{self.dropped} more warning(s) not kept"})
        return found
