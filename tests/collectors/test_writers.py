"""The trace writers: hand-encoded bytes parse into exactly the intended Perfetto messages."""

from __future__ import annotations

import json

import neuron_explorer
import numpy as np
import pytest
from neuron_explorer.collectors import wire
from neuron_explorer.collectors.json_writer import JsonWriter
from neuron_explorer.collectors.perfetto_writer import PerfettoWriter
from neuron_explorer.collectors.trace_writer import RecordingError, open_writer
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from .trace_reading import parse, read_events


def test_varint_matches_protobuf_encoding() -> None:
    from google.protobuf.internal import encoder

    # every width's edges (the encoder switches tables at 2**14, 2**28 and 2**42)
    edges = [(1 << bits) + d for bits in range(64) for d in (-1, 0, 1)]
    rng = np.random.default_rng(5)
    random = [int(v) >> int(s) for v, s in zip(rng.integers(0, 2**63, 2000, dtype=np.uint64),
                                               rng.integers(0, 63, 2000), strict=True)]
    for value in [0, 300, 1_700_000_000_123_456_789, 2**64 - 1, *edges, *random]:
        expected = encoder._VarintBytes(value)
        assert wire.varint(value) == expected, value
    for value in (-1, -2, -(2**63)):
        assert wire.varint(value) == encoder._VarintBytes(value + 2**64)


def test_batch_varints_decode_to_the_same_values() -> None:
    from google.protobuf.internal import decoder

    rng = np.random.default_rng(3)
    values = np.concatenate([[0, 127, 128, 2**63], rng.integers(0, 2**62, 500)]).astype(np.uint64)
    data = wire.to_bytes([wire.varints(values)])
    pos, decoded = 0, []
    while pos < len(data):
        v, pos = decoder._DecodeVarint(data, pos)
        decoded.append(v)
    assert decoded == [int(v) for v in values]


def _expected_event(**fields) -> pb.TrackEvent:
    te = pb.TrackEvent()
    for key, value in fields.items():
        if key == "debug":
            for iid, kind, v in value:
                a = te.debug_annotations.add()
                a.name_iid = iid
                setattr(a, kind, v)
        elif isinstance(value, list):
            getattr(te, key).extend(value)
        else:
            setattr(te, key, value)
    return te


def test_slice_and_counter_bytes_are_exactly_the_intended_messages(tmp_path) -> None:
    path = tmp_path / "t.pftrace"
    w = PerfettoWriter(str(path))
    proc = w.process(10, "python train.py", ["python", "train.py"])
    thread = w.thread(10, 11, "MainThread")
    hbm = w.counter_track("HBM in use (bytes)", proc, unit="bytes")
    w.slice(thread, 1000, 500, "aten::mm", "op",
            {"flops": 2048, "shapes": "[[2, 2]]", "fallback": True, "ratio": 0.5, "neg": -3},
            flow_out=[7])
    w.counter(hbm, 1200, 4096)
    w.counter(hbm, 1300, 12.5)
    w.close()
    packets = pb.Trace.FromString(path.read_bytes()).packet
    # descriptors first, the first one clearing incremental state
    assert packets[0].sequence_flags == pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
    assert packets[0].first_packet_on_sequence
    assert packets[0].track_descriptor.process.pid == 10
    assert list(packets[0].track_descriptor.process.cmdline) == ["python", "train.py"]
    assert packets[1].track_descriptor.thread.tid == 11
    assert packets[2].track_descriptor.counter.unit == pb.CounterDescriptor.UNIT_SIZE_BYTES
    begin, end, c1, c2 = packets[3:7]
    interned = begin.interned_data
    assert [(e.iid, e.name) for e in interned.event_names] == [(1, "aten::mm")]
    assert [(e.iid, e.name) for e in interned.event_categories] == [(1, "op")]
    assert [e.name for e in interned.debug_annotation_names] == [
        "flops", "shapes", "fallback", "ratio", "neg"]
    assert begin.timestamp == 1000 and begin.trusted_packet_sequence_id == 1
    assert begin.sequence_flags == pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
    assert begin.track_event == _expected_event(
        type=pb.TrackEvent.TYPE_SLICE_BEGIN, track_uuid=thread, category_iids=[1], name_iid=1,
        flow_ids=[7],
        debug=[(1, "int_value", 2048), (2, "string_value", "[[2, 2]]"), (3, "bool_value", True),
               (4, "double_value", 0.5), (5, "int_value", -3)])
    assert end.timestamp == 1500
    assert end.track_event == _expected_event(type=pb.TrackEvent.TYPE_SLICE_END, track_uuid=thread)
    assert c1.track_event == _expected_event(type=pb.TrackEvent.TYPE_COUNTER, track_uuid=hbm,
                                             counter_value=4096)
    assert c2.track_event == _expected_event(type=pb.TrackEvent.TYPE_COUNTER, track_uuid=hbm,
                                             double_counter_value=12.5)


