"""Counter series: one summary row per series, its mean weighted by how long each value
held; a figure of every series. The copies' bandwidth and the CUPTI counters against
Holistic Trace Analysis 0.5.0's own figures on the same files (printed by
benchmarks/hta_parity_values.py; pandas 2.2.3)."""

from __future__ import annotations

import neuron_explorer
import pytest
from synthetic import TraceBuilder


def _trace(tmp_path):
    """HBM in use on device 0: 100 for 10 us, 400 for 30 us, then 0 (the last sample)."""
    b = TraceBuilder()
    host = b.thread()
    b.metadata(host, {"hardware": "trn2"})
    b.slice(host, 0, 40_000, "step 0", "step", {"step": 0})
    hbm = b.counter_track(0, "HBM in use (bytes)")
    for ts, value in ((0, 100.0), (10_000, 400.0), (40_000, 0.0)):
        b.counter(hbm, ts, value)
    return neuron_explorer.load(b.write_pftrace(tmp_path / "c.pftrace"))


def test_the_mean_over_time_weights_each_value_by_how_long_it_held(tmp_path):
    summary = _trace(tmp_path).counter_summary()
    assert len(summary) == 1
    row = summary.iloc[0]
    assert row["series"] == "HBM in use (bytes)" and row["device"] == 0
    assert (row["samples"], row["min"], row["max"], row["last"]) == (3, 0.0, 400.0, 0.0)
    assert row["mean"] == pytest.approx(500 / 3)
    assert row["time_weighted_mean"] == pytest.approx((100 * 10 + 400 * 30) / 40)
    assert (row["first_ts"], row["last_ts"]) == (0, 40_000)


def test_our_recording_has_memory_and_engine_series(repo_root):
    trace = neuron_explorer.load(repo_root / "sample_traces" / "gpt_eager.pftrace")
    summary = trace.counter_summary().set_index("series")
    assert {"HBM in use (bytes)", "Tensor Engine utilisation (%)"} <= set(summary.index)
    engine = summary.loc["Tensor Engine utilisation (%)"]
    assert 0 <= engine["min"] <= engine["time_weighted_mean"] <= engine["max"] <= 100
    figure = trace.plot.counters()
    assert {line.name for line in figure.data} == set(summary.index)
    assert max(max(line.y) for line in figure.data) == pytest.approx(100)


def test_a_trace_without_counters_has_no_rows_and_says_so(load_real):
    from neuron_explorer.report import render_report

    trace = load_real("cpu_only__rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")
    assert trace.counter_summary().empty and trace.counter_series().empty
    assert "no counters" in str(trace.plot.counters().layout.annotations[0].text)
    text = render_report(trace, "text")
    assert "Counters (the whole trace)" not in text and "CUPTI counters" not in text


def test_the_report_lists_each_series(repo_root):
    from neuron_explorer.report import render_report

    trace = neuron_explorer.load(repo_root / "sample_traces" / "gpt_eager.pftrace")
    section = render_report(trace, "text").split("Counters (the whole trace)")[1]
    section = section.split("Top ops")[0]
    row = next(line.split() for line in section.splitlines()
               if line.startswith("Tensor Engine utilisation (%)"))
    assert row[4:] == ["0", "156", "0.7246", "36.87", "0"]


# HTA 0.5.0 `get_memory_bw_summary(ranks=[rank])`: per copy kind, over the series' points
# other than 0: count, mean, std, min, 50%, max (GB/s, as printed: 6 decimals); the
# copies HTA keeps
HTA_MEMORY_BW = {
    "critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz": {
        "Memcpy HtoD": (16, 4.108898, 3.151912, 0.142777, 4.393736, 11.146690),
        "Memset": (3, 1.726877, 2.600718, 0.225352, 0.225352, 4.729927)},
    "trace_filter__sampled_rank-0.json.gz": {
        "Memcpy DtoD": (4, 491.943204, 409.954663, 0.000969, 503.768707, 960.234432),
        "Memcpy DtoH": (4, 0.419659, 0.666906, 0.000488, 0.138706, 1.400735),
        "Memcpy HtoD": (12, 2.001442, 2.878134, 0.000425, 0.542529, 6.830521),
        "Memset": (5, 150.722967, 337.010449, 0.001429, 0.004310, 753.585586)},
    "trace_filter__sampled_rank-1.json.gz": {
        "Memcpy DtoD": (4, 543.566338, 367.205812, 0.001147, 699.640285, 774.983634),
        "Memcpy DtoH": (4, 0.132589, 0.152582, 0.000473, 0.130675, 0.268531),
        "Memcpy HtoD": (12, 2.127952, 2.572323, 0.000628, 0.537853, 6.706594),
        "Memset": (5, 0.028457, 0.031008, 0.000977, 0.020619, 0.081897)},
}


