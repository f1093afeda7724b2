"""The compiled wire walk (`wire_compiled`, numba) gives what the lockstep numpy walk gives:
the same scan of random, broken and chunked messages, and the same tables, warnings and
skipped counts for traces holding every kind of packet, for the sample recordings, and for
cut and corrupt files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import neuron_explorer
import numpy as np
import pandas as pd
import pytest
from heard import warnings_heard
from neuron_explorer.common.errors import TraceFormatError
from neuron_explorer.loaders import wire_scan
from neuron_explorer.loaders.wire_scan import WireError, scan

pytest.importorskip("numba")

ROOT = Path(__file__).resolve().parents[2]
COMPILED, LOCKSTEP = 0, 10**18  # wire_scan.COMPILED_MIN for each walk


def _encode(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(rng: np.random.Generator) -> bytes:
    """A random field: varint, length-delimited, fixed, a two-byte tag, now and then a
    broken one (a cut varint, a length past the message, an invalid wire type)."""
    number = int(rng.choice([1, 2, 3, 4, 5, 20, 47, 300]))
    wire = int(rng.choice([0, 2, 1, 5]))
    tag = _encode(number << 3 | wire)
    if wire == 0:
        body = _encode(int(rng.integers(0, 2**62)) >> int(rng.integers(0, 62)))
    elif wire == 2:
        n = int(rng.integers(0, 5))
        body = _encode(n) + rng.bytes(n)
    else:
        body = rng.bytes(8 if wire == 1 else 4)
    roll = rng.random()
    if roll < 0.01:
        return tag + b"\xff\xff"  # a varint that never ends inside the message
    if roll < 0.02:
        return tag[:1] + _encode(40) + b"\x01"  # a length past the message
    if roll < 0.03:
        return _encode(number << 3 | 3)  # wire type 3: invalid here
    return tag + body


def _messages(seed: int, n: int = 300) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    bodies = [b"".join(_field(rng) for _ in range(int(rng.integers(0, 9)))) for _ in range(n)]
    data = b"".join(bodies)
    starts = np.cumsum([0] + [len(b) for b in bodies[:-1]]).astype(np.int64)
    ends = starts + np.array([len(b) for b in bodies], np.int64)
    return np.frombuffer(data, np.uint8), starts, ends


SLOTS = {1: 0, 20: 0, 2: 1, 300: 2}
REPEATED = {3, 47}


def _scan(monkeypatch: pytest.MonkeyPatch, minimum: int, *args: Any, **kw: Any) -> Any:
    monkeypatch.setattr(wire_scan, "COMPILED_MIN", minimum)
    monkeypatch.setattr(wire_scan, "COMPILED_FIRST_BYTES", minimum)
    try:
        return scan(*args, **kw)
    except WireError as exc:
        return exc.reason, exc.position


def _same_scan(a: Any, b: Any) -> None:
    if isinstance(a, tuple) or isinstance(b, tuple):
        assert a == b  # the same first problem, in the same words
        return
    assert np.array_equal(a.value, b.value) and np.array_equal(a.field, b.field)
    assert a.offset.keys() == b.offset.keys()
    for slot in a.offset:
        assert np.array_equal(a.offset[slot], b.offset[slot])
    for name in ("msg", "field", "wire", "value", "offset"):  # the rows in the same order
        assert getattr(a.rows, name).tolist() == getattr(b.rows, name).tolist(), name
    assert sorted(a.others.tolist()) == sorted(b.others.tolist())


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("chunk", [16, 1 << 17])
def test_compiled_scan_matches_the_lockstep_scan(monkeypatch: pytest.MonkeyPatch, seed: int,
                                                 chunk: int) -> None:
    monkeypatch.setattr(wire_scan, "CHUNK", chunk)
    buf, starts, ends = _messages(seed)
    args = (buf, starts, ends, SLOTS, REPEATED)
    strict = [_scan(monkeypatch, m, *args, offsets={1}) for m in (COMPILED, LOCKSTEP)]
    _same_scan(*strict)
    marks = [np.zeros(len(starts), bool) for _ in range(2)]
    tolerant = [_scan(monkeypatch, m, *args, offsets={1}, bad=bad)
                for m, bad in zip((COMPILED, LOCKSTEP), marks, strict=True)]
    _same_scan(*tolerant)
    assert np.array_equal(*marks)


def test_the_compiled_walk_starts_only_where_it_pays(monkeypatch: pytest.MonkeyPatch) -> None:
    """Numba's start-up is paid for by a large scan; once paid, smaller scans use it too."""
    monkeypatch.setattr(wire_scan, "COMPILED_MIN", 10)
    monkeypatch.setattr(wire_scan, "COMPILED_FIRST_BYTES", 1000)
    monkeypatch.setattr(wire_scan, "_compiled_warm", False)
    # as in a new process: a large load earlier in this one asked for the compiled walk
    monkeypatch.setattr(wire_scan, "_compiled_wanted", False)

    def spans(n: int, size: int) -> tuple[np.ndarray, np.ndarray]:
        starts = np.arange(n, dtype=np.int64) * size
        return starts, starts + size

    assert not wire_scan._use_compiled(*spans(5, 1000))  # too few messages
    assert not wire_scan._use_compiled(*spans(20, 10))  # too few bytes for a first use
    assert wire_scan._use_compiled(*spans(20, 100))
    buf, starts, ends = _messages(0, 40)
    bad = np.zeros(len(starts), bool)
    monkeypatch.setattr(wire_scan, "COMPILED_FIRST_BYTES", 0)
    scan(buf, starts, ends, SLOTS, REPEATED, bad=bad)
    monkeypatch.setattr(wire_scan, "COMPILED_FIRST_BYTES", 1000)
    assert wire_scan._use_compiled(*spans(20, 10))  # warm now


