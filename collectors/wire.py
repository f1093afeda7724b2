"""Protobuf wire encoding by hand: scalar helpers and a numpy batch encoder.

Building a protobuf message object per event in Python is far too slow for a
million events a second, so the trace writer emits wire bytes directly. The scalar
helpers serve one-off events; `Batch` encodes many records of the same shape at
once (one row per record), which is how instructions and counters are written.
"""

from __future__ import annotations

import itertools
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
# Tables of 14-bit groups: table lookups and one or two concatenations encode a varint
# several times faster than building it byte by byte (timestamps are 5-6 bytes long).
# _UPTO14[v]: the varint of v < 2**14; _CONT14[v]: v's two 7-bit groups, both continuing.
_UPTO14 = _SMALL + [bytes(((i & 0x7F) | 0x80, i >> 7)) for i in range(128, 1 << 14)]
_CONT14 = [bytes(((i & 0x7F) | 0x80, (i >> 7) | 0x80)) for i in range(1 << 14)]


def varint(value: int) -> bytes:
    """Encode a non-negative int (or a negative int64, as ten bytes) as a varint."""
    if value < 0x4000:
        if value >= 0:
            return _UPTO14[value]
        value += 1 << 64
    if value < 0x10000000:
        return _CONT14[value & 0x3FFF] + _UPTO14[value >> 14]
    if value < 0x40000000000:
        return _CONT14[value & 0x3FFF] + _CONT14[(value >> 14) & 0x3FFF] + _UPTO14[value >> 28]
    return _CONT14[value & 0x3FFF] + _CONT14[(value >> 14) & 0x3FFF] + varint(value >> 28)


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
# Batch encoding. A segment holds some bytes of each of N records, one record per row:
# `data` is (N, width), so record i's bytes are `data[i]` (where `mask` allows; no mask:
# all of them). `to_bytes` lays the segments side by side with a structured dtype, one
# field per segment, so each record's piece is copied as one item rather than byte by
# byte.

_SHIFTS = np.arange(0, 70, 7, dtype=np.uint64)  # 10 groups of 7 bits cover 64 bits


class Segment:
    """Bytes for N records, row-major: record i is `data[i]` (masked by `mask`).

    A constant segment (the same bytes in every record) keeps only those bytes; its
    matrix is made only if something asks for it, since a batch has dozens of them."""

    __slots__ = ("_data", "_lengths", "constant", "mask", "rows", "splice", "width")

    def __init__(self, data: np.ndarray | None, mask: np.ndarray | None = None,
                 lengths: np.ndarray | None = None, constant: bytes | None = None,
                 splice: tuple[list[bytes], np.ndarray] | None = None,
                 rows: int | None = None) -> None:
        self._data = data
        self.mask = mask
        self._lengths = lengths
        self.constant = constant  # the bytes every record holds, for const segments
        self.splice = splice  # (choices, index): bytes joined in by to_bytes, not in `data`
        if data is not None:
            self.rows, self.width = data.shape
        else:
            assert constant is not None, "a segment without data is a constant one"
            self.rows, self.width = rows, len(constant)

    @property
    def data(self) -> np.ndarray:
        if self._data is None:
            assert self.constant is not None  # a segment without data is a constant one
            row = np.frombuffer(self.constant, dtype=np.uint8)
            self._data = np.broadcast_to(row[None, :], (self.rows, self.width))
        return self._data

    @property
    def lengths(self) -> np.ndarray:
        if self._lengths is None:
            if self.mask is None:
                self._lengths = np.full(self.rows, self.width, np.int64)
            else:
                self._lengths = self.mask.sum(axis=1)
        return self._lengths

    @property
    def fixed(self) -> bool:
        """Every record holds all `width` bytes."""
        return self.mask is None and self.splice is None

    def full_mask(self) -> np.ndarray:
        return np.ones((self.rows, self.width), bool) if self.mask is None else self.mask


Parts = list  # a record under construction: segments in order, assembled once


def const(payload: bytes, n: int) -> Segment:
    """The same bytes in every record."""
    return Segment(None, constant=payload, rows=n)


def varints(values: np.ndarray) -> Segment:
    """Varint encoding of each value, all padded to the widest one in the batch.

    Protobuf parsers accept varints with redundant continuation bytes (0x85 0x00
    reads as 5), and equal widths keep every record's bytes in the same columns,
    which makes assembling the batch several times faster. int64 values are taken
    as their uint64 bits.
    """
    v = np.asarray(values).astype(np.uint64, copy=False)
    n = len(v)
    top = int(v.max()) if n else 0
    if top < 0x80:  # one byte each: iids, small lengths, small ints
        return Segment(v.astype(np.uint8).reshape(n, 1))
    width = (top.bit_length() + 6) // 7
    groups = (v[:, None] >> _SHIFTS[None, :width]).astype(np.uint8) & np.uint8(0x7F)
    groups[:, :-1] |= np.uint8(0x80)
    return Segment(groups)


def padded_varint(value: int, width: int) -> bytes:
    """`value` as a varint of exactly `width` bytes (redundant continuation bytes)."""
    if value >> (7 * width):
        raise ValueError(f"{value} does not fit in {width} varint bytes")
    return bytes(((value >> (7 * i)) & 0x7F) | (0x80 if i < width - 1 else 0)
                 for i in range(width))


def fixed64s(values: np.ndarray) -> Segment:
    """Little-endian 8-byte encoding of each value (uint64 or float64 by dtype)."""
    v = np.ascontiguousarray(values)
    return Segment(v.astype(v.dtype.newbyteorder("<"), copy=False).view(np.uint8)
                   .reshape(len(v), 8))


