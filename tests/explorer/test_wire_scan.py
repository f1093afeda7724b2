"""The vectorised protobuf scanner agrees with a plain byte-by-byte reading: varints of
every length (cut off at the data's end too), fixed-width values, packet chains, and
the combined sort key of the slices table."""

from __future__ import annotations

import numpy as np
import pytest
from neuron_explorer.loaders.raw import _ts_track_depth_order
from neuron_explorer.loaders.wire_scan import fixed_at, packet_offsets, varint_at


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
        assert np.array_equal(_ts_track_depth_order(ts, track, depth),
                              np.lexsort((depth, track, ts)))
    # a key too wide for int64 falls back to lexsort
    ts, track, depth = np.array([2**62, -2**62, 0]), np.array([1, 2, 3]), np.array([0, 1, 0])
    assert np.array_equal(_ts_track_depth_order(ts, track, depth), np.lexsort((depth, track, ts)))