def test_batched_instructions_are_exactly_the_intended_messages(tmp_path) -> None:
    path = tmp_path / "t.pftrace"
    w = PerfettoWriter(str(path))
    dev = w.process(99, "neuron:0 (trn2)")
    tensor = w.track("Tensor Engine", dev)
    vector = w.track("Vector Engine", dev)
    n = 300
    rng = np.random.default_rng(0)
    tracks = np.where(np.arange(n) % 2 == 0, tensor, vector)
    ts = 10**9 + np.arange(n) * 1000
    dur = rng.integers(1, 999, n)
    opcodes = ["MultiplyMoving", "TensorTensor", "Act"]
    op_idx = rng.integers(0, 3, n)
    flows = np.zeros(n, np.uint64)
    flows[:2] = [2**63 + 5, 17]
    kernel = rng.integers(0, 2**40, n)
    w.slices(tracks, ts, dur, opcodes, op_idx, "instruction",
             {"kernel_id": kernel, "bytes": rng.integers(0, 2**33, n)},
             {"engine": (["tensor", "vector"], np.arange(n) % 2)}, flow_in=flows)
    w.counters(np.full(n, tensor), ts, dur.astype(float))
    w.close()
    trace = parse(path)
    slices = trace.by_category("instruction")
    assert len(slices) == n
    for i, s in enumerate(slices):
        assert (s.track, s.ts, s.dur, s.name) == (tracks[i], ts[i], dur[i], opcodes[op_idx[i]])
        assert s.args["kernel_id"] == kernel[i]
        assert s.args["engine"] == ("tensor", "vector")[i % 2]
        assert s.flow_in == ([int(flows[i])] if flows[i] else [])
        assert s.depth == 0
    assert [c[2] for c in trace.counters] == dur.astype(float).tolist()


def test_batched_string_args_are_interned_once_not_written_per_row(tmp_path) -> None:
    """A compiled graph's instructions each name their section's ops, source line and module:
    written out per row they took most of a 645-byte packet (1.3 GiB for 1.8 M instructions).
    Interned, a row refers to the string by its iid, and every reader resolves it."""
    path = tmp_path / "t.pftrace"
    w = PerfettoWriter(str(path))
    tensor = w.track("Tensor Engine", w.process(99, "neuron:0 (trn2)"))
    n = 2000
    sections = ["+".join(["aten::native_layer_norm", "aten::gelu", "aten::mul"] * 4),
                "+".join(["aten::addmm", "aten::relu"] * 6)]
    which = np.arange(n) % 2
    w.slices(np.full(n, tensor), np.arange(n) * 100, np.full(n, 50), ["Act"], np.zeros(n, int),
             "instruction", {"kernel_id": np.ones(n, np.int64)}, {"ops": (sections, which)})
    w.close()
    assert path.stat().st_size < n * 60  # a row, begin and end: 49 bytes; 210 with the text inline
    trace = parse(path)
    assert [s.args["ops"] for s in trace.by_category("instruction")] == \
        [sections[i] for i in which]
    begins = [p for p in trace.packets if p.track_event.debug_annotations]
    assert all(a.WhichOneof("value") == "string_value_iid"
               for p in begins for a in p.track_event.debug_annotations if a.name_iid == 2)
    loaded = neuron_explorer.load(str(path), cache=False)
    ids = loaded.slices["id"].to_numpy()
    assert loaded.slice_args.column("ops", ids).tolist() == [sections[i] for i in which]