def table(choices: Sequence[bytes], index: np.ndarray) -> Segment:
    """Record i holds `choices[index[i]]` (for strings or fields that take few values)."""
    width = max((len(c) for c in choices), default=0) or 1
    mat = np.zeros((len(choices), width), np.uint8)
    used = np.zeros((len(choices), width), bool)
    for i, c in enumerate(choices):
        mat[i, : len(c)] = np.frombuffer(c, np.uint8)
        used[i, : len(c)] = True
    idx = np.asarray(index, dtype=np.int64)
    if used.all():
        return Segment(mat[idx])
    return Segment(mat[idx], used[idx], used.sum(axis=1)[idx])


def spliced(choices: Sequence[bytes], index: np.ndarray) -> Segment:
    """Record i holds `choices[index[i]]`, joined in when the batch is assembled rather
    than copied into its matrix: for long payloads of varying length (prepared args),
    which as a padded, masked table would cost more than all the other fields."""
    idx = np.asarray(index, dtype=np.int64)
    lengths = np.fromiter(map(len, choices), np.int64, len(choices))[idx]
    return Segment(np.zeros((len(idx), 0), np.uint8), lengths=lengths,
                   splice=(list(choices), idx))


def choose(present: np.ndarray, if_present: Segment, otherwise: bytes) -> Segment:
    """Per record, `if_present`'s bytes or the constant `otherwise` (of the same width)."""
    filler = np.frombuffer(otherwise, np.uint8)
    if len(filler) != if_present.width or if_present.mask is not None:
        raise ValueError("choose() needs full-width segments of equal width")
    data = np.where(np.asarray(present, bool)[:, None], if_present.data, filler[None, :])
    return Segment(data.astype(np.uint8, copy=False))


def concat_columns(parts: Sequence[Segment]) -> Segment:
    """Full-width segments one after the other as one segment."""
    return Segment(np.concatenate([s.data for s in parts], axis=1))


def optional(parts: Sequence[Segment], present: np.ndarray) -> Parts:
    """Keep the parts only in records where `present` is true."""
    keep = np.asarray(present, bool)
    return [Segment(s.data, s.full_mask() & keep[:, None], np.where(keep, s.lengths, 0))
            for s in parts]


def length(parts: Sequence[Segment]) -> np.ndarray:
    """Bytes per record of the parts together."""
    total = np.full(parts[0].rows, sum(s.width for s in parts if s.fixed), np.int64)
    for s in parts:
        if not s.fixed:
            total += s.lengths
    return total


def message(field: int, body: Sequence[Segment]) -> Parts:
    """A length-delimited field holding the concatenated `body` in each record."""
    n = body[0].rows
    if all(s.fixed for s in body):  # every record the same length
        return [const(tag(field, LEN) + varint(sum(s.width for s in body)), n), *body]
    return [const(tag(field, LEN), n), varints(length(body)), *body]


def _merge_constants(parts: Sequence[Segment]) -> list[Segment]:
    """Adjacent constant segments as one."""
    merged: list[Segment] = []
    for s in parts:
        if s.constant is not None and merged and merged[-1].constant is not None:
            merged[-1] = const(merged[-1].constant + s.constant, s.rows)
        else:
            merged.append(s)
    return merged


def _side_by_side(parts: Sequence[Segment]) -> np.ndarray:
    """The segments' bytes as one (N, total width) array, record i in row i."""
    n = parts[0].rows
    offsets = np.cumsum([0] + [s.width for s in parts])
    record = np.dtype({"names": [f"s{i}" for i in range(len(parts))],
                       "formats": [f"V{s.width}" for s in parts],
                       "offsets": offsets[:-1].tolist(), "itemsize": int(offsets[-1])})
    out = np.empty(n, record)
    for i, s in enumerate(parts):
        if s.constant is not None:
            out[f"s{i}"] = np.void(s.constant)
        else:
            data = np.ascontiguousarray(s.data)
            out[f"s{i}"] = data.view(f"V{s.width}").reshape(n)
    return out.view(np.uint8).reshape(n, int(offsets[-1]))


def to_bytes(parts: Sequence[Segment]) -> bytes:
    """All records' used bytes, record after record."""
    parts = _merge_constants(parts)
    if any(s.splice is not None for s in parts):
        return _joined(parts)
    return _used_bytes(parts)


def _used_bytes(parts: Sequence[Segment]) -> bytes:
    rows = _side_by_side(parts)
    if all(s.mask is None for s in parts):
        return rows.tobytes()
    mask = np.concatenate([s.full_mask() for s in parts], axis=1)
    return rows[mask].tobytes()


def _record_pieces(parts: Sequence[Segment]) -> list[bytes]:
    """Each record's bytes of these (matrix) segments, one bytes object per record."""
    rows = _side_by_side(parts)
    if all(s.mask is None for s in parts):
        return rows.view(f"V{rows.shape[1]}").ravel().tolist()
    flat = _used_bytes(parts)
    ends = np.cumsum(length(parts)).tolist()
    return [flat[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]


def _joined(parts: Sequence[Segment]) -> bytes:
    """Records with spliced segments: runs of matrix segments assembled with numpy, the
    spliced payloads joined in between, record after record."""
    columns: list[list[bytes]] = []
    run: list[Segment] = []
    for s in parts:
        if s.splice is None:
            run.append(s)
            continue
        if run:
            columns.append(_record_pieces(run))
            run = []
        choices, index = s.splice
        columns.append([choices[i] for i in index.tolist()])
    if run:
        columns.append(_record_pieces(run))
    return b"".join(itertools.chain.from_iterable(zip(*columns, strict=True)))
