"""Loading our formats and real PyTorch-profiler traces into the tables."""

from __future__ import annotations

from pathlib import Path

import neuron_explorer
import numpy as np
import pandas as pd
import pytest
import scenarios
from heard import warnings_heard
from neuron_explorer.tables import KERNEL_COLUMNS, OP_COLUMNS

DOC_COLUMNS = {
    "slices": ["id", "ts", "dur", "name", "category", "track_id", "depth", "parent_id"],
    "tracks": ["track_id", "name", "kind", "process", "pid", "tid", "device"],
    "counters": ["ts", "value", "track_id", "name"],
    "flows": ["flow_id", "src_id", "dst_id"],
    "steps": ["step", "ts", "dur"],
    "ops": ["id", "ts", "dur", "name", "op_id", "kernel_id", "device_dur", "flops", "bytes",
            "shapes", "dtypes", "module", "source", "fallback", "step"],
    "kernels": ["id", "ts", "dur", "name", "kernel_id", "op_id", "device", "flops", "hw_flops",
                "bytes", "step"],
    "instructions": ["id", "ts", "dur", "engine", "opcode", "bytes", "flops", "kernel_id",
                     "device"],
    "modules": ["id", "ts", "dur", "module", "phase", "depth", "step"],
}


def test_tables_have_documented_columns(basic_trace: neuron_explorer.Trace) -> None:
    for table, columns in DOC_COLUMNS.items():
        frame = getattr(basic_trace, table)
        assert set(columns) <= set(frame.columns), table
    for col in ("ts", "dur"):
        assert basic_trace.table("slices")[col].dtype == np.int64
        assert basic_trace.kernels[col].dtype == np.int64
    assert "args" in basic_trace.slices.columns


def test_basic_tables(basic_trace: neuron_explorer.Trace) -> None:
    t = basic_trace
    assert t.steps[["step", "ts", "dur"]].values.tolist() == [[0, 0, 10_000], [1, 10_000, 10_000]]
    assert t.ops["name"].tolist() == ["aten::mm", "aten::relu", "aten::add"] * 2
    assert t.ops["device_dur"].tolist() == [2000, 1000, 200] * 2
    mm = t.ops.iloc[0]
    assert (mm["op_id"], mm["flops"], mm["bytes"], mm["module"]) == (1, 2_000_000, 4000, "model.fc")
    assert mm["dtypes"] == "[float32, float32]" and not mm["fallback"]
    k = t.kernels
    assert k["op_id"].tolist() == [1, 2, 3, 11, 12, 13]
    assert k.iloc[0][["flops", "hw_flops", "busy_tensor", "busy_vector", "device"]].tolist() == \
        [2_000_000, 2_500_000, 1500, 500, 0]
    assert (k["op_slice_id"] >= 0).all()
    assert t.modules[["module", "phase", "depth", "step"]].values.tolist() == \
        [["model.fc", "forward", 0, 0], ["model.fc", "forward", 0, 1]]
    ins = t.instructions
    assert sorted(set(ins["engine"])) == ["tensor", "vector"]
    assert int(ins.loc[ins["engine"] == "tensor", "dur"].sum()) == 3000
    assert t.counters["value"].tolist() == [1000, 3000, 2500]
    assert t.hardware == "trn2" and t.hardware_figures["hbm_bytes"] == 1_000_000_000


def test_flows_link_ops_to_kernels(basic_trace: neuron_explorer.Trace) -> None:
    s = basic_trace.table("slices").set_index("id")
    f = basic_trace.flows
    assert len(f) == 6
    assert set(s.loc[f["src_id"], "kind"]) == {"op"}
    assert set(s.loc[f["dst_id"], "kind"]) == {"kernel"}


def test_nesting(basic_trace: neuron_explorer.Trace) -> None:
    s = basic_trace.table("slices").set_index("id")
    mm = s[(s["name"] == "aten::mm")].iloc[0]
    parent = s.loc[mm["parent_id"]]
    assert parent["name"] == "model.fc" and mm["depth"] == 2
    assert s.loc[parent["parent_id"], "kind"] == "step"


def test_formats_give_the_same_tables(traces_dir: Path) -> None:
    sc = scenarios.basic()
    paths = [sc.write(traces_dir, "same_pf"), sc.write(traces_dir, "same_js", "json"),
             sc.b.write_json(traces_dir / "same.json.gz", gz=True),
             sc.b.write_pftrace(traces_dir / "same_inline.pftrace", intern=False)]
    loaded = [neuron_explorer.load(p) for p in paths]
    cols = ["ts", "dur", "name", "category", "depth"]
    ref = loaded[0].table("slices")[cols].reset_index(drop=True)
    for t in loaded[1:]:
        pd.testing.assert_frame_equal(t.table("slices")[cols].reset_index(drop=True), ref)
        assert t.ops["flops"].tolist() == loaded[0].ops["flops"].tolist()
        assert ([t.slice_args.get(i) for i in range(3)]
                == [loaded[0].slice_args.get(i) for i in range(3)])