def test_chunks_are_whole_packets_so_a_cut_file_reads_up_to_the_cut(tmp_path) -> None:
    path = tmp_path / "t.pftrace"
    w = PerfettoWriter(str(path), chunk_bytes=4096)
    t = w.thread(1, 1, "main")
    for i in range(5000):
        w.slice(t, i * 10, 5, f"op{i % 7}", "op", {"op_id": i})
    # not closed: what was flushed is a whole number of packets
    data = path.read_bytes()
    assert 0 < len(data) < w.bytes_written + 1
    packets = pb.Trace.FromString(data).packet
    assert len(packets) > 100
    w.close()
    assert len(pb.Trace.FromString(path.read_bytes()).packet) == 1 + 2 * 5000


def test_json_writer_writes_chrome_trace_that_survives_truncation(tmp_path) -> None:
    path = tmp_path / "t.json"
    w = JsonWriter(str(path))
    proc = w.process(5, "python train.py")
    thread = w.thread(5, 6, "MainThread")
    dev = w.process(50, "neuron:0 (trn2)")
    kernels = w.track("Kernels", dev)
    hbm = w.counter_track("HBM in use (bytes)", dev)
    w.begin(thread, 0, "step 0", "step", {"step": 0})
    w.slice(thread, 1500, 1000, "aten::mm", "op", {"op_id": 1}, flow_out=[1])
    w.end(thread, 5000)
    w.slice(kernels, 3000, 250, "mm", "kernel", {"kernel_id": 1}, flow_in=[1])
    w.counter(hbm, 3000, 1024)
    w.slices(np.array([kernels]), np.array([4000]), np.array([10]), ["x"], np.array([0]),
             "instruction", {"bytes": np.array([3])})
    w.close()
    doc = json.loads(path.read_text())
    events = [e for e in doc["traceEvents"] if e]
    phases = {e["ph"] for e in events}
    assert phases == {"M", "X", "s", "f", "C"}
    op = next(e for e in events if e.get("cat") == "op")
    assert op["ts"] == 1.5 and op["dur"] == 1.0 and op["args"] == {"op_id": 1}
    step = next(e for e in events if e.get("cat") == "step")
    assert step["ts"] == 0 and step["dur"] == 5.0
    finish = next(e for e in events if e["ph"] == "f")
    assert finish["bp"] == "e" and finish["id"] == 1 and finish["pid"] == 50
    assert proc != thread
    # a cut at any byte still yields the whole events before it
    raw = path.read_bytes()
    cut = tmp_path / "cut.json"
    cut.write_bytes(raw[: len(raw) * 2 // 3])
    partial = read_events(str(cut))
    assert 0 < len(partial) < len(events)
    assert partial == events[: len(partial)]


def test_unwritable_output_is_one_clear_error(tmp_path) -> None:
    with pytest.raises(RecordingError, match="cannot write the trace to .*missing"):
        open_writer(str(tmp_path / "missing" / "x.pftrace"), "pftrace")
    with pytest.raises(RecordingError, match="unknown trace format"):
        open_writer(str(tmp_path / "x"), "csv")


def test_full_disk_stops_with_a_clear_error() -> None:
    import os

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    w = PerfettoWriter("/dev/full", chunk_bytes=1 << 20)
    t = w.thread(1, 1, "main")
    w.slice(t, 0, 1, "x", "op")
    with pytest.raises(RecordingError, match="No space left"):
        w.flush()
    w.close()  # closing after the failure is harmless


def test_batched_slices_with_prepared_args_and_several_flows(tmp_path) -> None:
    path = tmp_path / "k.pftrace"
    w = PerfettoWriter(str(path))
    dev = w.process(7, "neuron:0 (trn2)")
    lane = w.track("Kernels", dev)
    prepared = [w.prepare_args({"flops": 10, "engine_busy_ns": '{"tensor": 5}'}),
                w.prepare_args({"flops": 2**40, "fallback": True})]
    flow_out = np.array([[1 << 62 | 5, 0], [0, 0], [11, 12]], np.uint64)
    w.slices(np.full(3, lane), np.array([0, 100, 200]), np.array([50, 50, 50]), ["a", "b"],
             np.array([0, 1, 0]), "kernel", {"kernel_id": np.array([1, 2, 3])},
             flow_out=flow_out, flow_in=np.array([4, 5, 6]),
             prepared=(prepared, np.array([0, 1, 1])))
    w.close()
    kernels = parse(path).by_category("kernel")
    assert [k.name for k in kernels] == ["a", "b", "a"]
    assert kernels[0].args == {"flops": 10, "engine_busy_ns": '{"tensor": 5}', "kernel_id": 1}
    assert kernels[1].args == {"flops": 2**40, "fallback": True, "kernel_id": 2}
    assert [k.flow_out for k in kernels] == [[1 << 62 | 5], [], [11, 12]]
    assert [k.flow_in for k in kernels] == [[4], [5], [6]]


def test_batched_slices_mixing_uneven_strings_and_prepared_args(tmp_path) -> None:
    """Strings too uneven to pad to one width, beside prepared args joined in per row."""
    path = tmp_path / "m.pftrace"
    w = PerfettoWriter(str(path))
    track = w.track("work", w.process(7, "p"))
    long_text = "x" * 60
    prepared = [w.prepare_args({"module": "model.fc1"}), w.prepare_args({"source": "t.py:9"})]
    w.slices(np.full(4, track), np.array([0, 100, 200, 300]), np.full(4, 50), ["op"],
             np.zeros(4, np.int64), "op", {"op_id": np.array([1, 2**40, 3, 4])},
             {"note": (["a", long_text], np.array([0, 1, 1, 0]))},
             prepared=(prepared, np.array([1, 0, 1, 0])))
    w.close()
    ops = parse(path).by_category("op")
    assert [o.args for o in ops] == [
        {"op_id": 1, "note": "a", "source": "t.py:9"},
        {"op_id": 2**40, "note": long_text, "module": "model.fc1"},
        {"op_id": 3, "note": long_text, "source": "t.py:9"},
        {"op_id": 4, "note": "a", "module": "model.fc1"},
    ]


@pytest.mark.parametrize("fmt", ["pftrace", "json"])
def test_batched_int_args_can_be_absent_in_some_rows(tmp_path, fmt: str) -> None:
    path = tmp_path / f"o.{fmt}"
    w = open_writer(str(path), fmt)
    track = w.track("work", w.process(7, "p"))
    ids = np.array([5, -1, 2**40])
    w.slices(np.full(3, track), np.array([0, 10, 20]), np.full(3, 5), ["op"],
             np.zeros(3, np.int64), "op", {"op_id": np.arange(3), "kernel_id": (ids, ids >= 0)})
    w.close()
    if fmt == "pftrace":
        args = [o.args for o in parse(path).by_category("op")]
    else:
        args = [e["args"] for e in read_events(str(path)) if e.get("cat") == "op"]
    assert args == [{"op_id": 0, "kernel_id": 5}, {"op_id": 1}, {"op_id": 2, "kernel_id": 2**40}]
