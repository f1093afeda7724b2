"""Vectorised protobuf wire-format scanning: many messages walked at once with numpy.

Python cannot afford a loop per packet for millions of packets, so every message
of a batch advances one field per round ("lockstep"): a round decodes the next
tag and value of all still-unfinished messages with array operations. A batch
takes as many rounds as its longest message has fields.
"""

from __future__ import annotations

from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from itertools import pairwise
from typing import NoReturn

import numpy as np
from neuron_explorer.common.numba_available import numba_available

WT_VARINT, WT_FIXED64, WT_LEN, WT_FIXED32 = 0, 1, 2, 5
CHUNK = 1 << 17  # messages walked together; small enough for the CPU caches
# The compiled walk (wire_compiled, numba) does the work from this many messages on. Its
# first use in a process costs about a second (importing numba, loading the compiled code
# from numba's cache), which it wins back from about this many bytes of messages on;
# once it has run, it takes every scan of COMPILED_MIN messages or more.
COMPILED_MIN = 20_000
COMPILED_FIRST_BYTES = 96 << 20
_compiled_warm = False
_compiled_wanted = False  # a caller scanning a large whole in pieces asked for it


class WireError(ValueError):
    """The bytes are not valid protobuf; `position` is the byte offset of the problem."""

    def __init__(self, reason: str, position: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.position = position


def varint_at(buf: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Decode the varint starting at each position: (values uint64, lengths; -1 if cut off)."""
    size = len(buf)
    n = len(pos)
    if not n:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    # Most varints (tags, small numbers) are one byte: decode those without fancy indexing.
    if pos.max() < size:  # the usual case: no bounds to mind
        b0 = buf[pos]
        longer = b0 >= 0x80
        length = np.where(longer, -1, 1)
        active = np.flatnonzero(longer)
    else:
        b0 = buf[np.minimum(pos, size - 1)]
        length = np.where(b0 < 0x80, 1, -1).astype(np.int64)
        length[pos >= size] = -1
        active = np.flatnonzero((b0 >= 0x80) & (pos < size))
    value = (b0 & 0x7F).astype(np.uint64)
    # the longer ones, byte by byte, kept packed: start, value so far
    start = pos[active]
    acc = value[active]
    for k in range(1, 10):
        if not len(active):
            break
        at = start + k
        inside = at < size
        if not inside.all():  # cut off by the data's end: keep their bits so far
            value[active[~inside]] = acc[~inside]
            active, at, start, acc = active[inside], at[inside], start[inside], acc[inside]
        b = buf[at]
        acc |= (b & 0x7F).astype(np.uint64) << np.uint64(7 * k)
        done = b < 0x80
        if done.all():
            value[active] = acc
            length[active] = k + 1
            return value, length
        if done.any():
            value[active[done]] = acc[done]
            length[active[done]] = k + 1
            more = ~done
            active, start, acc = active[more], start[more], acc[more]
    value[active] = acc  # cut off or over ten bytes: their bits so far, as before
    return value, length


def fixed_at(buf: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
    """Little-endian fixed64 (width 8) or fixed32 (width 4) at each position, as uint64."""
    if not len(pos):
        return np.zeros(0, np.uint64)
    dtype = "<u8" if width == 8 else "<u4"
    room = len(buf) - width + 1
    if room > 0 and buf.flags.c_contiguous and pos.min() >= 0 and pos.max() < room:
        # a view with a value starting at every byte: one gather reads them all
        every = np.ndarray((room,), dtype, buffer=buf, strides=(1,))
        return every[pos].astype(np.uint64)
    idx = np.minimum(pos[:, None] + np.arange(width), len(buf) - 1)
    raw = np.ascontiguousarray(buf[idx])
    return raw.view(dtype).ravel().astype(np.uint64)


@dataclass
class Fields:
    """Repeated fields of a batch of messages, one row per field; each message's rows keep
    their file order."""

    msg: np.ndarray  # index of the message (into the batch) holding the field
    field: np.ndarray  # field number
    wire: np.ndarray  # wire type
    value: np.ndarray  # uint64: varint or fixed value; payload length for wire type 2
    offset: np.ndarray  # byte offset of the payload (wire type 2) or of the value
    _groups: dict[int, slice] | None = None
    _order: np.ndarray | None = None

    def _index(self) -> None:
        """Group rows by field number once (stable: message order kept within a field)."""
        numbers = self.field
        if len(numbers) and numbers.min() >= 0 and numbers.max() < 1 << 15:
            numbers = numbers.astype(np.int16)  # a 16-bit stable sort is a fast radix sort
        self._order = np.argsort(numbers, kind="stable")
        numbers = self.field[self._order]
        if not len(numbers):  # no repeated field at all (no categories, args or flows)
            self._groups = {}
            return
        bounds = np.flatnonzero(np.r_[True, numbers[1:] != numbers[:-1], True])
        self._groups = {int(numbers[a]): slice(int(a), int(b))
                        for a, b in pairwise(bounds.tolist())}

    @classmethod
    def empty(cls) -> Fields:
        none = np.zeros(0, np.int64)
        return cls(none.astype(np.int32), none, none.astype(np.uint8), none.astype(np.uint64),
                   none)

    def select(self, field: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(msg, wire, value, offset) of one field number; a message's rows in file order."""
        if self._groups is None:
            self._index()
        assert self._groups is not None and self._order is not None
        part = self._groups.get(field)
        rows = self._order[part] if part is not None else np.zeros(0, np.int64)
        return self.msg[rows], self.wire[rows], self.value[rows], self.offset[rows]

    def numbers(self) -> set[int]:
        """Field numbers present."""
        if self._groups is None:
            self._index()
        assert self._groups is not None
        return set(self._groups)


# wire type -> class: 0 varint, 1 length-delimited, 3 fixed64, 4 fixed32, 5 invalid
_WIRE_CLASS = np.array([0, 3, 1, 5, 5, 4, 5, 5], np.int8)


_Round = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _rounds(buf: np.ndarray, start: np.ndarray, end: np.ndarray,
            bad: np.ndarray | None = None) -> Iterator[_Round]:
    """Yield, round by round, (msg, field, wire, value, offset) of the next field of every
    unfinished message; checks every field fits its message.

    A field that does not raises a WireError; with `bad` (a mask over the messages), its
    message is marked there and walked no further instead.
    """
    msg = np.flatnonzero(end > start).astype(np.int32)
    cur = start[msg].astype(np.int64)
    stop = end[msg].astype(np.int64)
    # every field starts before its message's end; when no end lies past the data,
    # each tag's first byte can be read without a bounds check
    inside = not len(stop) or int(stop.max()) <= len(buf)
    while len(msg):
        b0 = buf[cur] if inside else None
        if b0 is not None and not (b0 >= 0x80).any():  # one-byte tags: fields 1 to 15
            tag_len = None  # all 1
            p = cur + 1
            field = b0 >> 3  # uint8: below 16
            wire = b0 & np.uint8(7)
        else:
            tag, tag_len = varint_at(buf, cur)
            p = cur + tag_len
            field = (tag >> np.uint64(3)).view(np.int64)
            wire = (tag & np.uint64(7)).astype(np.uint8)
        v0 = buf[p] if int(p.max()) < len(buf) else None
        if v0 is not None and not (v0 >= 0x80).any():  # one-byte values (lengths, ids, enums)
            value, vlen = v0.astype(np.uint64), None  # lengths all 1
            offset = p + 1
        else:
            value, vlen = varint_at(buf, p)
            offset = p + vlen  # a varint: the next field; a length: the payload
        nxt = offset + np.where(wire == WT_LEN, value.view(np.int64), 0)
        odd = np.flatnonzero(wire & np.uint8(5))  # not a varint nor a length (0, 2)
        cls = _WIRE_CLASS[wire[odd]]
        if len(odd):  # fixed-size values (flow ids, doubles), or an invalid wire type
            width = np.where(cls == 3, 8, np.where(cls == 4, 4, 1 << 40))
            offset[odd] = p[odd]
            nxt[odd] = p[odd] + width
            if vlen is not None:
                vlen[odd] = 0
        over = (nxt > stop) | (nxt <= cur)  # a length of 2**63 or more reads as negative
        if (over.any() or (vlen is not None and vlen.min() < 0)
                or (tag_len is not None and tag_len.min() < 0)):
            if bad is None:
                _raise_first_problem(over, cur, field, wire, vlen, tag_len)
            # the tolerant walk: drop the messages with a broken field from this round on
            broken = over | (vlen < 0 if vlen is not None else False) | (
                tag_len < 0 if tag_len is not None else False)
            bad[msg[broken]] = True
            ok = ~broken
            msg, cur, stop, p, nxt = msg[ok], cur[ok], stop[ok], p[ok], nxt[ok]
            field, wire, value, offset = field[ok], wire[ok], value[ok], offset[ok]
            odd = np.flatnonzero(wire & np.uint8(5))
            cls = _WIRE_CLASS[wire[odd]]
            if not len(msg):
                return
        if len(odd):
            f64 = odd[cls == 3]
            f32 = odd[cls == 4]
            value[f64] = fixed_at(buf, p[f64], 8)
            value[f32] = fixed_at(buf, p[f32], 4)
        yield msg, field, wire, value, offset
        more = nxt < stop
        if more.all():  # no message ended this round
            cur = nxt
        else:
            msg, cur, stop = msg[more], nxt[more], stop[more]


def _raise_first_problem(bad: np.ndarray, cur: np.ndarray, field: np.ndarray, wire: np.ndarray,
                         vlen: np.ndarray | None, tag_len: np.ndarray | None) -> NoReturn:
    """Raise a WireError for the first message of the round whose field is not valid (None
    lengths: all one byte)."""
    if tag_len is None:
        tag_len = np.ones(len(cur), np.int64)
    if vlen is None:
        vlen = np.ones(len(cur), np.int64)
    bad = bad | (tag_len < 0) | (vlen < 0)
    i = int(np.flatnonzero(bad)[0])
    if tag_len[i] > 0 and _WIRE_CLASS[wire[i]] == 5:  # flagged through its huge width
        reason = f"invalid field (number {field[i]}, wire type {wire[i]})"
    elif tag_len[i] > 0:
        reason = f"field {field[i]} runs past the end of its message"
    else:
        reason = "a field tag runs past the end of the data"
    raise WireError(reason, int(cur[i]))


@dataclass
class Scan:
    """Fields of a batch of messages: scalar fields in per-message slots, repeated ones as rows.

    `value[s, i]` holds slot s of message i and `field[s, i]` the number of the field
    that filled it (0: absent); several field numbers may share a slot (the
    alternatives of a oneof). `offset[s][i]` is the payload offset, kept only for the
    slots asked for (length-delimited ones). `rows` holds the repeated fields, `others`
    the numbers of fields neither asked for.
    """

    value: np.ndarray
    offset: dict[int, np.ndarray]
    field: np.ndarray
    rows: Fields
    others: np.ndarray


def scan(buf: np.ndarray, start: np.ndarray, end: np.ndarray, slots: dict[int, int],
         repeated: AbstractSet[int], offsets: AbstractSet[int] = frozenset(),
         bad: np.ndarray | None = None) -> Scan:
    """Walk the messages in lockstep, sorting each field into its slot, the rows, or others;
    `offsets` names the slots whose payload offsets are kept. With `bad` (a mask over the
    messages) a message with a broken field is marked there instead of raising WireError;
    what was read of it stays in the result, for the caller to drop."""
    n = len(start)
    k = max(slots.values(), default=-1) + 1
    top = max([*slots, *repeated, 0]) + 1
    # one lookup per field: its slot, REPEATED, or OTHER (numbers >= top count as OTHER)
    repeated_code, other_code = k, k + 1
    # at least 16 entries: the numbers of one-byte tags (uint8, below 16) index it directly
    code_of = np.full(max(top + 1, 16), other_code, np.int64)
    for number, slot in slots.items():
        code_of[number] = slot
    code_of[list(repeated)] = repeated_code
    if max(slots, default=0) >= 1 << 15:
        raise ValueError("slotted field numbers must fit in int16")
    off_slots = sorted(offsets)
    off_row = np.full(k + 2, -1, np.int64)  # code -> row of `offset`
    off_row[off_slots] = np.arange(len(off_slots))
    value = np.zeros((k, n), np.uint64)
    offset = np.zeros((len(off_slots), n), np.int64)
    which = np.zeros((k, n), np.int16)
    if _use_compiled(start, end):
        return _compiled_scan(buf, start, end, code_of, top, k, off_row, value, offset,
                              which, off_slots, bad)
    value_1d, offset_1d, which_1d = value.reshape(-1), offset.reshape(-1), which.reshape(-1)
    parts, others = [], []
    # in chunks of messages, so the arrays of a round stay in the CPU caches
    for lo in range(0, n, CHUNK):
        hi = min(lo + CHUNK, n)
        part = bad[lo:hi] if bad is not None else None
        for msg, field, wire, val, off in _rounds(buf, start[lo:hi], end[lo:hi], part):
            number = int(field[0])
            if (field == number).all():  # the usual round: every message at the same field
                code = int(code_of[min(number, top)])
            else:
                codes = code_of[field if field.dtype == np.uint8 else np.minimum(field, top)]
                code = int(codes[0]) if (codes == codes[0]).all() else -1
                if code < 0:
                    # a mixed round: each message's field to its slot, the rows or others
                    slotted = np.flatnonzero(codes < k)
                    where = msg[slotted] + lo
                    flat = codes[slotted] * n + where
                    value_1d[flat] = val[slotted]
                    which_1d[flat] = field[slotted]
                    if off_slots:
                        row = off_row[codes[slotted]]
                        keep = np.flatnonzero(row >= 0)
                        offset_1d[row[keep] * n + where[keep]] = off[slotted][keep]
                    r = np.flatnonzero(codes == repeated_code)
                    if len(r):
                        parts.append((msg[r] + np.int32(lo), field[r], wire[r], val[r], off[r]))
                    o = codes == other_code
                    if o.any():
                        others.append(field[o])
                    continue
            # one slot (or the rows, or others) for the whole round
            where = msg + lo
            if code < k:
                flat = where + np.int64(code * n)
                value_1d[flat] = val
                which_1d[flat] = field
                if off_row[code] >= 0:
                    offset_1d[where + np.int64(off_row[code] * n)] = off
            elif code == repeated_code:
                parts.append((where, field, wire, val, off))
            else:
                others.append(field)
    if parts:
        msgs, fields, wires, values, offs = (np.concatenate(c) for c in zip(*parts, strict=True))
        rows = Fields(msgs, fields, wires, values, offs)
    else:
        empty = np.zeros(0, np.int64)
        rows = Fields(empty.astype(np.int32), empty, empty.astype(np.uint8),
                      np.zeros(0, np.uint64), empty)
    return Scan(value, {slot: offset[i] for i, slot in enumerate(off_slots)}, which, rows,
                np.concatenate(others) if others else np.zeros(0, np.int64))


def _compiled_scan(buf: np.ndarray, start: np.ndarray, end: np.ndarray, code_of: np.ndarray,
                   top: int, k: int, off_row: np.ndarray, value: np.ndarray,
                   offset: np.ndarray, which: np.ndarray, off_slots: list[int],
                   bad: np.ndarray | None) -> Scan:
    """`scan` by the compiled walk: the same result, one pass over the bytes."""
    from neuron_explorer.loaders import wire_compiled  # imports numba: only when needed

    global _compiled_warm
    msg, field, wire, val, off, others, reason, _, position = wire_compiled.walk(
        buf, start, end, code_of, top, k, off_row, value, offset, which, bad, CHUNK)
    _compiled_warm = True
    if reason != wire_compiled.OK:
        raise WireError(_reason(buf, reason, position), position)
    return Scan(value, {slot: offset[i] for i, slot in enumerate(off_slots)}, which,
                Fields(msg, field, wire, val, off), others)


def _use_compiled(start: np.ndarray, end: np.ndarray) -> bool:
    """Whether the compiled walk is worth its start-up for these messages."""
    if len(start) < COMPILED_MIN or not numba_available():
        return False
    return (_compiled_warm or _compiled_wanted
            or int(np.maximum(end - start, 0).sum()) >= COMPILED_FIRST_BYTES)


def prefer_compiled_for(nbytes: int) -> None:
    """A caller about to scan `nbytes` of messages in pieces: the compiled walk takes the
    pieces when the whole is worth its start-up, as one scan of them all would."""
    global _compiled_wanted
    if nbytes >= COMPILED_FIRST_BYTES:
        _compiled_wanted = True


def _reason(buf: np.ndarray, reason: int, position: int) -> str:
    """The words of a broken field's problem, as `_raise_first_problem` gives them."""
    from neuron_explorer.loaders import wire_compiled

    if reason == wire_compiled.INVALID_FIELD:
        tag, _ = _varint(buf[position:position + 10].tobytes(), 0)
        return f"invalid field (number {tag >> 3}, wire type {tag & 7})"
    if reason == wire_compiled.PAST_MESSAGE:
        tag, _ = _varint(buf[position:position + 10].tobytes(), 0)
        return f"field {tag >> 3} runs past the end of its message"
    return "a field tag runs past the end of the data"


def packet_offsets(buf: np.ndarray) -> tuple[np.ndarray, np.ndarray, str | None, int]:
    """Start and end of each top-level `Trace.packet` (field 1) in file order.

    Returns (starts, ends, problem, position): problem is None for a clean file,
    "truncated" when the last packet is cut off (the complete ones are returned),
    or "corrupt" when the bytes after a packet are not another packet.
    """
    size = len(buf)
    cand = _candidates(buf)
    if not len(cand) or cand[0] != 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), "corrupt", 0
    length, llen = varint_at(buf, cand + 1)
    body = cand + 1 + llen
    nxt = body + length.astype(np.int64)
    next_idx = _candidate_at(buf, cand, nxt)
    next_idx[(nxt == size) & (llen > 0)] = -2  # clean end
    next_idx[(nxt > size) | (llen < 0)] = -3  # cut off
    idx, i = _chain_fast(next_idx)
    if idx is None:
        idx, i = _chain_walk(next_idx)
    problem = {-1: "corrupt", -2: None, -3: "truncated"}[i]
    position = int(nxt[idx[-1]]) if len(idx) else 0  # where the good packets stop
    return body[idx], nxt[idx], problem, position


def _candidates(buf: np.ndarray) -> np.ndarray:
    """Positions of the 0x0A bytes (where a packet may start), found a block at a time: one
    mask of the whole file would be a large fresh allocation, paid for in page faults."""
    block = 1 << 22
    parts = [np.flatnonzero(buf[lo:lo + block] == 0x0A) + lo for lo in range(0, len(buf), block)]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _candidate_at(buf: np.ndarray, cand: np.ndarray, nxt: np.ndarray) -> np.ndarray:
    """For each candidate, the index of the candidate at its packet's end (-1: none there).

    Most packets hold no 0x0A byte, so the next candidate is usually the one; only the
    others are searched for.
    """
    n, size = len(cand), len(buf)
    next_idx = np.full(n, -1, np.int64)
    points_at_following = np.flatnonzero(cand[1:] == nxt[:-1])
    next_idx[points_at_following] = points_at_following + 1
    rest = np.flatnonzero((next_idx < 0) & (nxt >= 0) & (nxt < size))  # huge lengths wrap
    rest = rest[buf[nxt[rest]] == 0x0A]  # only ends on a candidate byte are worth a search
    next_idx[rest] = np.searchsorted(cand, nxt[rest])
    return next_idx


def _chain_fast(next_idx: np.ndarray) -> tuple[np.ndarray | None, int]:
    """The chain of packets from candidate 0, without a Python loop when it is clean.

    A 0x0A byte inside a packet is rarely pointed at by another candidate, so keeping
    candidate 0 and the candidates that kept ones point at, a few times over, leaves
    the chain; it is accepted as soon as each kept candidate points at the next one.
    Returns (None, 0) otherwise.
    """
    n = len(next_idx)
    sources, size = next_idx, n + 1
    for _ in range(8):  # keep candidate 0 and those that kept ones point at
        kept = np.zeros(n, bool)
        kept[0] = True
        kept[sources[sources >= 0]] = True
        idx = np.flatnonzero(kept)
        if (next_idx[idx[:-1]] == idx[1:]).all():  # each points at the next: the chain
            break
        if len(idx) == size:  # nothing more to drop (the kept set only ever shrinks)
            return None, 0
        sources, size = next_idx[idx], len(idx)
    else:
        return None, 0
    last = int(next_idx[idx[-1]])
    if last >= 0:
        return None, 0
    if last == -3:
        idx = idx[:-1]
    return idx.astype(np.int64), last


def _chain_walk(next_idx: np.ndarray) -> tuple[np.ndarray, int]:
    """The chain of packets from candidate 0, followed one packet at a time."""
    chain = next_idx.tolist()
    picked = []
    i = 0
    while i >= 0:
        picked.append(i)
        i = chain[i]
    if i == -3:
        picked.pop()
    return np.asarray(picked, np.int64), i


def read_message(data: bytes | bytearray, start: int, end: int) -> list[tuple[int, int, int]]:
    """One message's fields as (field, value, offset), for the few messages read one by one.

    `value` is the varint or fixed value, or the payload length for wire type 2;
    `offset` is where the payload starts.
    """
    out = []
    pos = start
    while pos < end:
        tag, pos = _varint(data, pos)
        field, wire = tag >> 3, tag & 7
        if wire == WT_VARINT:
            value, nxt = _varint(data, pos)
            out.append((field, value, pos))
        elif wire == WT_LEN:
            value, body = _varint(data, pos)
            nxt = body + value
            out.append((field, value, body))
        elif wire == WT_FIXED64:
            nxt = pos + 8
            out.append((field, int.from_bytes(data[pos:nxt], "little"), pos))
        elif wire == WT_FIXED32:
            nxt = pos + 4
            out.append((field, int.from_bytes(data[pos:nxt], "little"), pos))
        else:
            raise WireError(f"invalid wire type {wire} in field {field}", pos)
        if nxt > end:
            raise WireError(f"field {field} runs past the end of its message", pos)
        pos = nxt
    return out


def _varint(data: bytes | bytearray, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise WireError("a varint runs past the end of the data", pos)
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
