"""A large Chrome-trace JSON document read a window of text at a time.

Parsing a whole document makes a Python object of every event at once: a 250 MB
trace took 2.3 GB. Here the text comes in windows (read from the file, or inflated
from gzip) and a compiled scan finds the commas between the events of the
`traceEvents` list; each run of whole events is parsed, collected (`chrome_json`'s
collector keeps columns, not events) and let go. Memory then holds one window of text,
one chunk of parsed events and the columns, not the document. A document smaller than
`STREAM_MIN_BYTES` is parsed whole (`chrome_json.load_chrome_json`): the same result.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from neuron_explorer.common.errors import TraceFormatError
from neuron_explorer.loaders import chrome_json as cj
from neuron_explorer.loaders.raw import RawTrace

STREAM_MIN_BYTES = 16 << 20
# the events parsed at once: a chunk of text this size (its objects take ~5x that)
CHUNK_BYTES = 8 << 20
EVENTS_KEY = b'"traceEvents"'

def _scan(buf: np.ndarray, state: np.ndarray, start: int, limit: int) -> tuple[int, int, int]:
    """Walk `buf` from `start` inside the events list, stopping at the first comma between
    two events at or past `limit`: (that comma, the last comma between events seen, the
    `]` that closes the list), -1 for none. `state` (depth inside the list, in a string,
    after a backslash) carries from one window to the next."""
    depth, in_string, escaped = state[0], state[1], state[2]
    last_comma, close = -1, -1
    for i in range(start, len(buf)):
        c = buf[i]
        if in_string:
            if escaped:
                escaped = 0
            elif c == 92:  # backslash
                escaped = 1
            elif c == 34:  # quote
                in_string = 0
        elif c == 34:
            in_string = 1
        elif c == 123 or c == 91:  # { [
            depth += 1
        elif c == 125 or c == 93:  # } ]
            depth -= 1
            if depth < 0:
                close = i
                break
        elif c == 44 and depth == 0:  # a comma between two events
            last_comma = i
            if i >= limit:
                state[0], state[1], state[2] = 0, 0, 0
                return i, last_comma, -1
    state[0], state[1], state[2] = depth, in_string, escaped
    return -1, last_comma, close


def _depth_at(buf: np.ndarray, end: int) -> int:
    """The nesting depth at `end` (-1 there: inside a string)."""
    depth, in_string, escaped = 0, 0, 0
    for i in range(end):
        c = buf[i]
        if in_string:
            if escaped:
                escaped = 0
            elif c == 92:
                escaped = 1
            elif c == 34:
                in_string = 0
        elif c == 34:
            in_string = 1
        elif c == 123 or c == 91:
            depth += 1
        elif c == 125 or c == 93:
            depth -= 1
    return -1 if in_string else depth


@functools.cache
def _compiled() -> tuple[Callable[..., tuple[int, int, int]], Callable[..., int]]:
    """The scans compiled (numba, cached on disk): imported only for a large document."""
    import numba

    jit = numba.njit(cache=True, nogil=True, boundscheck=False)
    return jit(_scan), jit(_depth_at)


def load_json_windows(path: str, windows: Iterator[bytes]) -> RawTrace:
    """Read a Chrome-trace JSON document given as windows of its text."""
    head = bytearray()
    for window in windows:
        head += window
        if len(head) >= STREAM_MIN_BYTES:
            break
    else:  # small: parsed whole
        return cj.load_chrome_json(path, head)
    try:
        return _Stream(path, head, windows).load()
    except _NotStreamable:  # the events list not near the start: parsed whole
        head += b"".join(windows)
        return cj.load_chrome_json(path, head)


class _Stream:
    """One document's events, parsed and collected a chunk at a time."""

    def __init__(self, path: str, head: bytearray, windows: Iterator[bytes]) -> None:
        self.path, self.windows = path, windows
        self.text = head  # the text not yet parsed, from `self.offset` in the document
        self.offset = 0
        self.col = cj.Collector()
        self.events = 0  # events collected so far
        self.state = np.zeros(3, np.int64)

    def load(self) -> RawTrace:
        prefix = self._find_events()
        suffix, cut_short = self._collect_events()
        if prefix is None:  # a bare list of events
            doc: Any = []
        else:
            doc = self._skeleton(prefix, suffix, cut_short is not None)
        return cj.assemble(self.path, self.col, doc, cut_short)

    def _find_events(self) -> bytes | None:
        """Move past the `[` that opens the events; the text before it (None when the
        document is that list itself)."""
        text = self.text
        first = bytes(text[:64]).lstrip()[:1]
        if first == b"[":
            at = text.index(b"[")
            self._advance(at + 1)
            return None
        at = text.find(EVENTS_KEY)
        while at >= 0:
            after = bytes(text[at + len(EVENTS_KEY):at + len(EVENTS_KEY) + 64]).lstrip()
            if after[:1] == b":" and after[1:].lstrip()[:1] == b"[" and \
                    _compiled()[1](np.frombuffer(text, np.uint8), at) == 1:  # a root key
                open_at = text.index(b"[", at + len(EVENTS_KEY))
                prefix = bytes(text[:open_at])
                self._advance(open_at + 1)
                return prefix
            at = text.find(EVENTS_KEY, at + 1)
        # not in the first part read: the whole document, parsed at once
        raise _NotStreamable

    def _advance(self, n: int) -> None:
        # a new buffer for the rest: deleting from the front would keep the old one's size
        self.text = self.text[n:]
        self.offset += n

    def _collect_events(self) -> tuple[bytes, str | None]:
        """Parse the events a chunk of about `CHUNK_BYTES` at a time: (the text after the
        list, a warning if the document ends before the list does)."""
        scan = _compiled()[0]
        scanned = 0  # of self.text, walked by the scan (its state holds where it ends)
        last_comma = -1  # the last comma between two events in self.text
        while True:
            comma, last, close = scan(np.frombuffer(self.text, np.uint8), self.state,
                                      scanned, CHUNK_BYTES)
            last_comma = max(last_comma, last)
            if close >= 0:
                self._parse(close)
                suffix = bytes(self.text[1:]) + b"".join(self.windows)  # after the `]`
                return suffix, None
            if comma >= 0:  # a chunk's worth: parse it, go on from the comma
                self._parse(comma)
                self._advance(1)
                scanned, last_comma = 0, -1
                continue
            scanned = len(self.text)
            window = next(self.windows, None)
            if window is None:
                return b"", self._cut_short(last_comma)
            self.text += window

    def _parse(self, end: int) -> None:
        """Parse and collect the events of self.text[:end], then drop that text."""
        chunk = bytes(self.text[:end]).strip()
        if chunk:
            events = self._loads(chunk, cj._loads)

            def exact() -> list:
                return self._loads(chunk, cj._loads_exact)

            cj.collect_chunk(self.path, chunk, events, self.col, self.events, exact)
            self.events += len(events)
            del events
        self._advance(end)

    def _loads(self, chunk: bytes, loads: Any) -> list:
        try:
            return loads(b"[" + chunk + b"]")
        except json.JSONDecodeError as exc:
            where = self.offset + max(exc.pos - 1, 0)
            reason = "not UTF-8 text: the file is corrupt" if "UTF-8" in exc.msg \
                else f"invalid JSON ({exc.msg})"
            raise TraceFormatError(self.path, reason, where) from None

    def _cut_short(self, last_comma: int) -> str:
        """The document ended inside the events: keep the whole events before the cut."""
        end = self.offset + len(self.text)
        if last_comma >= 0:
            self._parse(last_comma)
        kept = self.offset
        if self.events == 0 and not self.col.c_ts:
            raise TraceFormatError(self.path, "the JSON ends early: the file is truncated", end)
        return (f"{self.path}: the JSON ends early at byte {end} (was the recording "
                f"killed?); loaded the complete events before byte {kept}")

    def _skeleton(self, prefix: bytes, suffix: bytes, cut_short: bool) -> Any:
        """The document with an empty event list: its other keys (metadata)."""
        # a document cut short inside its events is closed after the list
        text = prefix + b"[]" + (b"}" if cut_short else suffix)
        try:
            doc = cj._loads(text)
        except json.JSONDecodeError as exc:
            raise TraceFormatError(self.path, f"invalid JSON after the event list ({exc.msg})",
                                   self.offset) from None
        if not isinstance(doc, dict):
            raise TraceFormatError(self.path, "JSON without a 'traceEvents' list: not a "
                                   "Chrome or PyTorch-profiler trace")
        doc.pop("traceEvents", None)
        return doc


class _NotStreamable(Exception):
    """The events list was not found where streaming looks for it."""