def test_fast_reader_matches_perfetto_protos(traces_dir: Path) -> None:
    """The vectorised wire reader agrees with Perfetto's own protobuf parsing."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    path = scenarios.basic(steps=5).write(traces_dir, "validate")
    trace = pb.Trace.FromString(path.read_bytes())
    names: dict[int, str] = {}
    ann: dict[int, str] = {}
    begins = []
    for p in trace.packet:
        for n in p.interned_data.event_names:
            names[n.iid] = n.name
        for n in p.interned_data.debug_annotation_names:
            ann[n.iid] = n.name
        e = p.track_event
        if p.HasField("track_event") and e.type in (e.TYPE_SLICE_BEGIN, e.TYPE_INSTANT):
            args = {}
            for a in e.debug_annotations:
                args[ann[a.name_iid]] = getattr(a, a.WhichOneof("value"))
            begins.append((p.timestamp, names[e.name_iid], args))
    loaded = neuron_explorer.load(path)
    s = loaded.slices
    ours = sorted(zip(s["ts"], s["name"], s["args"], strict=True), key=lambda r: (r[0], r[1]))
    expected = sorted(begins, key=lambda r: (r[0], r[1]))
    assert [(a, b) for a, b, _ in ours] == [(a, b) for a, b, _ in expected]
    assert [c for _, _, c in ours] == [c for _, _, c in expected]


def test_sql_and_html(basic_pf: neuron_explorer.Trace) -> None:
    got = basic_pf.sql("select name, sum(device_dur) as d from ops group by name order by d desc")
    assert got["name"].tolist() == ["aten::mm", "aten::relu", "aten::add"]
    assert got["d"].tolist() == [4000, 2000, 400]
    n = basic_pf.sql("select count(*) as n from slices where kind = 'kernel'")["n"].iloc[0]
    assert n == 6
    html = basic_pf._repr_html_()
    assert "trn2" in html and "<table>" in html


REAL = {
    "amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz":
        {"kernel": 14, "memcpy": 2, "runtime": 20},
    "critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz":
        {"kernel": 79, "memcpy": 16, "memset": 3, "runtime": 340, "sync": 21},
    "cpu_only__rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz": {"op": 4},
    "trace_filter__sampled_rank-0.json.gz":
        {"kernel": 1154, "memcpy": 40, "memset": 10, "runtime": 1204},
    "mtia_trace_single_rank__mtia_rank_0.json.gz":
        {"kernel": 3453, "memcpy": 22361, "runtime": 3453},
}


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_traces(load_real, name: str) -> None:
    t = load_real(name)
    assert t.source_format == "kineto_json"
    counts = t.table("slices")["kind"].value_counts()
    for kind, n in REAL[name].items():
        assert counts.get(kind, 0) == n, kind
    assert counts.get("op", 0) > 0
    assert set(KERNEL_COLUMNS) <= set(t.kernels.columns) or not len(t.kernels)
    assert set(OP_COLUMNS) <= set(t.ops.columns)
    if REAL[name].get("kernel"):
        linked = t.kernels[(t.kernels["kind"] == "kernel")]
        assert (linked["op_slice_id"] >= 0).mean() > 0.9  # kernels find the op that launched them
        assert (t.tracks.loc[t.tracks["device"] >= 0, "kind"].isin(["gpu_stream", "dma"])).all()
    assert t.summary()["n_ops"] == len(t.ops)


def test_kineto_steps_and_flows(load_real) -> None:
    t = load_real("amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz")
    assert t.steps["step"].tolist() == [1, 2]
    s = t.table("slices").set_index("id")
    ac2g = t.flows.merge(s[["kind"]], left_on="dst_id", right_index=True)
    assert {"kernel", "memcpy"} <= set(ac2g["kind"])
    assert t.hardware == "AMD Radeon Graphics" and t.hardware_figures is None


@pytest.mark.parametrize("fmt", ["pftrace", "json"])
def test_instructions_without_engine_or_opcode_args(tmp_path: Path, fmt: str) -> None:
    """An instruction without an engine arg takes its track's engine ('dma' for a DMA
    slice on another track, '' else); one without an opcode arg takes its name."""
    from neuron_explorer.collectors.trace_writer import open_writer

    path = tmp_path / f"instructions.{fmt}"
    w = open_writer(str(path), fmt)
    dev = w.process(200, "neuron:0 (trn2)")
    ve, queue, other = (w.track("Vector Engine", dev), w.track("DMA q0", dev),
                        w.track("Misc", dev))
    w.slice(ve, 10, 5, "ADD", "instruction", {"engine": "scalar", "opcode": "ACT"})
    w.slice(ve, 20, 5, "ADD", "instruction", {})
    w.slice(queue, 30, 5, "copy", "dma", {"opcode": "DMA_IN"})
    w.slice(other, 40, 5, "MUL", "instruction", {"opcode": ""})
    w.slice(ve, 50, 5, "SUB", "instruction", {"engine": "vector"})
    w.close()
    ins = neuron_explorer.load(path, cache=False).instructions
    assert ins[["engine", "opcode"]].values.tolist() == [
        ["scalar", "ACT"], ["vector", "ADD"], ["dma", "DMA_IN"], ["", "MUL"],
        ["vector", "SUB"]]
    assert ins["device"].tolist() == [0] * 5  # their tracks' device
    for column in ("engine", "opcode"):  # categories: the values used, in lexical order
        categories = ins[column].cat.categories.tolist()
        assert categories == sorted(set(ins[column]))


@pytest.mark.parametrize("fmt", ["pftrace", "json"])
def test_collectors_writer_output(tmp_path: Path, fmt: str) -> None:
    """Traces written by the collectors' own writers, batches included, load as written."""
    from neuron_explorer.collectors.trace_writer import open_writer

    path = tmp_path / f"written.{fmt}"
    w = open_writer(str(path), fmt)
    w.process(100, "python train.py")
    main = w.thread(100, 100, "MainThread")
    dev = w.process(200, "neuron:0 (trn2)")
    kernels, te = w.track("Kernels", dev), w.track("Tensor Engine", dev)
    hbm = w.counter_track("HBM in use (bytes)", dev, unit="bytes")
    w.metadata(main, 0, {"hardware": "trn2", "hardware_figures": scenarios.FIGURES})
    w.begin(main, 0, "step 0", "step", {"step": 0})
    w.slice(main, 10, 100, "aten::mm", "op", {"op_id": 1, "flops": 2048, "fallback": False},
            flow_out=[1])
    w.slice(kernels, 200, 300, "mm", "kernel",
            {"kernel_id": 1, "op_id": 1, "engine_busy_ns": '{"tensor": 250}'}, flow_in=[1])
    n = 5
    w.slices(np.full(n, te), np.arange(n) * 50 + 200, np.full(n, 40), ["MM", "LS"],
             np.array([0, 1, 0, 1, 0]), "instruction",
             int_args={"kernel_id": np.ones(n, int), "bytes": np.arange(n)},
             str_args={"engine": (["tensor"], np.zeros(n, int))})
    w.counters(np.full(3, hbm), np.array([1, 2, 3]), np.array([5.0, 7.0, 6.0]))
    w.end(main, 1000)
    w.close()
    t = neuron_explorer.load(path)
    assert t.skipped == {}
    assert t.steps[["step", "ts", "dur"]].values.tolist() == [[0, 0, 1000]]
    assert t.ops[["name", "device_dur", "flops", "step"]].values.tolist() == \
        [["aten::mm", 300, 2048, 0]]
    assert t.kernels["busy_tensor"].tolist() == [250]
    assert t.instructions[["opcode", "bytes", "engine"]].values.tolist() == \
        [["MM", 0, "tensor"], ["LS", 1, "tensor"], ["MM", 2, "tensor"], ["LS", 3, "tensor"],
         ["MM", 4, "tensor"]]
    assert t.counters["value"].tolist() == [5.0, 7.0, 6.0]
    assert t.flows[["src_id", "dst_id"]].values.tolist() == [[2, 3]]
    assert t.hardware_figures["hbm_bytes"] == scenarios.FIGURES["hbm_bytes"]