@pytest.mark.parametrize("name", sorted(HTA_MEMORY_BW))
def test_copy_bandwidth_matches_hta(load_real, name):
    """Each copy adds the bandwidth Kineto wrote on it from its start to its end."""
    series = load_real(name).copy_bandwidth(hta_window=True)
    points = series[series["gbps"] > 0].groupby("copy")["gbps"]
    got = points.agg(["count", "mean", "std", "min", "median", "max"])
    assert set(got.index) == set(HTA_MEMORY_BW[name])
    for copy, expected in HTA_MEMORY_BW[name].items():
        assert got.loc[copy].tolist() == pytest.approx(expected, rel=1e-5, abs=1e-6), copy
    assert (series.groupby(["device", "copy"])["gbps"].last() == 0).all()  # all end


def test_copy_bandwidth_adds_overlapping_copies_and_skips_unknown_sizes(tmp_path):
    """Without Kineto's bandwidth argument a copy's is its bytes over its duration (GB/s
    is bytes per ns); two copies at once add; a memset of unknown size makes no series."""
    import json

    def copy(name, tid, ts, dur, corr, **extra):
        return {"ph": "X", "cat": "gpu_memset" if name.startswith("Memset") else "gpu_memcpy",
                "name": name, "pid": 0, "tid": tid, "ts": ts, "dur": dur,
                "args": {"device": 0, "stream": tid, "correlation": corr, **extra}}

    events = [copy("Memcpy HtoD (Pinned -> Device)", 7, 100, 10, 1, bytes=20_000),
              copy("Memcpy HtoD (Pinned -> Device)", 8, 105, 10, 2, bytes=40_000),
              copy("Memset (Device)", 7, 130, 2, 3)]
    path = tmp_path / "copies.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    trace = neuron_explorer.load(path)
    series = trace.copy_bandwidth()
    assert set(series["copy"]) == {"Memcpy HtoD"}
    assert series["gbps"].tolist() == pytest.approx([2.0, 6.0, 4.0, 0.0])
    assert series["ts"].tolist() == [100_000, 105_000, 110_000, 115_000]
    summary = trace.counter_summary().set_index("series")
    assert list(summary.index) == ["Memcpy HtoD bandwidth (GB/s)"]
    assert summary.iloc[0]["time_weighted_mean"] == pytest.approx((2 * 5 + 6 * 5 + 4 * 5) / 15)


def test_a_trace_whose_copies_carry_no_size_has_no_bandwidth(load_real):
    """The AMD trace's copies say neither bytes nor bandwidth: no series (HTA draws one
    of zeros)."""
    trace = load_real("amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz")
    assert len(trace.kernels[trace.kernels["kind"] == "memcpy"]) == 2
    assert trace.copy_bandwidth().empty and trace.counter_summary().empty


CUPTI = "cupti_profiler__benchmark_result_924719_1679055439_trace.json.gz"
# HTA 0.5.0 `get_cupti_counter_data_with_operators(ranks=[0])` on HTA's CUPTI-profiler
# test trace: 77 kernels; per innermost op around each kernel's launch, its kernels and
# the sum of all its counters; per outermost op, its kernels; each counter's sum
HTA_CUPTI_PER_OP = {
    "aten::_adaptive_avg_pool2d": (2, 25384000), "aten::add_": (10, 372473856),
    "aten::addmm": (12, 15095300096), "aten::clamp_min_": (14, 0),
    "aten::cudnn_convolution": (28, 25241174016), "aten::max_pool2d_with_indices": (6, 22609920),
    "aten::native_dropout": (4, 12337152), "aten::uniform_": (1, 43597824)}
HTA_CUPTI_TOP = {"aten::conv2d": 38, "aten::relu_": 14, "aten::linear": 12,
                 "aten::max_pool2d": 6, "aten::dropout": 4, "aten::adaptive_avg_pool2d": 2,
                 "aten::rand": 1}
