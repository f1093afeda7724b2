"""Vectorised protobuf wire-format scanning: many messages walked at once with numpy.

Python cannot afford a loop per packet for millions of packets, so every message
of a batch advances one field per round ("lockstep"): a round decodes the next
tag and value of all still-unfinished messages with array operations. A batch
takes as many rounds as its longest message has fields.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

WT_VARINT, WT_FIXED64, WT_LEN, WT_FIXED32 = 0, 1, 2, 5


class WireError(ValueError):
    """The bytes are not valid protobuf; `position` is the byte offset of the problem."""

    def __init__(self, reason: str, position: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.position = position


def varint_at(buf: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Decode the varint starting at each position: (values uint64, lengths; -1 if cut off)."""
    n = len(pos)
    value = np.zeros(n, np.uint64)
    length = np.full(n, -1, np.int64)
    active = np.arange(n)
    size = len(buf)
    for k in range(10):
        at = pos[active] + k
        inside = at < size
        if not inside.all():
            active = active[inside]
            at = at[inside]
        if not len(active):
            break
        b = buf[at]
        value[active] |= (b & 0x7F).astype(np.uint64) << np.uint64(7 * k)
        done = b < 0x80
        length[active[done]] = k + 1
        active = active[~done]
        if not len(active):
            break
    return value, length


def fixed_at(buf: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
    """Little-endian fixed64 (width 8) or fixed32 (width 4) at each position, as uint64."""
    if not len(pos):
        return np.zeros(0, np.uint64)
    idx = np.minimum(pos[:, None] + np.arange(width), len(buf) - 1)
    raw = np.ascontiguousarray(buf[idx])
    dtype = "<u8" if width == 8 else "<u4"
    return raw.view(dtype).ravel().astype(np.uint64)


@dataclass
class Fields:
    """Every field of a batch of messages, in order within each message."""

    msg: np.ndarray  # index of the message (into the batch) holding the field
    field: np.ndarray  # field number
    wire: np.ndarray  # wire type
    value: np.ndarray  # uint64: varint or fixed value; payload length for wire type 2
    offset: np.ndarray  # byte offset of the payload (wire type 2) or of the value

    def select(self, field: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(msg, wire, value, offset) of one field number."""
        m = self.field == field
        return self.msg[m], self.wire[m], self.value[m], self.offset[m]


def scan_fields(buf: np.ndarray, start: np.ndarray, end: np.ndarray) -> Fields:
    """Walk all fields of the messages buf[start[i]:end[i]] in lockstep."""
    parts: list[tuple[np.ndarray, ...]] = []
    msg = np.flatnonzero(end > start)
    cur = start[msg].astype(np.int64)
    stop = end[msg].astype(np.int64)
    while len(msg):
        tag, tag_len = varint_at(buf, cur)
        if (tag_len < 0).any():
            raise WireError("a field tag runs past the end of the data", int(cur[tag_len < 0][0]))
        p = cur + tag_len
        field = (tag >> np.uint64(3)).astype(np.int64)
        wire = (tag & np.uint64(7)).astype(np.int64)
        value, vlen = varint_at(buf, p)
        offset = p.copy()
        nxt = np.empty_like(cur)
        is_var = wire == WT_VARINT
        is_len = wire == WT_LEN
        is_f64 = wire == WT_FIXED64
        is_f32 = wire == WT_FIXED32
        bad = ~(is_var | is_len | is_f64 | is_f32) | ((is_var | is_len) & (vlen < 0))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise WireError(f"invalid field (number {field[i]}, wire type {wire[i]})", int(cur[i]))
        nxt[is_var] = p[is_var] + vlen[is_var]
        offset[is_len] = p[is_len] + vlen[is_len]
        nxt[is_len] = offset[is_len] + value[is_len].astype(np.int64)
        nxt[is_f64] = p[is_f64] + 8
        nxt[is_f32] = p[is_f32] + 4
        if is_f64.any():
            value[is_f64] = fixed_at(buf, p[is_f64], 8)
        if is_f32.any():
            value[is_f32] = fixed_at(buf, p[is_f32], 4)
        over = nxt > stop
        if over.any():
            i = int(np.flatnonzero(over)[0])
            raise WireError(f"field {field[i]} runs past the end of its message", int(cur[i]))
        parts.append((msg, field, wire, value, offset))
        more = nxt < stop
        msg, cur, stop = msg[more], nxt[more], stop[more]
    if not parts:
        empty = np.zeros(0, np.int64)
        return Fields(empty, empty, empty, np.zeros(0, np.uint64), empty)
    cols = [np.concatenate(c) for c in zip(*parts, strict=True)]
    order = np.argsort(cols[0], kind="stable")  # message order, fields in file order
    return Fields(*(c[order] for c in cols))


def packet_offsets(buf: np.ndarray) -> tuple[np.ndarray, np.ndarray, str | None, int]:
    """Start and end of each top-level `Trace.packet` (field 1) in file order.

    Returns (starts, ends, problem, position): problem is None for a clean file,
    "truncated" when the last packet is cut off (the complete ones are returned),
    or "corrupt" when the bytes after a packet are not another packet.
    """
    size = len(buf)
    cand = np.flatnonzero(buf == 0x0A)
    if not len(cand) or cand[0] != 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), "corrupt", 0
    length, llen = varint_at(buf, cand + 1)
    body = cand + 1 + llen
    nxt = body + length.astype(np.int64)
    j = np.searchsorted(cand, nxt)
    jj = np.minimum(j, len(cand) - 1)
    next_idx = np.where((j < len(cand)) & (cand[jj] == nxt), j, -1)
    next_idx[(nxt == size) & (llen > 0)] = -2  # clean end
    next_idx[(nxt > size) | (llen < 0)] = -3  # cut off
    chain = next_idx.tolist()
    picked = []
    i = 0
    while i >= 0:
        picked.append(i)
        i = chain[i]
    if i == -3:
        picked.pop()
    idx = np.asarray(picked, np.int64)
    problem = {-1: "corrupt", -2: None, -3: "truncated"}[i]
    position = int(nxt[idx[-1]]) if len(idx) else 0  # where the good packets stop
    return body[idx], nxt[idx], problem, position
