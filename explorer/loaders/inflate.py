"""Gzip, inflated while streaming under a size limit: a small bomb cannot take the memory.

A `.json.gz` of 1 MB may inflate to gigabytes. The data is inflated a chunk at a
time and the load is refused as soon as it passes the limit: by default 100 times
the compressed size, at least 256 MiB (small traces never hit it) and at most
4 GiB. `NEURON_EXPLORER_MAX_TRACE_BYTES` or `load(path, max_bytes=...)` set the
limit instead (bytes of trace data after decompression; it bounds plain files too).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator

from neuron_explorer.common.errors import NeuronExplorerError, TraceFormatError

GZIP_MAGIC = b"\x1f\x8b"
RATIO = 100  # JSON traces compress 5-30x; a bomb, 1000x and more
FLOOR = 256 << 20
CEILING = 4 << 30
ENV_MAX_BYTES = "NEURON_EXPLORER_MAX_TRACE_BYTES"
_CHUNK = 16 << 20  # inflated per step: the most the limit can be overshot by


def configured_max_bytes(max_bytes: int | None = None) -> int | None:
    """The limit asked for: `max_bytes`, else the environment variable, else None (default)."""
    if max_bytes is not None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
            raise NeuronExplorerError(f"max_bytes must be a positive number of bytes, "
                                      f"not {max_bytes!r}")
        return max_bytes
    text = os.environ.get(ENV_MAX_BYTES, "").strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise NeuronExplorerError(f"{ENV_MAX_BYTES}={text!r} is not a positive number of bytes; "
                                  "set it to e.g. 8589934592 (8 GiB) or unset it")
    return value


def gzip_limit(compressed_size: int, max_bytes: int | None) -> int:
    """Most bytes a gzipped trace of this size may inflate to."""
    if max_bytes is not None:
        return max_bytes
    return min(max(RATIO * compressed_size, FLOOR), CEILING)


def _too_large(path: str, limit: int, position: int) -> TraceFormatError:
    return TraceFormatError(
        path, f"the compressed data inflates to more than {limit:,} bytes (a gzip bomb, or a "
        f"trace larger than the limit); if the trace is genuine, raise the limit with "
        f"{ENV_MAX_BYTES} or load(..., max_bytes=...)", position)


def gunzip(path: str, data: bytes | bytearray, limit: int) -> bytearray:
    """The inflated gzip data (every member), refused once it passes `limit` bytes."""
    out = bytearray()
    for window in gunzip_windows(path, data, limit):
        out += window
    return out


def gunzip_windows(path: str, data: bytes | bytearray, limit: int) -> Iterator[bytes]:
    """The inflated gzip data (every member) a window of at most `_CHUNK` bytes at a time,
    refused once it passes `limit` bytes in all."""
    total = 0
    rest = memoryview(data)
    consumed = 0  # compressed bytes of the members finished so far
    while True:
        inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # gzip header and trailer
        pending: bytes | memoryview = rest
        try:
            while not inflater.eof:
                chunk = inflater.decompress(pending, _CHUNK)
                total += len(chunk)
                if total > limit:
                    read = consumed + len(rest) - len(inflater.unconsumed_tail)
                    raise _too_large(path, limit, read)
                pending = inflater.unconsumed_tail
                if not pending and not chunk:
                    raise TraceFormatError(path, "the gzip stream ends early: the file is "
                                           "truncated", len(data))
                if chunk:
                    yield chunk
        except zlib.error as exc:
            raise TraceFormatError(path, f"corrupt gzip data ({exc})") from None
        consumed += len(rest) - len(inflater.unused_data)
        rest = memoryview(inflater.unused_data)
        if bytes(rest[:2]) != GZIP_MAGIC:
            break  # another member follows, as `cat a.gz b.gz` makes; else the end
    if rest.tobytes().strip(b"\0"):  # zero padding after the last member is allowed
        raise TraceFormatError(path, "data after the end of the gzip stream: the file is "
                               "corrupt", consumed)
