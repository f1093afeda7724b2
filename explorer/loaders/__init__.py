"""Trace loaders: find a file's format from its content and read it into columns."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from typing import Any

from neuron_explorer.common.errors import TraceFormatError
from neuron_explorer.loaders.build_memory import building
from neuron_explorer.loaders.inflate import (
    ENV_MAX_BYTES,
    GZIP_MAGIC,
    configured_max_bytes,
    gunzip_windows,
    gzip_limit,
)
from neuron_explorer.loaders.json_stream import load_json_windows
from neuron_explorer.loaders.raw import RawTrace


def read_trace(path: str | os.PathLike, *, max_bytes: int | None = None) -> RawTrace:
    """Read any supported trace: our .pftrace, Chrome JSON or PyTorch-profiler JSON(.gz).

    `max_bytes` caps the trace data read (after decompression); see `inflate`.
    """
    limit = configured_max_bytes(max_bytes)
    with building():  # a load makes many large short-lived arrays
        return _read(os.fspath(path), limit)


def _read(path: str, max_bytes: int | None) -> RawTrace:
    if not os.path.exists(path):
        raise TraceFormatError(path, "no such file; check the path")
    if os.path.isdir(path):
        raise TraceFormatError(path, "is a folder; give the path of a trace file")
    if not os.path.isfile(path):  # a device or a pipe: reading it may never end
        raise TraceFormatError(path, "not a regular file; give the path of a trace file")
    size = os.path.getsize(path)
    if max_bytes is not None and size > max_bytes:
        raise TraceFormatError(path, f"the file holds {size:,} bytes, more than the limit of "
                               f"{max_bytes:,}; raise it with {ENV_MAX_BYTES} or load(..., "
                               "max_bytes=...)")
    try:
        with open(path, "rb") as f:
            head = f.read(_SNIFF_BYTES)
            if head[:2] != GZIP_MAGIC and _looks_like_json(head):
                # JSON is parsed a window at a time (a large trace never whole in memory)
                return load_json_windows(path, _file_windows(path, f, head))
            data: bytes | bytearray = _read_whole(f, head, size)
    except OSError as exc:
        raise _unreadable(path, exc) from None
    if not data:
        raise TraceFormatError(path, "the file is empty (was the recording stopped before "
                               "anything was written?)", 0)
    if data[:2] == GZIP_MAGIC:
        windows = gunzip_windows(path, data, gzip_limit(len(data), max_bytes))
        first = b"".join(itertools.islice(windows, 1))
        if not first:
            raise TraceFormatError(path, "the compressed file is empty", 0)
        if _looks_like_json(first):
            return load_json_windows(path, itertools.chain([first], windows))
        data = first + b"".join(windows)
    if data[:1] == b"\x0a":
        from neuron_explorer.loaders.pftrace import load_pftrace

        return load_pftrace(path, data)
    raise TraceFormatError(
        path, "not a trace this tool reads (expected a Perfetto .pftrace, Chrome-trace JSON "
        "or PyTorch-profiler JSON, optionally gzipped)", 0
    )


_SNIFF_BYTES = 64  # what tells JSON text from a .pftrace or gzip
_WINDOW_BYTES = 16 << 20


# A .pftrace from this size on has its cache entry built as it is decoded, a window of the
# file at a time (`store/streamed.py`): 10 M slices (583 MiB) first loaded with 1.2 GB above
# the imports instead of 3.6 GB, for about 25% more CPU. Below it, memory does not decide
# whether a trace opens, and the whole read is the faster.
STREAM_MIN_BYTES = 256 << 20


def decoded_in_windows(path: str | os.PathLike, *, max_bytes: int | None = None) -> bool:
    """Whether a first load into the cache decodes the file a window at a time: a plain
    .pftrace (not gzipped) of `STREAM_MIN_BYTES` or more, within the size limit."""
    limit = configured_max_bytes(max_bytes)
    try:
        if not os.path.isfile(path):
            return False
        size = os.path.getsize(path)
        if size < STREAM_MIN_BYTES or (limit is not None and size > limit):
            return False
        with open(path, "rb") as f:
            head = f.read(_SNIFF_BYTES)
    except OSError:
        return False
    return head[:1] == b"\x0a" and not _looks_like_json(head)


def _unreadable(path: str, exc: OSError) -> TraceFormatError:
    return TraceFormatError(path, f"cannot read the file ({exc.strerror or exc}); check "
                            "its permissions")


def _read_whole(f: Any, head: bytes, size: int) -> bytearray:
    """The file's bytes in one buffer, read into place (`head`: those read already). Not
    `head + f.read()`: that held the file twice, and faulted in twice its pages."""
    data = bytearray(max(size, len(head)))
    data[:len(head)] = head
    at = len(head)
    with memoryview(data) as view:
        while at < len(data):
            got = f.readinto(view[at:])
            if not got:
                break
            at += got
    more = f.read() if at == len(data) else b""  # it grew since its size was taken
    if more:
        data += more
    else:
        del data[at:]  # or shrank
    return data


def _file_windows(path: str, f: Any, head: bytes) -> Iterator[bytes]:
    """The file's bytes from the start, a window at a time (`head`: those read already)."""
    yield head
    while True:
        try:
            window = f.read(_WINDOW_BYTES)
        except OSError as exc:
            raise _unreadable(path, exc) from None
        if not window:
            return
        yield window


def _looks_like_json(data: bytes | bytearray) -> bool:
    """JSON text starts with `{` or `[` after whitespace. A .pftrace starts with 0x0a (a
    newline) and its first packet's length, which can be `[` or `{` too (91, 123 bytes):
    what follows is binary there, not text."""
    head = bytes(data[:64])
    if head.lstrip()[:1] not in (b"{", b"["):
        return False
    if any(b < 0x20 and b not in b"\t\n\r" for b in head):
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start >= len(head) - 3  # only a character cut at the end of the head
    return True
