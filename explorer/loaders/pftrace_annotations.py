"""Debug annotations of a .pftrace, decoded column-wise into typed columns (no boxing).

Each annotation becomes one row: slice id, key code, value kind, and the value in
the column of its kind. Python objects are only made for string values and when a
caller asks for dicts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from neuron_explorer.common.perfetto_fields import (
    A_ARRAY,
    A_BOOL,
    A_DICT,
    A_DOUBLE,
    A_INT,
    A_JSON,
    A_NAME,
    A_NAME_IID,
    A_NESTED,
    A_POINTER,
    A_STRING,
    A_STRING_IID,
    A_UINT,
)
from neuron_explorer.loaders.args import (
    KIND_BOOL,
    KIND_FLOAT,
    KIND_INT,
    KIND_OTHER,
    KIND_STR,
    ColumnArgs,
)
from neuron_explorer.loaders.wire_scan import Scan, WireError, scan

# slots: 0 name iid, 1 inline name, 2 the scalar value (one field of the oneof), 3 nested
SLOTS = {A_NAME_IID: 0, A_NAME: 1, A_BOOL: 2, A_UINT: 2, A_INT: 2, A_DOUBLE: 2, A_STRING: 2,
         A_POINTER: 2, A_JSON: 2, A_STRING_IID: 2, A_NESTED: 3, A_DICT: 3, A_ARRAY: 3}


class _Unreadable(Exception):
    """A nested annotation protobuf cannot parse."""


def _nested_value(raw: bytes | bytearray) -> Any:
    """A nested, dict or array annotation as Python values (rare: parsed one by one)."""
    from google.protobuf.message import DecodeError
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2

    try:
        ann = perfetto_trace_pb2.DebugAnnotation.FromString(bytes(raw))
    except (DecodeError, RecursionError):
        raise _Unreadable from None

    def value(a: Any) -> Any:
        if a.dict_entries:
            return {e.name: value(e) for e in a.dict_entries}
        if a.array_values:
            return [value(e) for e in a.array_values]
        which = a.WhichOneof("value")
        return getattr(a, which) if which else None

    return value(ann)


def interned_keys(seqgen: np.ndarray, iids: np.ndarray) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """A code per (sequence generation, iid) and the distinct pairs, in code order: names
    are then looked up once per distinct pair. Iids may take all 64 bits."""
    iids = iids.astype(np.uint64, copy=False)
    if not len(iids):
        return np.zeros(0, np.intp), []
    if int(iids.max()) < 1 << 40 and int(seqgen.max()) < 1 << 22:  # one int64 key each
        inverse, uniq = pd.factorize(seqgen.astype(np.int64) * (1 << 40) + iids.astype(np.int64))
        return inverse, [divmod(c, 1 << 40) for c in uniq.tolist()]
    icode, iuniq = pd.factorize(iids)
    width = len(iuniq)
    inverse, uniq = pd.factorize(seqgen.astype(np.int64) * width + icode)
    distinct = iuniq.tolist()
    return inverse, [(c // width, int(distinct[c % width])) for c in uniq.tolist()]


def _texts(data: bytes | bytearray, offsets: np.ndarray, lengths: np.ndarray) -> Any:
    """The strings at the given byte spans, as an object array."""
    codes, values = _text_codes(data, offsets, lengths)
    return values[codes]


def _text_codes(data: bytes | bytearray, offsets: np.ndarray, lengths: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """The strings at the given byte spans, as codes into their distinct values (an object
    array). Gathered into one buffer and decoded by Arrow, each distinct string made once
    (values repeat: opcodes, sources, shapes); invalid UTF-8 falls back to decoding one by
    one with replacement characters."""
    import pyarrow as pa

    lengths = np.asarray(lengths, np.int64)
    if not len(lengths):
        return np.zeros(0, np.int64), np.zeros(0, object)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    # byte i of the gathered buffer comes from data[offsets[span] + (i - starts[span])]
    index = np.int32 if max(len(data), int(ends[-1])) < 2**31 else np.int64  # half the memory
    take = np.arange(int(ends[-1]), dtype=index) - np.repeat((starts - offsets).astype(index),
                                                             lengths)
    buf = np.frombuffer(data, np.uint8)[take]
    try:
        strings = pa.LargeStringArray.from_buffers(
            len(lengths), pa.py_buffer(np.r_[0, ends].astype(np.int64)), pa.py_buffer(buf))
        strings.validate(full=True)  # UTF-8 checked here
    except (pa.ArrowInvalid, ValueError):
        codes, values = pd.factorize(np.asarray(
            [data[a:a + b].decode("utf-8", "replace")
             for a, b in zip(offsets.tolist(), lengths.tolist(), strict=True)], object))
        return codes.astype(np.int64), np.asarray(values, object)
    coded = strings.dictionary_encode()
    values = np.asarray(coded.dictionary.to_pylist(), object)
    return coded.indices.to_numpy(zero_copy_only=False).astype(np.int64), values


def _key_codes(state: Any, data: bytes | bytearray, sc: Scan, n: int, ev_seqgen: np.ndarray,
               ev: np.ndarray, keys: dict[str, int]) -> np.ndarray:
    """Each annotation's key as a code into `keys` (the key names met so far, shared by
    every chunk, each coded in the order met; new ones added)."""
    codes = np.full(n, keys.setdefault("?", len(keys)), np.int32)
    m = np.flatnonzero(sc.field[0] == A_NAME_IID)
    if len(m):
        inverse, pairs = interned_keys(ev_seqgen[ev[m]], sc.value[0][m])
        mapped = []
        for seqgen, iid in pairs:
            seq, gen = state.pairs[seqgen]
            name = state.interned.get((seq, gen, "ann"), {}).get(iid, "?")
            mapped.append(keys.setdefault(name, len(keys)))
        codes[m] = np.asarray(mapped, np.int32)[inverse]
    m = np.flatnonzero(sc.field[1] == A_NAME)
    if len(m):
        codes[m] = [keys.setdefault(t, len(keys))
                    for t in _texts(data, sc.offset[1][m], sc.value[1][m])]
    return codes


@dataclass
class Annotations:
    """Where the debug annotations of slice events are: one row per annotation."""

    ev: np.ndarray  # track event holding it
    sid: np.ndarray  # its slice id
    offset: np.ndarray  # annotation message bytes
    length: np.ndarray

    @classmethod
    def of(cls, rows: Sequence[np.ndarray], slice_of_event: np.ndarray) -> Annotations:
        """From the events' annotation rows: event, length and offset of each."""
        ev, length, offset = rows
        sid = slice_of_event[ev] if len(ev) else np.zeros(0, np.int64)
        if length.dtype.kind == "u":  # as the wire scan reads them: signed for arithmetic
            length = length.astype(np.int64)
        keep = sid >= 0
        if keep.all():  # as a rule: no copy of a large trace's rows
            return cls(ev, sid, offset, length)
        return cls(ev[keep], sid[keep], offset[keep], length[keep])

    def subset(self, mask: np.ndarray) -> Annotations:
        return Annotations(self.ev[mask], self.sid[mask], self.offset[mask], self.length[mask])


