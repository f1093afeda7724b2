"""The vectorised protobuf scanner agrees with a plain byte-by-byte reading: varints of
every length (cut off at the data's end too), fixed-width values, packet chains, and
the combined sort key of the slices table."""

from __future__ import annotations

import numpy as np
import pytest
from neuron_explorer.loaders import wire_scan
from neuron_explorer.loaders.raw import ts_track_depth_order
from neuron_explorer.loaders.wire_scan import (
    fixed_at,
    packet_offsets,
    read_message,
    scan,
    varint_at,
)


def _plain_varint(data: bytes, pos: int) -> tuple[int | None, int]:
    """(value, length) read byte by byte; (None, -1) when the data ends first or the
    varint runs past ten bytes (the scanner's value is then meaningless)."""
    value = 0
    for k in range(10):
        if pos + k >= len(data):
            return None, -1
        b = data[pos + k]
        value |= (b & 0x7F) << (7 * k)
        if b < 0x80:
            return value & (2**64 - 1), k + 1
    return None, -1


def _encode(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


@pytest.mark.parametrize("seed", range(6))
def test_varints_match_a_byte_by_byte_reading(seed: int) -> None:
    rng = np.random.default_rng(seed)
    size = int(rng.integers(1, 400))
    share_long = rng.random()  # from mostly one-byte to mostly continuation bytes
    data = np.where(rng.random(size) < share_long, rng.integers(128, 256, size),
                    rng.integers(0, 128, size)).astype(np.uint8)
    pos = np.r_[rng.integers(0, size, 300), size, size + 1]  # and two past the end
    value, length = varint_at(data, pos)
    raw = data.tobytes()
    expected = [_plain_varint(raw, p) for p in pos.tolist()]
    assert length.tolist() == [n for _, n in expected]
    complete = length > 0
    assert complete.any() and (~complete).any()  # both cases exercised
    assert value[complete].tolist() == [v for v, _ in expected if v is not None]


def test_varints_of_every_length_decode_to_their_values() -> None:
    values = [0, 1, 127, 128, 300, 2**21 - 1, 2**35 + 5, 2**49, 2**56 - 1, 2**63 + 7, 2**64 - 1]
    parts = [_encode(v) for v in values]
    pos = np.cumsum([0] + [len(p) for p in parts[:-1]])
    value, length = varint_at(np.frombuffer(b"".join(parts), np.uint8), pos)
    assert value.tolist() == values
    assert length.tolist() == [len(p) for p in parts]


@pytest.mark.parametrize("width", [4, 8])
def test_fixed_values_match_int_from_bytes(width: int) -> None:
    raw = bytes(range(256)) * 2
    data = np.frombuffer(raw, np.uint8)[13:300]  # a view that does not start the buffer
    body = raw[13:300]
    inside = np.arange(0, len(body) - width + 1, 7)
    got = fixed_at(data, inside, width)
    assert got.dtype == np.uint64
    assert got.tolist() == [int.from_bytes(body[p:p + width], "little") for p in inside]
    # values cut by the data's end still come back (the scanner rejects them by length)
    assert len(fixed_at(data, np.array([len(body) - 1]), width)) == 1


def _stream(bodies: list[bytes]) -> bytes:
    return b"".join(b"\x0a" + _encode(len(b)) + b for b in bodies)


def test_packet_chain_is_found_among_inner_candidate_bytes() -> None:
    # bodies full of 0x0A bytes: candidates that must not be taken for packets
    bodies = [bytes([0x0A, 3, 0x0A, 0x0A, 1]) * (i % 5 + 1) for i in range(50)]
    data = _stream(bodies)
    starts, ends, problem, _ = packet_offsets(np.frombuffer(data, np.uint8))
    assert problem is None
    assert [data[s:e] for s, e in zip(starts.tolist(), ends.tolist(), strict=True)] == bodies

    cut = data[:-2]
    starts, _, problem, position = packet_offsets(np.frombuffer(cut, np.uint8))
    assert (problem, len(starts), position) == ("truncated", 49, len(_stream(bodies[:-1])))

    bad = data + b"\x0b\x00"
    starts, _, problem, position = packet_offsets(np.frombuffer(bad, np.uint8))
    assert (problem, len(starts), position) == ("corrupt", 50, len(data))


def test_combined_sort_key_orders_like_lexsort() -> None:
    rng = np.random.default_rng(3)
    for spread in (5, 2**40):
        n = 500
        ts = rng.integers(-spread, spread, n)
        track = rng.integers(0, 4, n)
        depth = rng.integers(0, 3, n)
        assert np.array_equal(ts_track_depth_order(ts, track, depth),
                              np.lexsort((depth, track, ts)))
    # a key too wide for int64 falls back to lexsort
    ts, track, depth = np.array([2**62, -2**62, 0]), np.array([1, 2, 3]), np.array([0, 1, 0])
    assert np.array_equal(ts_track_depth_order(ts, track, depth), np.lexsort((depth, track, ts)))


# field number -> wire type of the messages below: slotted (1, 2, 20: a two-byte tag),
# repeated (3, 47) and neither (5, 9)
SCAN_FIELDS = {1: 0, 2: 2, 20: 0, 3: 2, 47: 1, 5: 5, 9: 0}
SCAN_SLOTS = {1: 0, 20: 0, 2: 1}  # 1 and 20 share a slot, like the alternatives of a oneof
SCAN_REPEATED = {3, 47}


def _field(rng: np.random.Generator, number: int) -> bytes:
    wire = SCAN_FIELDS[number]
    tag = _encode(number << 3 | wire)
    if wire == 0:
        return tag + _encode(int(rng.integers(0, 2**40)) >> int(rng.integers(0, 40)))
    if wire == 2:
        return tag + _encode(n := int(rng.integers(0, 6))) + rng.bytes(n)
    return tag + rng.bytes(8 if wire == 1 else 4)


def test_scan_agrees_with_reading_each_message(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slots (the last value of a field wins), repeated rows and other fields, from rounds
    of one field each and from mixed rounds, over several chunks."""
    monkeypatch.setattr(wire_scan, "CHUNK", 16)
    rng = np.random.default_rng(7)
    layout = [1, 2, 3, 3]  # a run of messages laid out alike: rounds of one field each
    numbers = list(SCAN_FIELDS)
    messages = [layout if i < 40 else list(rng.choice(numbers, int(rng.integers(0, 7))))
                for i in range(120)]
    bodies = [b"".join(_field(rng, int(f)) for f in m) for m in messages]
    data = b"".join(bodies)
    starts = np.cumsum([0] + [len(b) for b in bodies[:-1]]).astype(np.int64)
    ends = starts + np.array([len(b) for b in bodies], np.int64)
    buf = np.frombuffer(data, np.uint8)
    sc = scan(buf, starts, ends, SCAN_SLOTS, SCAN_REPEATED, offsets={1})
    rows, others = [], []
    for i, (a, b) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        slot = {0: (0, 0, 0), 1: (0, 0, 0)}
        for number, value, offset in read_message(data, a, b):
            if number in SCAN_SLOTS:
                slot[SCAN_SLOTS[number]] = (number, value, offset)  # the last one counts
            elif number in SCAN_REPEATED:
                rows.append((i, number, value, offset))
            else:
                others.append(number)
        for s, (number, value, _offset) in slot.items():
            assert (int(sc.field[s, i]), int(sc.value[s, i])) == (number, value), (i, s)
        assert int(sc.offset[1][i]) == slot[1][2]
    got = sorted(zip(sc.rows.msg.tolist(), sc.rows.field.tolist(), sc.rows.value.tolist(),
                     sc.rows.offset.tolist(), strict=True))
    assert got == sorted(rows)
    assert sorted(sc.others.tolist()) == sorted(others)
    for number in SCAN_REPEATED:  # a message's rows of one field keep their file order
        msg, _, value, offset = sc.rows.select(number)
        by_message = np.argsort(msg, kind="stable")
        selected = zip(msg[by_message].tolist(), value[by_message].tolist(),
                       offset[by_message].tolist(), strict=True)
        assert list(selected) == [(i, v, o) for i, n, v, o in rows if n == number]