@pytest.mark.parametrize("first_length", [ord("["), ord("{")])
def test_pftrace_whose_first_packet_length_reads_as_a_json_bracket(
        tmp_path: Path, first_length: int) -> None:
    """The first byte is 0x0a (a newline) and the next one the packet's length."""
    from neuron_explorer.collectors.perfetto_writer import PerfettoWriter

    for pad in range(200):
        path = tmp_path / f"t{pad}.pftrace"
        w = PerfettoWriter(str(path))
        w.process(7, "p" * (pad + 1))
        w.close()
        if path.read_bytes()[1] == first_length:
            break
    else:
        pytest.fail("no process name gave the wanted first packet length")
    w = PerfettoWriter(str(path))
    proc = w.process(7, "p" * (pad + 1))
    w.slice(w.track("work", proc), 1000, 500, "aten::mm", "op")
    w.close()
    trace = neuron_explorer.load(path)
    assert trace.slices["name"].tolist() == ["aten::mm"]


def _interning_trace(path: Path, sequences: list[int]) -> Path:
    """Slices on one track whose name iid 1 means a different name per sequence and per
    generation of its incremental state (cleared twice on each sequence)."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    trace = pb.Trace()
    packet = trace.packet.add(trusted_packet_sequence_id=sequences[0])
    packet.track_descriptor.uuid = 1
    packet.track_descriptor.thread.pid, packet.track_descriptor.thread.tid = 1, 1
    ts = 0
    for generation in range(2):
        for seq in sequences:
            packet = trace.packet.add(trusted_packet_sequence_id=seq, sequence_flags=1)
            packet.interned_data.event_names.add(iid=1, name=f"seq{seq} gen{generation}")
            for kind in (1, 2):  # begin, end
                ts += 10
                event = trace.packet.add(trusted_packet_sequence_id=seq, timestamp=ts)
                event.track_event.type, event.track_event.track_uuid = kind, 1
                if kind == 1:
                    event.track_event.name_iid = 1
    path.write_bytes(trace.SerializeToString())
    return path


@pytest.mark.parametrize("sequences", [[7], [7, 3]])
def test_interned_names_follow_sequence_and_generation(tmp_path: Path,
                                                       sequences: list[int]) -> None:
    t = neuron_explorer.load(_interning_trace(tmp_path / "interned.pftrace", sequences))
    expected = [f"seq{s} gen{g}" for g in range(2) for s in sequences]
    assert t.table("slices").sort_values("ts")["name"].tolist() == expected


SAMPLES = Path(__file__).parents[2] / "sample_traces"


def _by_slice(args: pd.DataFrame) -> pd.DataFrame:
    return args.sort_values("slice_id", kind="stable").reset_index(drop=True)


CORRUPT_ANNOTATION = Path(__file__).parents[1] / "data" / "fuzz_corpus" / \
    "corrupt_annotation.pftrace"


@pytest.mark.slow  # 10-12 s a trace in a CI run
@pytest.mark.parametrize("path", [SAMPLES / "nki_kernels.pftrace",
                                  SAMPLES / "gpt_compiled.pftrace", CORRUPT_ANNOTATION],
                         ids=lambda p: p.name)
def test_events_scanned_a_few_at_a_time_give_the_same_trace(
        path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The packets', events' and debug annotations' fields are scanned a chunk at a time
    (bounded memory on large traces): with chunks of 97 packets, 61 events and 47
    annotations, names interned in one chunk and used in another, slices begun in one and
    ended in another, args (corrupt ones left out, and said so, the same), flows and
    counters come out the same. (Thousands of chunk boundaries a trace; chunks of 7 events
    and 5 annotations took 20 s a trace, and caught nothing these miss: dropping a chunk's
    event or packet offset fails every case.)"""
    from neuron_explorer.loaders import pftrace, pftrace_annotations

    def loaded() -> tuple[neuron_explorer.Trace, list[str]]:
        with warnings_heard() as heard:
            trace = neuron_explorer.load(path, cache=False)
            trace.table("args")  # decoded on first use: its warnings are heard here
        return trace, [str(w.message) for w in heard]

    whole, whole_heard = loaded()
    monkeypatch.setattr(pftrace, "EVENTS_PER_CHUNK", 61)
    monkeypatch.setattr(pftrace, "PACKETS_PER_CHUNK", 97)
    monkeypatch.setattr(pftrace_annotations, "ANNOTATIONS_PER_CHUNK", 47)
    chunked, chunked_heard = loaded()
    for table in ("slices", "tracks", "counters", "flows"):
        pd.testing.assert_frame_equal(whole.table(table), chunked.table(table), obj=table)
    # the args' rows come a chunk of events at a time: the same rows, each slice's in order
    pd.testing.assert_frame_equal(_by_slice(whole.table("args")),
                                  _by_slice(chunked.table("args")), obj="args")
    assert len(whole.table("args")) > 5
    assert whole.slice_args.dicts() == chunked.slice_args.dicts()
    assert whole.metadata == chunked.metadata and whole.skipped == chunked.skipped
    assert whole_heard == chunked_heard
    if path == CORRUPT_ANNOTATION:
        assert whole.skipped.get("corrupt debug annotation")
    else:
        assert len(whole.counters) and len(whole.flows)


@pytest.mark.parametrize("size", [0, 4, 4096, 10_000, 20_000])
def test_a_trace_is_read_whole_into_one_buffer_whatever_its_size_said(size) -> None:
    """The size taken before reading may be stale: a file that grew or shrank since is
    read to its end, no byte lost or added."""
    import io

    from neuron_explorer.loaders import _read_whole

    body = bytes(range(256)) * 40  # 10,240 bytes
    data = _read_whole(io.BytesIO(body[64:]), body[:64], size)
    assert bytes(data) == body
