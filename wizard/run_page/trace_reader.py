"""Read a chrome trace JSON file event by event, bounded in memory and in the events read.

A profile window's trace can be a gigabyte: `trace_events` never holds more
than a chunk of the file and one event. It takes both layouts profilers
write: an object with a `traceEvents` array (torch.profiler, kineto) and a
bare array of events (torch_npu's trace_view.json). The file is read in
CHUNK-sized pieces; each element of the array is decoded by the standard
library's JSON decoder (`raw_decode`) as soon as it is whole in the buffer.
Other keys of the object are skipped without being decoded.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from wizard.monitor.run_files import RunFileError, open_regular

CHUNK = 1 << 20
# an event (or a skipped value) longer than this is no trace we can read: a real event, its arguments and
# Python stack included, is some kilobytes; a crafted one of many MiB costs seconds and memory to decode
LARGEST_ELEMENT = 1 << 20
WHITESPACE = " \t\r\n"
_decoder = json.JSONDecoder()


class TraceUnreadable(ValueError):
    """The file is no chrome trace JSON, or breaks off, at `offset` characters."""


@dataclass
class Reading:
    """What one read took: the events yielded, whether it stopped at the cap, and any reason it broke off."""

    events: int = 0
    elements: int = 0  # every element of the array read (events or not) and every stray comma: what the cap counts
    capped: bool = False
    broken: str | None = None  # why the reading stopped early (a cut file, bad JSON)


class _Buffer:
    """The text of the file, a chunk at a time; `pos` is where reading is."""

    def __init__(self, handle: IO[bytes]) -> None:
        self.handle = handle
        self.decode = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""
        self.pos = 0
        self.eof = False

    def more(self) -> bool:
        """Append the next chunk (dropping what was read); False at the end of the file."""
        if self.eof:
            return False
        data = self.handle.read(CHUNK)
        self.eof = not data
        self.text = self.text[self.pos :] + self.decode.decode(data, final=self.eof)
        self.pos = 0
        return not self.eof or bool(self.text)

    def peek(self) -> str:
        """The next character that is not white space ('' at the end of the file)."""
        while True:
            while self.pos < len(self.text) and self.text[self.pos] in WHITESPACE:
                self.pos += 1
            if self.pos < len(self.text):
                return self.text[self.pos]
            if self.eof or not self.more():
                return ""

    def value(self) -> object:
        """Decode the JSON value that starts at the next character that is not white space, reading on until whole."""
        self.peek()
        while True:
            try:
                value, end = _decoder.raw_decode(self.text, self.pos)
            except RecursionError:
                raise TraceUnreadable("an element nested too deep for the JSON decoder") from None
            except json.JSONDecodeError as error:
                if self.eof:
                    raise TraceUnreadable(f"{error.msg} (the file breaks off or is not JSON)") from None
                if len(self.text) - self.pos > LARGEST_ELEMENT:
                    raise TraceUnreadable(f"an element longer than {LARGEST_ELEMENT >> 20} MiB") from None
                self.more()
                continue
            if end == len(self.text) and not self.eof:  # a number cut at the chunk's end would read short
                self.more()
                continue
            self.pos = end
            return value

    def expect(self, char: str) -> None:
        """Step over `char`, the next character that is not white space."""
        found = self.peek()
        if found != char:
            raise TraceUnreadable(f"expected {char!r}, found {found or 'the end of the file'!r}")
        self.pos += 1


def trace_events(path: Path, limit: int, reading: Reading | None = None) -> Iterator[dict]:
    """The events of the chrome trace at `path`, at most `limit` of them; `reading` says how it went."""
    reading = reading if reading is not None else Reading()
    try:  # a run folder is anyone's to write into: no link followed, no FIFO waited on
        handle = open_regular(path)
    except RunFileError as error:
        reading.broken = str(error)
        return
    if handle is None:
        reading.broken = f"{path} is gone"
        return
    with handle:
        buffer = _Buffer(handle)
        try:
            if _to_events(buffer, limit):
                yield from _elements(buffer, limit, reading)
        except TraceUnreadable as error:
            reading.broken = str(error)


def _to_events(buffer: _Buffer, limit: int) -> bool:
    """Move to the first event: into a bare array, or past the object's keys up to `traceEvents`.

    More than `limit` keys before `traceEvents` is no trace: an object of endless keys stops there.
    """
    keys = 0
    first = buffer.peek()
    if first == "[":
        buffer.pos += 1
        return True
    buffer.expect("{")
    while buffer.peek() not in ("}", ""):
        key = buffer.value()
        buffer.expect(":")
        if key == "traceEvents":
            buffer.expect("[")
            return True
        keys += 1
        if keys > limit:
            raise TraceUnreadable(f"more than {limit:,} keys before traceEvents")
        buffer.value()  # another key's value, decoded and dropped (bounded by LARGEST_ELEMENT)
        if buffer.peek() == ",":
            buffer.pos += 1
    return False


def _elements(buffer: _Buffer, limit: int, reading: Reading) -> Iterator[dict]:
    """The array's objects; every element read, and every comma that follows no element, counts against `limit`."""
    after_element = False
    while True:
        char = buffer.peek()
        if char == "]":
            return
        if char == "":
            raise TraceUnreadable("the file ends inside the events (a cut file?)")
        if char == "," and after_element:  # the separator after an element is part of it
            buffer.pos += 1
            after_element = False
            continue
        if reading.elements >= limit:
            reading.capped = True
            return
        reading.elements += 1
        if char == ",":  # a stray comma
            buffer.pos += 1
            continue
        event = buffer.value()
        after_element = True
        if isinstance(event, dict):
            reading.events += 1
            yield event