HTA_CUPTI_SUMS = {"dadd": 0, "dfma": 0, "dmul": 0, "fadd": 964651656, "ffma": 39142369720,
                  "fmul": 430063616, "hadd": 0, "hfma": 275791872, "hmul": 0}


def test_cupti_counters_match_hta(load_real):
    kernels = load_real(CUPTI).cupti_counters()
    counters = [f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum" for op in HTA_CUPTI_SUMS]
    assert len(kernels) == 77 and (kernels["launch"] >= 0).all()
    assert {c: int(kernels[c].sum()) for c in counters} == {
        f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum": v
        for op, v in HTA_CUPTI_SUMS.items()}
    per_op = {op: (len(part), int(part[counters].to_numpy().sum()))
              for op, part in kernels.groupby("bottom_level_op")}
    assert per_op == HTA_CUPTI_PER_OP
    assert kernels["top_level_op"].value_counts().to_dict() == HTA_CUPTI_TOP
    # FLOPs from the SASS counters: an FMA is two
    fma = [c for c in counters if "fma" in c]
    flops = kernels[counters].to_numpy().sum() + kernels[fma].to_numpy().sum()
    assert kernels["flops"].sum() == pytest.approx(flops)


def test_cupti_counters_are_series_and_a_report_section(load_real):
    """Each counter is a series (its value over each profiled kernel); the report gives
    FLOPs per innermost op. A trace without CUPTI ranges has neither."""
    from neuron_explorer.report import render_report

    trace = load_real(CUPTI)
    summary = trace.counter_summary().set_index("series")
    ffma = summary.loc["smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"]
    assert (ffma["samples"], ffma["max"], ffma["last"]) == (154, 9119334400.0, 0.0)
    assert ffma["device"] == 0
    lines = {line.name for line in trace.plot.counters().data}
    assert len(lines) == 9 and lines == set(summary.index)
    section = render_report(trace, "text").split("CUPTI counters per op")[1].split("Top ops")[0]
    row = next(line.split() for line in section.splitlines()
               if line.startswith("aten::cudnn_convolution"))
    assert row[1:] == ["28", "aten::conv2d", "4.913e+10", "61.2%"]
    plain = load_real("trace_filter__sampled_rank-0.json.gz")
    assert plain.cupti_counters().empty
    text = render_report(plain, "text")
    assert "CUPTI counters" not in text
    counters = text.split("Counters (the whole trace)")[1].split("\n\n")[0]
    assert "Memcpy DtoD bandwidth (GB/s)" in counters


def test_a_counters_augmented_copy_of_a_pytorch_trace(load_real, tmp_path, repo_root):
    """HTA's generate_trace_with_counters: the queue length of each stream and the
    bandwidth of each copy kind added to a copy of the trace as counter events, here one
    counter per stream (HTA's `id` is lost on readers that key a counter by its name).
    Read back, the counters are the tables' series; the trace's own events are all there.
    HTA 0.5.0's queue length holds 1052 samples on stream 7 (test_hta_parity.py)."""
    from neuron_explorer.common.errors import NeuronExplorerError

    trace = load_real("trace_filter__sampled_rank-0.json.gz")
    out = trace.write_with_counters(str(tmp_path / "with_counters.json.gz"), hta_window=True)
    again = neuron_explorer.load(out)
    assert len(again.slices) == len(trace.slices) and len(again.kernels) == len(trace.kernels)
    counters = again.counters
    queue = trace.queue_length(hta_window=True)
    for stream, part in queue.groupby("stream"):
        written = counters[counters["name"] == f"Queue Length ({stream})"]
        assert written["ts"].tolist() == part["ts"].tolist()
        assert written["value"].tolist() == part["queue_length"].tolist()
    assert (counters["name"] == "Queue Length (stream 7)").sum() == 1052
    bandwidth = trace.copy_bandwidth(hta_window=True)
    for copy, part in bandwidth.groupby("copy"):
        written = counters[counters["name"] == f"{copy} bandwidth (GB/s)"]
        assert written["value"].tolist() == pytest.approx(part["gbps"].tolist())
    ours = neuron_explorer.load(repo_root / "sample_traces" / "mlp_eager.pftrace")
    with pytest.raises(NeuronExplorerError, match="not a PyTorch-profiler JSON trace"):
        ours.write_with_counters(str(tmp_path / "ours.json"))
