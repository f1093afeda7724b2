"""Protobuf wire encoding by hand: scalar helpers and a numpy batch encoder.

Building a protobuf message object per event in Python is far too slow for a
million events a second, so the trace writer emits wire bytes directly. The scalar
helpers serve one-off events; `Batch` encodes many records of the same shape at
once (one row per record), which is how instructions and counters are written.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

# Wire types.
VARINT = 0
FIXED64 = 1
LEN = 2

_pack_double = struct.Struct("<d").pack
_pack_fixed64 = struct.Struct("<Q").pack


_SMALL = [bytes((i,)) for i in range(128)]


def varint(value: int) -> bytes:
    """Encode a non-negative int (or a negative int64, as ten bytes) as a varint."""
    if value < 0x80:
        if value >= 0:
            return _SMALL[value]
        value += 1 << 64
    if value < 0x4000:
        return bytes(((value & 0x7F) | 0x80, value >> 7))
    if value < 0x200000:
        return bytes(((value & 0x7F) | 0x80, ((value >> 7) & 0x7F) | 0x80, value >> 14))
    if value < 0x800000000:  # five bytes or fewer: ns timestamps up to ~34 s land here
        if value < 0x10000000:
            return bytes(((value & 0x7F) | 0x80, ((value >> 7) & 0x7F) | 0x80,
                          ((value >> 14) & 0x7F) | 0x80, value >> 21))
        return bytes(((value & 0x7F) | 0x80, ((value >> 7) & 0x7F) | 0x80,
                      ((value >> 14) & 0x7F) | 0x80, ((value >> 21) & 0x7F) | 0x80, value >> 28))
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def tag(field: int, wire_type: int) -> bytes:
    """The key that precedes a field: field number and wire type."""
    return varint((field << 3) | wire_type)


def field_varint(field: int, value: int) -> bytes:
    return varint(field << 3) + varint(value)


def field_bytes(field: int, payload: bytes) -> bytes:
    """A length-delimited field: a string, bytes or a nested message."""
    return varint((field << 3) | LEN) + varint(len(payload)) + payload


def field_double(field: int, value: float) -> bytes:
    return varint((field << 3) | FIXED64) + _pack_double(value)


def field_fixed64(field: int, value: int) -> bytes:
    return varint((field << 3) | FIXED64) + _pack_fixed64(value & 0xFFFFFFFFFFFFFFFF)


# ----------------------------------------------------------------------------
# Batch encoding: each segment is an (N, width) uint8 matrix plus a mask of the
# bytes each row uses. Concatenating segments side by side and keeping the masked
# bytes row by row gives the records back to back.

_SHIFTS = np.arange(0, 70, 7, dtype=np.uint64)  # 10 groups of 7 bits cover 64 bits
_THRESHOLDS = (np.uint64(1) << _SHIFTS[1:])  # a value needs one more byte past each


class Segment:
    """Bytes for N rows: row i's encoding is `data[i][mask[i]]`."""

    __slots__ = ("_lengths", "data", "mask")

    def __init__(self, data: np.ndarray, mask: np.ndarray, lengths: np.ndarray | None = None):
        self.data = data
        self.mask = mask
        self._lengths = lengths

    @property
    def lengths(self) -> np.ndarray:
        if self._lengths is None:
            self._lengths = self.mask.sum(axis=1)
        return self._lengths


Parts = list  # a record under construction: segments side by side, concatenated once


def const(payload: bytes, n: int) -> Segment:
    """The same bytes in every row."""
    row = np.frombuffer(payload, dtype=np.uint8)
    return Segment(np.broadcast_to(row, (n, len(row))), np.ones((n, len(row)), bool),
                   np.full(n, len(row), np.int64))


def varints(values: np.ndarray) -> Segment:
    """Varint encoding of each value, all padded to the widest one in the batch.

    Protobuf parsers accept varints with redundant continuation bytes (0x85 0x00
    reads as 5), and equal widths keep every row's bytes contiguous, which makes
    assembling the batch several times faster. int64 values are taken as uint64 bits.
    """
    v = np.asarray(values).astype(np.uint64, copy=False)
    n = len(v)
    top = int(v.max()) if n else 0
    if top < 0x80:  # one byte each: iids, small lengths, small ints
        return Segment(v.astype(np.uint8).reshape(n, 1), np.ones((n, 1), bool),
                       np.ones(n, np.int64))
    width = (top.bit_length() + 6) // 7
    groups = (v[:, None] >> _SHIFTS[None, :width]).astype(np.uint8) & np.uint8(0x7F)
    groups[:, :-1] |= np.uint8(0x80)
    return Segment(groups, np.ones((n, width), bool), np.full(n, width, np.int64))


def fixed64s(values: np.ndarray) -> Segment:
    """Little-endian 8-byte encoding of each value (uint64 or float64 by dtype)."""
    v = np.ascontiguousarray(values)
    n = len(v)
    data = v.astype(v.dtype.newbyteorder("<"), copy=False).view(np.uint8).reshape(n, 8)
    return Segment(data, np.ones((n, 8), bool), np.full(n, 8, np.int64))


def table(choices: Sequence[bytes], index: np.ndarray) -> Segment:
    """Row i holds `choices[index[i]]` (for strings or fields that take few values)."""
    width = max((len(c) for c in choices), default=0) or 1
    mat = np.zeros((len(choices), width), np.uint8)
    used = np.zeros((len(choices), width), bool)
    for i, c in enumerate(choices):
        mat[i, : len(c)] = np.frombuffer(c, np.uint8)
        used[i, : len(c)] = True
    idx = np.asarray(index, dtype=np.int64)
    return Segment(mat[idx], used[idx], used.sum(axis=1)[idx])


def optional(parts: Sequence[Segment], present: np.ndarray) -> Parts:
    """Keep the parts only in rows where `present` is true."""
    keep = np.asarray(present, bool)
    return [Segment(s.data, s.mask & keep[:, None], np.where(keep, s.lengths, 0)) for s in parts]


def length(parts: Sequence[Segment]) -> np.ndarray:
    """Bytes per row of the parts together."""
    total = parts[0].lengths
    for s in parts[1:]:
        total = total + s.lengths
    return total


def message(field: int, body: Sequence[Segment]) -> Parts:
    """A length-delimited field holding the concatenated `body` in each row."""
    n = body[0].data.shape[0]
    return [const(tag(field, LEN), n), varints(length(body)), *body]


def to_bytes(parts: Sequence[Segment]) -> bytes:
    """All rows' used bytes, row after row."""
    data = np.concatenate([s.data for s in parts], axis=1)
    mask = np.concatenate([s.mask for s in parts], axis=1)
    return data[mask].tobytes()
