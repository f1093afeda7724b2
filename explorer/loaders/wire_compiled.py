"""The protobuf wire walk of `wire_scan.scan`, compiled with numba: one pass over the bytes.

The lockstep walk of `wire_scan` pays numpy's per-call cost once per field round and
touches every field a dozen times; this walk reads each message's fields in order, in
machine code, and fills the same arrays. Its result is the lockstep walk's exactly: the
same slots, the repeated fields in the same row order (round by round within each chunk
of messages), the same first problem reported, the same broken messages marked.

Compiled code is cached on disk by numba (`cache=True`): the first use on a machine pays
the compilation (seconds), later processes load it.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

# reasons of a broken field, as `wire_scan._raise_first_problem` words them
OK, PAST_MESSAGE, INVALID_FIELD, TAG_PAST_DATA = 0, 1, 2, 3


_jit = numba.njit(cache=True, nogil=True, boundscheck=False)

@_jit
def _varint(buf: np.ndarray, pos: int, size: int) -> tuple[np.uint64, int]:
    """The varint at pos: (value, length), length -1 when cut off by the data's end
    or longer than ten bytes (as `varint_at`)."""
    if pos >= size or pos < 0:
        return np.uint64(0), -1
    b = buf[pos]
    value = np.uint64(b & 0x7F)
    if b < 0x80:
        return value, 1
    for k in range(1, 10):
        at = pos + k
        if at >= size:
            return value, -1
        b = buf[at]
        value |= np.uint64(b & 0x7F) << np.uint64(7 * k)
        if b < 0x80:
            return value, k + 1
    return value, -1

@_jit
def _fixed(buf: np.ndarray, pos: int, width: int) -> np.uint64:
    value = np.uint64(0)
    for j in range(width):
        value |= np.uint64(buf[pos + j]) << np.uint64(8 * j)
    return value

@_jit
def _walk(buf, start, end, code_of, top, k, off_row, value, offset, which, tolerant, bad,
          chunk, fill, r_msg, r_field, r_wire, r_value, r_offset, r_round, others
          ):  # pragma: no cover - compiled; tested against the lockstep walk
    """Walk every message's fields. Without `fill`: fill the slots (value, offset, which),
    mark broken messages in `bad` when `tolerant`, and count the repeated fields' rows
    and the others. With `fill`: write those rows (in message order, with their round)
    and the others' numbers into the arrays given, sized by the first walk.

    Returns (rows, others, highest round of a row, problem reason, its message, its
    position): the first problem as the lockstep walk meets it (earliest chunk of
    messages, then round, then message), OK when there is none or `tolerant`.
    """
    n = len(start)
    size = len(buf)
    repeated_code, other_code = k, k + 1
    n_rows = n_others = max_round = 0
    err_reason, err_msg, err_round, err_pos = OK, -1, 0, 0
    for i in range(n):
        if err_reason != OK and i // chunk > err_msg // chunk:
            break  # the lockstep walk raises before this chunk
        cur = start[i]
        stop = end[i]
        rnd = 0
        while cur < stop:
            tag, tag_len = _varint(buf, cur, size)
            reason = OK
            nxt = cur
            field = 0
            wire = 0
            p = cur + tag_len
            val = np.uint64(0)
            off = 0
            if tag_len < 0:
                reason = TAG_PAST_DATA
            else:
                field = np.int64(tag >> np.uint64(3))  # below 2**61
                wire = np.uint8(tag & np.uint64(7))
                if wire == 0 or wire == 2:
                    val, vlen = _varint(buf, p, size)
                    off = p + vlen
                    if vlen < 0:
                        reason = PAST_MESSAGE
                    elif wire == 2:
                        nxt = np.int64(np.uint64(off) + val)  # wraps as int64 does
                    else:
                        nxt = off
                elif wire == 1 or wire == 5:
                    width = 8 if wire == 1 else 4
                    off = p
                    nxt = p + width
                    if nxt <= stop:
                        val = _fixed(buf, p, width)
                else:
                    reason = INVALID_FIELD
                if reason == OK and (nxt > stop or nxt <= cur):
                    reason = PAST_MESSAGE
            if reason != OK:
                if tolerant:
                    bad[i] = True
                elif err_reason == OK or rnd < err_round:
                    err_reason, err_msg, err_round, err_pos = reason, i, rnd, cur
                break
            code = code_of[min(top, field)]
            if code < k:
                if not fill:
                    value[code, i] = val
                    which[code, i] = np.int16(field)
                    row = off_row[code]
                    if row >= 0:
                        offset[row, i] = off
            elif code == repeated_code:
                if fill:
                    r_msg[n_rows] = i
                    r_field[n_rows] = field
                    r_wire[n_rows] = wire
                    r_value[n_rows] = val
                    r_offset[n_rows] = off
                    r_round[n_rows] = rnd
                n_rows += 1
                max_round = max(max_round, rnd)
            elif code == other_code:
                if fill:
                    others[n_others] = field
                n_others += 1
            rnd += 1
            cur = nxt
    return n_rows, n_others, max_round, err_reason, err_msg, err_pos


def _lockstep_order(msg: np.ndarray, rnd: np.ndarray, max_round: int, chunk: int
                    ) -> np.ndarray:
    """The order that puts rows (given in message order) as the lockstep walk gives them:
    by chunk of messages, then round, then message."""
    if not len(msg):
        return np.zeros(0, np.int64)
    chunk_of = msg // chunk
    chunk_of -= chunk_of[0]
    key = chunk_of.astype(np.int64) * (max_round + 1) + rnd
    n_keys = int(key[-1]) + max_round + 1
    if n_keys > 4 * len(key) + 1024:  # a message with very many fields: a sort instead
        return np.argsort(key, kind="stable")
    return _counting_order(key, n_keys)


@_jit
def _counting_order(key, n_keys):  # pragma: no cover - compiled
    """A stable counting sort of small non-negative keys: the order."""
    count = np.zeros(n_keys + 1, np.int64)
    for j in range(len(key)):
        count[key[j] + 1] += 1
    for j in range(n_keys):
        count[j + 1] += count[j]
    order = np.empty(len(key), np.int64)
    for j in range(len(key)):
        order[count[key[j]]] = j
        count[key[j]] += 1
    return order


def walk(buf: np.ndarray, start: np.ndarray, end: np.ndarray, code_of: np.ndarray, top: int,
         k: int, off_row: np.ndarray, value: np.ndarray, offset: np.ndarray,
         which: np.ndarray, bad: np.ndarray | None, chunk: int) -> tuple[Any, ...]:
    """Run the compiled walk (see `wire_scan.scan` for the arguments). Returns the rows'
    (msg, field, wire, value, offset) in the lockstep walk's order, the others' numbers,
    and the first problem's reason (OK: none), message and position."""
    tolerant = bad is not None
    mask = bad if bad is not None else np.zeros(0, bool)
    start = np.ascontiguousarray(start, np.int64)
    end = np.ascontiguousarray(end, np.int64)
    code_of, off_row = code_of.astype(np.int64), off_row.astype(np.int64)

    def run(fill: bool, rows: tuple[np.ndarray, ...], others: np.ndarray) -> tuple[int, ...]:
        return _walk(buf, start, end, code_of, int(top), int(k), off_row, value, offset,
                     which, tolerant, mask, int(chunk), fill, *rows, others)

    empty = (np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros(0, np.uint8),
             np.zeros(0, np.uint64), np.zeros(0, np.int64), np.zeros(0, np.int64))
    n_rows, n_others, max_round, reason, msg, position = run(False, empty, empty[1])
    if reason != OK:
        return (*empty[:5], empty[1], reason, msg, position)
    rows = tuple(np.empty(n_rows, a.dtype) for a in empty)
    others = np.empty(n_others, np.int64)
    if n_rows or n_others:  # a second walk writes them where they go
        run(True, rows, others)
    order = _lockstep_order(rows[0], rows[5], max_round, int(chunk))
    return (*(a[order] for a in rows[:5]), others, OK, -1, 0)
