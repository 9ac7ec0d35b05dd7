"""Text from a run shown on a terminal: control characters escaped, never sent raw.

A rank's error message, its traceback, its log and every other text of a run folder are anyone's to write:
an escape sequence among them would clear, retitle or reprogram the terminal of whoever watches the run.
Every character that is not printable, but a newline or a tab, is shown as Python writes it in a string
literal (`\\x1b`, `\\r`, `\\u202e`), in the plain output, the summary and the live view alike.
"""

from __future__ import annotations

from typing import TextIO

KEPT = frozenset("\n\t")


def printable(text: str) -> str:
    """`text` with each control character (and other unprintable one) but newline and tab escaped."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in KEPT else repr(c)[1:-1] for c in text)


class PrintableOut:
    """A text stream that escapes what `printable` escapes in everything written to it, then writes it on."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def write(self, text: str) -> int:
        """Write `text`, escaped."""
        return self.out.write(printable(text))

    def flush(self) -> None:
        """Flush the stream beneath."""
        self.out.flush()