# Annotations scanned at once: the field scan (a slot per field of every annotation) is
# the largest transient of decoding the args, so a chunk at a time keeps it small.
ANNOTATIONS_PER_CHUNK = 1 << 18


def decode_annotations(data: bytes | bytearray, buf: np.ndarray, ann: Annotations,
                       ev_seqgen: np.ndarray, state: Any, n_slices: int,
                       dropped: Callable[[int, int], None] | None = None) -> ColumnArgs:
    """Typed args of the given annotations. Corrupt ones (a broken field, a nested value
    protobuf cannot parse) are left out: `dropped(count, first byte offset)` hears of them."""
    n = len(ann.ev)
    keys: dict[str, int] = {}
    codes = np.empty(n, np.int32)
    kind = np.empty(n, np.int8)
    ival = np.empty(n, np.int64)
    fval = np.empty(n, np.float64)
    scode = np.empty(n, np.int64)  # each row's string: a code into svalues
    bad = np.zeros(n, bool)
    svalues: list[Any] = []
    for lo in range(0, n, ANNOTATIONS_PER_CHUNK):
        part = slice(lo, min(lo + ANNOTATIONS_PER_CHUNK, n))
        decode_chunk(data, buf, ann.ev[part], ann.offset[part], ann.length[part], ev_seqgen,
                      state, keys, svalues, (codes[part], kind[part], ival[part], fval[part],
                                             scode[part], bad[part]))
    sid = ann.sid
    if bad.any():
        if dropped is not None:
            dropped(int(bad.sum()), int(ann.offset[np.flatnonzero(bad)[0]]))
        keep = ~bad
        sid, codes, kind, ival, fval, scode = (sid[keep], codes[keep], kind[keep], ival[keep],
                                               fval[keep], scode[keep])
    values = np.empty(len(svalues), object)
    for i, v in enumerate(svalues):  # one by one: a nested list must stay one value
        values[i] = v
    return ColumnArgs(sid, codes, list(keys), kind, ival, fval, (scode, values), n_slices)


def decode_chunk(data: bytes | bytearray, buf: np.ndarray, ev: np.ndarray, offset: np.ndarray,
                  length: np.ndarray, ev_seqgen: np.ndarray, state: Any, keys: dict[str, int],
                  svalues: list[Any], out: tuple[np.ndarray, ...]) -> None:
    """Decode one chunk of annotations into `out` (views of the whole columns: key code,
    kind, int, float, string code, broken); their strings are appended to `svalues`."""
    codes, kind, ival, fval, scode, bad = out
    try:
        sc = scan(buf, offset, offset + length, SLOTS, set(), offsets={1, 2})
    except WireError:  # rare: walk again, marking the broken annotations
        sc = scan(buf, offset, offset + length, SLOTS, set(), offsets={1, 2}, bad=bad)
    codes[:] = _key_codes(state, data, sc, len(ev), ev_seqgen, ev, keys)
    which = sc.field[2]
    raw = sc.value[2]
    kind[:], ival[:], fval[:], scode[:] = KIND_OTHER, 0, 0.0, -1

    def put(rows: np.ndarray, codes: np.ndarray, values: Any) -> None:
        scode[rows] = np.asarray(codes, np.int64) + len(svalues)
        svalues.extend(values)

    m = which == A_BOOL
    kind[m], ival[m] = KIND_BOOL, raw[m] != 0
    m = (which == A_UINT) | (which == A_POINTER) | (which == A_INT)
    kind[m], ival[m] = KIND_INT, raw[m].view(np.int64)
    m = which == A_DOUBLE
    kind[m], fval[m] = KIND_FLOAT, raw[m].view(np.float64)
    m = np.flatnonzero((which == A_STRING) | (which == A_JSON))
    kind[m] = KIND_STR
    put(m, *_text_codes(data, sc.offset[2][m], raw[m]))
    m = np.flatnonzero(which == A_STRING_IID)
    if len(m):
        kind[m] = KIND_STR
        put(m, *state.resolve_string_codes(ev_seqgen[ev[m]], raw[m]))
    for i in np.flatnonzero(sc.field[3] != 0).tolist():
        start = int(offset[i])
        kind[i] = KIND_OTHER
        scode[i] = -1
        try:
            value = _nested_value(data[start:start + int(length[i])])
        except _Unreadable:
            bad[i] = True
        else:
            scode[i] = len(svalues)
            svalues.append(value)