def test_the_seeds_break_some_messages() -> None:
    """The random messages above do hold broken fields (else the test shows little)."""
    broken = 0
    for seed in range(8):
        buf, starts, ends = _messages(seed)
        bad = np.zeros(len(starts), bool)
        scan(buf, starts, ends, SLOTS, REPEATED, bad=bad)
        broken += int(bad.sum())
    assert broken > 10


# --- whole traces --------------------------------------------------------------------------
def _every_packet_kind(path: Path) -> Path:
    """A trace with every kind of packet and field the loader reads (and some it skips):
    descriptors of processes, threads, counters and child tracks; interned names,
    categories, annotation names and string values on two sequences, cleared once;
    sequence defaults; begin/end/instant/counter events with inline and interned names;
    annotations of every value type, nested ones included; flows old and new,
    terminating; an unknown packet field and an unknown event type."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    trace = pb.Trace()

    def packet(seq: int, **kw: Any) -> Any:
        return trace.packet.add(trusted_packet_sequence_id=seq, **kw)

    p = packet(1)
    p.track_descriptor.uuid = 10
    p.track_descriptor.process.pid, p.track_descriptor.process.process_name = 5, "python"
    p = packet(1)
    p.track_descriptor.uuid, p.track_descriptor.parent_uuid = 11, 10
    p.track_descriptor.thread.pid, p.track_descriptor.thread.tid = 5, 6
    p.track_descriptor.thread.thread_name = "MainThread"
    p = packet(1)
    p.track_descriptor.uuid, p.track_descriptor.parent_uuid = 12, 10
    p.track_descriptor.name = "neuron:0 Kernels"
    p = packet(1)
    p.track_descriptor.uuid, p.track_descriptor.parent_uuid = 13, 10
    p.track_descriptor.name = "hbm in use"
    p.track_descriptor.counter.SetInParent()
    ts = 1000
    for generation in range(2):
        for seq in (1, 2):
            p = packet(seq, sequence_flags=1)
            p.trace_packet_defaults.track_event_defaults.track_uuid = 11 if seq == 1 else 12
            p.interned_data.event_names.add(iid=1, name=f"op{seq}.{generation}")
            p.interned_data.event_categories.add(iid=1, name="op" if seq == 1 else "kernel")
            p.interned_data.debug_annotation_names.add(iid=1, name="op_id")
            p.interned_data.debug_annotation_string_values.add(iid=1, str=f"s{generation}".encode())
            for i in range(6):
                ts += 100
                e = packet(seq, timestamp=ts).track_event
                e.type = pb.TrackEvent.TYPE_SLICE_BEGIN
                e.name_iid, e.category_iids[:] = 1, [1]
                a = e.debug_annotations.add(name_iid=1)
                a.int_value = i
                a = e.debug_annotations.add(name="flag")
                a.bool_value = bool(i % 2)
                a = e.debug_annotations.add(name="ratio")
                a.double_value = i / 3
                a = e.debug_annotations.add(name="big")
                a.uint_value = 2**63 + i
                a = e.debug_annotations.add(name="ptr")
                a.pointer_value = 0xdead0000 + i
                a = e.debug_annotations.add(name="shapes")
                a.string_value = f"[[{i}, 4]]"
                a = e.debug_annotations.add(name="interned")
                a.string_value_iid = 1
                a = e.debug_annotations.add(name="json")
                a.legacy_json_value = '{"a": 1}'
                a = e.debug_annotations.add(name="nested")
                entry = a.dict_entries.add(name="x")
                entry.int_value = i
                entry = a.dict_entries.add(name="list")
                entry.array_values.add().string_value = "v"
                e.flow_ids[:] = [100 + i] if seq == 1 else []
                e.terminating_flow_ids[:] = [200 + i] if seq == 2 else []
                e.flow_ids_old[:] = [300 + i]
                ts += 10
                e = packet(seq, timestamp=ts).track_event
                e.type, e.name, e.categories[:] = pb.TrackEvent.TYPE_INSTANT, "mark", ["m"]
                e.track_uuid = 11 if seq == 1 else 12
                e.terminating_flow_ids_old[:] = [300 + i]
                ts += 10
                e = packet(seq, timestamp=ts).track_event
                e.type = pb.TrackEvent.TYPE_SLICE_END
                e.debug_annotations.add(name="at_end").int_value = -i
                e = packet(seq, timestamp=ts).track_event
                e.type, e.track_uuid = pb.TrackEvent.TYPE_COUNTER, 13
                if i % 2:
                    e.counter_value = i * 1000
                else:
                    e.double_counter_value = i * 0.5
    packet(1, timestamp=ts + 1).track_event.type = pb.TrackEvent.TYPE_SLICE_END  # a stray end
    packet(1, timestamp=ts + 3).track_event.type = pb.TrackEvent.TYPE_SLICE_BEGIN  # never ends
    raw = trace.SerializeToString()
    unknown = _encode(1001 << 3) + b"\x01"  # a packet with field 1001 only
    # an event of type 9, which the loader does not know (protobuf refuses to write it)
    odd_event = b"\x40" + _encode(ts + 2) + b"\x50\x01" + b"\x5a\x02\x48\x09"
    path.write_bytes(raw + b"".join(b"\x0a" + _encode(len(body)) + body
                                    for body in (unknown, odd_event)))
    return path


def _tables(path: Path, minimum: int) -> dict[str, Any]:
    """Every table of a load (cache off) with one walk, and what it warned and skipped."""
    old = wire_scan.COMPILED_MIN, wire_scan.COMPILED_FIRST_BYTES
    wire_scan.COMPILED_MIN = wire_scan.COMPILED_FIRST_BYTES = minimum
    try:
        with warnings_heard() as caught:
            try:
                t = neuron_explorer.load(path, cache=False)
            except TraceFormatError as exc:
                return {"error": str(exc)}
            out: dict[str, Any] = {name: t.table(name) for name in (
                "slices", "args", "tracks", "counters", "flows", "steps", "ops", "kernels",
                "instructions", "modules")}
            out["dicts"] = t.slice_args.dicts()
    finally:
        wire_scan.COMPILED_MIN, wire_scan.COMPILED_FIRST_BYTES = old
    out["skipped"] = dict(t.skipped)
    out["warnings"] = list(t.warnings)
    out["heard"] = [str(w.message) for w in caught]
    out["metadata"] = t.metadata
    return out


def _same_tables(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for name, value in a.items():
        if isinstance(value, pd.DataFrame):
            pd.testing.assert_frame_equal(value, b[name], check_exact=True, obj=name)
        else:
            assert value == b[name], name


def _cut(path: Path, out: Path, keep: float) -> Path:
    data = path.read_bytes()
    out.write_bytes(data[:int(len(data) * keep)])
    return out


def _flipped(path: Path, out: Path, every: int) -> Path:
    data = bytearray(path.read_bytes())
    for i in range(len(data) // 3, len(data), every):
        data[i] ^= 0x5A
    out.write_bytes(bytes(data))
    return out


def test_every_packet_kind_loads_the_same(tmp_path: Path) -> None:
    path = _every_packet_kind(tmp_path / "every.pftrace")
    compiled, lockstep = _tables(path, COMPILED), _tables(path, LOCKSTEP)
    _same_tables(compiled, lockstep)
    assert "error" not in compiled
    kinds = set(compiled["args"]["kind"].tolist())
    assert kinds == {0, 1, 2, 3, 4}  # ints, floats, strings, bools, nested
    assert len(compiled["flows"]) and len(compiled["counters"]) == 24
    assert any("packet field" in k for k in compiled["skipped"])
    assert any("track event type" in k for k in compiled["skipped"])


@pytest.mark.parametrize("name", ["gpt_eager", "nki_kernels", "near_memory"])
def test_sample_traces_load_the_same(name: str) -> None:
    path = ROOT / "sample_traces" / f"{name}.pftrace"
    _same_tables(_tables(path, COMPILED), _tables(path, LOCKSTEP))


@pytest.mark.parametrize("damage", ["cut", "cut_early", "flipped", "corrupt_annotation"])
def test_damaged_traces_load_the_same(tmp_path: Path, damage: str) -> None:
    sample = ROOT / "sample_traces" / "mlp_eager.pftrace"
    path = {
        "cut": lambda: _cut(sample, tmp_path / "cut.pftrace", 0.7),
        "cut_early": lambda: _cut(sample, tmp_path / "cut.pftrace", 0.01),
        "flipped": lambda: _flipped(sample, tmp_path / "flipped.pftrace", 50_003),
        "corrupt_annotation": lambda: ROOT / "tests" / "data" / "fuzz_corpus" /
        "corrupt_annotation.pftrace",
    }[damage]()
    compiled, lockstep = _tables(path, COMPILED), _tables(path, LOCKSTEP)
    _same_tables(compiled, lockstep)
    if damage.startswith("cut"):
        assert any("ends inside a packet" in w for w in compiled.get("warnings", [])), compiled
