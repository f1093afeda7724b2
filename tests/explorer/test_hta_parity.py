"""Figures Holistic Trace Analysis computes, against HTA's own numbers on the same files.

The expected values were computed with HolisticTraceAnalysis 0.5.0 (pandas 2.2.3) on the
real traces in tests/data/real_traces, each call named beside its values;
benchmarks/hta_parity_values.py prints them all again where HTA is installed. HTA itself is
not a dependency of this project. docs/explorer.md says where our definitions differ.
"""

from __future__ import annotations

import neuron_explorer
import pytest

# HTA 0.5.0 `get_gpu_kernel_breakdown(visualize=False, include_memory_kernels=True)`, its
# `sum` column: kernel type -> HTA's time in us
HTA_KERNEL_TYPES = {
    "trace_filter__sampled_rank-0.json.gz": {
        "communication": 171780, "computation": 83182,
        "computation overlapping communication": 23056,
        "communication overlapping memory": 479, "memory": 169,
        "computation overlapping communication overlapping memory": 12,
        "computation overlapping memory": 2},
    # no ProfilerStep: the whole trace, as HTA
    "critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz": {
        "memory": 55511, "computation": 10637},
}


@pytest.mark.parametrize("name", sorted(HTA_KERNEL_TYPES))
def test_kernel_types_match_hta(load_real, name):
    """Time covered per kernel type with HTA's overlap rows, over the kernels HTA keeps
    (launched before the last ProfilerStep). HTA rounds each event's ts and dur down to
    whole us (ours are ns): within 1 us per kernel of the type."""
    trace = load_real(name)
    ours = trace.kernel_types(hta_window=True)
    got = {row.kernel_type: row.ns / 1e3 for row in ours.itertuples()}
    assert set(got) == set(HTA_KERNEL_TYPES[name])
    kernels = trace.kernels
    for kernel_type, hta_us in HTA_KERNEL_TYPES[name].items():
        assert got[kernel_type] == pytest.approx(hta_us, abs=max(1.0, 0.001 * hta_us)), kernel_type
    shares = ours["share"].sum()
    assert shares == pytest.approx(1.0)
    # the plain sum beside each type is the kernels' own durations
    plain = ours.set_index("kernel_type")["sum_ns"]
    assert plain.get("computation overlapping memory", 0) == 0
    assert plain["memory"] == int(kernels[kernels["kind"].isin(["memcpy", "memset"])
                                          & (kernels["id"].isin(_kept_ids(trace)))]["dur"].sum())


def _kept_ids(trace) -> set[int]:
    """The kernels in HTA's window: launched before the last step (all, without steps)."""
    k = trace.kernels
    if len(trace.steps) < 2:
        return set(k["id"].tolist())
    last = int(trace.steps["ts"].max())
    ts = trace.table("slices")["ts"].to_numpy()
    launched = [ts[o] if o >= 0 else t for o, t in zip(k["op_slice_id"], k["ts"], strict=True)]
    return {i for i, t in zip(k["id"], launched, strict=True) if t < last}


def test_the_whole_trace_counts_every_kernel(load_real):
    """Without `hta_window`, both of the file's steps count: about twice HTA's window."""
    trace = load_real("trace_filter__sampled_rank-0.json.gz")
    whole = trace.kernel_types().set_index("kernel_type")
    hta = trace.kernel_types(hta_window=True).set_index("kernel_type")
    for kernel_type in ("computation", "communication"):
        assert 1.5 < whole.loc[kernel_type, "ns"] / hta.loc[kernel_type, "ns"] < 2.5
    assert whole["sum_ns"].sum() == int(trace.kernels["dur"].sum())  # every kernel, once


# HTA 0.5.0 `TraceAnalysis(trace_dir=...).get_queue_length_summary(ranks=[0])` (pandas
# 2.2.3), per stream: count, mean, std, min, 25%, 50%, 75%, max of the queue length over
# its change points (one per launch call and one per kernel start, each counted once)
HTA_QUEUE_LENGTH = {
    "critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz": {
        "stream 7": (182, 3.346154, 4.699355, 0, 0, 1, 4, 18),
        "stream 20": (14, 0.642857, 0.633324, 0, 0, 1, 1, 2)},
    "trace_filter__sampled_rank-0.json.gz": {
        "stream 7": (1052, 23.619772, 19.977006, 0, 3, 22, 38, 76),
        "stream 23": (126, 0.595238, 0.683269, 0, 0, 1, 1, 4),
        "stream 25": (16, 4.0, 2.422120, 0, 2, 4, 6, 8),
        "stream 84": (8, 0.5, 0.534522, 0, 0, 0.5, 1, 1),
        "stream 203": (2, 0.5, 0.707107, 0, 0.25, 0.5, 0.75, 1)},
}
# the time-weighted means HTA's series give (HTA's summary has none): sampled rank 0
HTA_TIME_WEIGHTED = {"stream 7": 16.21, "stream 25": 5.27}


@pytest.mark.parametrize("name", sorted(HTA_QUEUE_LENGTH))
def test_queue_length_matches_hta(load_real, name):
    """A kernel, copy or memset joins its stream's queue at its launch call's start and
    leaves it when it starts; work whose launch is not in the trace is left out. The
    sampled trace has two ProfilerSteps, and HTA drops the last (`hta_window`)."""
    summary = load_real(name).queue_length_summary(hta_window=True).set_index("stream")
    assert set(summary.index) == set(HTA_QUEUE_LENGTH[name])
    columns = ["count", "mean", "std", "min", "25%", "50%", "75%", "max"]
    for stream, expected in HTA_QUEUE_LENGTH[name].items():
        assert summary.loc[stream, columns].tolist() == pytest.approx(expected, abs=1e-6)


def test_the_queue_is_deep_where_the_host_runs_ahead(load_real):
    trace = load_real("trace_filter__sampled_rank-0.json.gz")
    summary = trace.queue_length_summary(hta_window=True).set_index("stream")
    for stream, mean in HTA_TIME_WEIGHTED.items():
        assert summary.loc[stream, "time_weighted_mean"] == pytest.approx(mean, abs=0.01)
    whole = trace.queue_length_summary().set_index("stream")  # both steps: twice the samples
    assert whole.loc["stream 7", "count"] == 2 * HTA_QUEUE_LENGTH[
        "trace_filter__sampled_rank-0.json.gz"]["stream 7"][0]
    series = trace.queue_length(hta_window=True)
    assert (series.groupby("stream")["queue_length"].last() == 0).all()  # every stream drains
    assert (series["queue_length"] >= 0).all()


# HTA 0.5.0 `get_time_spent_blocked_on_full_queue(get_queue_length_time_series([rank]),
# max_queue_length=full)`: us per stream at `full` or more; none at CUDA's 1024 on any
# trace (HTA keeps one stream per rank: the others here stay under 10)
HTA_BLOCKED = {
    "trace_filter__sampled_rank-0.json.gz": {50: 16855, 30: 155089, 10: 287139},
    "trace_filter__sampled_rank-1.json.gz": {50: 44806, 30: 102917, 10: 294261},
    "critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz": {10: 1316},
}


@pytest.mark.parametrize("name", sorted(HTA_BLOCKED))
def test_time_on_a_full_queue_matches_hta(load_real, name):
    trace = load_real(name)
    assert (trace.queue_length_summary(hta_window=True)["full_ns"] == 0).all()  # 1024
    for full in (50, 30, 10):
        summary = trace.queue_length_summary(hta_window=True, full=full).set_index("stream")
        blocked = summary[summary["full_ns"] > 0]
        expected = HTA_BLOCKED[name].get(full)
        assert list(blocked.index) == (["stream 7"] if expected else [])
        if expected:
            assert blocked.loc["stream 7", "full_ns"] == expected * 1000
            assert 0 < blocked.loc["stream 7", "full_share"] < 1


def test_our_queue_is_empty_when_host_bound_and_fills_when_device_bound(repo_root):
    """Our recordings: a kernel joins the queue at its op's start. The eager MLP's host
    launches slower than the device runs (its queue is empty 99% of the time); the fp32
    matmuls' device is the slower side (work waits in the queue a third of the time)."""
    import neuron_explorer

    host_bound = neuron_explorer.load(repo_root / "sample_traces" / "mlp_eager.pftrace")
    device_bound = neuron_explorer.load(repo_root / "sample_traces" / "fp32_matmul.pftrace")
    fed, starved = device_bound.queue_length_summary(), host_bound.queue_length_summary()
    assert starved["max"].max() == 1 and starved["empty_share"].min() > 0.95
    assert fed["max"].max() >= 3 and fed["empty_share"].min() < 0.7


# HTA 0.5.0 `get_cuda_kernel_launch_stats(ranks=[0], runtime_cutoff=50,
# launch_delay_cutoff=100, include_memory_events=True)` (pandas 2.2.3): rows; sums of
# cpu_duration, gpu_duration, launch_delay in us; and the rows its plot picks as short
# kernels (cpu <= 50 and gpu < cpu), runtime outliers (cpu > 50), launch-delay outliers
HTA_LAUNCH_STATS = {
    "critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz":
        (98, 3_113_616, 66_203, 39_283, 23, 11, 43),
    "trace_filter__sampled_rank-0.json.gz": (602, 5_109, 302_241, 9_880_122, 140, 0, 469),
}


@pytest.mark.parametrize("name", sorted(HTA_LAUNCH_STATS))
def test_launch_stats_match_hta(load_real, name):
    from neuron_explorer.analyses.launch_stats import launch_outliers

    stats = load_real(name).launch_stats(hta_window=True)
    rows, cpu, gpu, delay, short, slow, delayed = HTA_LAUNCH_STATS[name]
    assert len(stats) == rows and stats["kernel_id"].is_unique
    assert (stats["cpu_ns"].sum(), stats["gpu_ns"].sum(), stats["launch_delay_ns"].sum()) == \
        (cpu * 1000, gpu * 1000, delay * 1000)  # these traces hold whole us
    groups = launch_outliers(stats)
    assert (len(groups["short"]), len(groups["slow_launch"]), len(groups["delayed"])) == \
        (short, slow, delayed)


# HTA 0.5.0 `get_aten_op_kernels_and_delay(ranks=[rank])` (pandas 2.2.3): its rows, and
# per ATen op: the op calls, and the sums over them of the first launch's delay after the
# op's start and of its kernel's after the launch call (occurrence_count times the
# average, in us)
HTA_OP_KERNELS_ALEXNET = (10, {
    "aten::_adaptive_avg_pool2d": (2, 83, 1483), "aten::add_": (10, 183, 6090),
    "aten::addmm": (6, 21903, 2380), "aten::clamp_min_": (14, 131, 9879),
    "aten::cudnn_convolution": (10, 8856213, 3058470),
    "aten::max_pool2d_with_indices": (6, 833576, 2234), "aten::native_dropout": (4, 231, 2955),
    "aten::uniform_": (1, 94, 35)})
# the sampled traces: rows and every op's sums, equal but where HTA gives a call's kernels
# to another op than the innermost one around the launch (its outer op when both start in
# the same us; an op of another thread that started later): those ops' sums together
HTA_OP_KERNELS_SAMPLED = {
    "trace_filter__sampled_rank-0.json.gz": (179, {
        ("aten::linalg_norm", "aten::linalg_vector_norm"): (2, 153, 129506),
        ("aten::matmul", "aten::mm"): (115, 3908, 1787976)}, (487, 12476, 6712799)),
    "trace_filter__sampled_rank-1.json.gz": (175, {
        ("aten::matmul", "aten::mm"): (112, 3749, 1888432),
        ("aten::mul", "aten::mul_"): (29, 225, 855627)}, (481, 12149, 7544099)),
}


def _op_sums(table) -> dict[str, tuple[int, float, float]]:
    return {op: (int(part["count"].sum()),
                 float((part["count"] * part["op_launch_delay_ns"]).sum()) / 1e3,
                 float((part["count"] * part["runtime_delay_ns"]).sum()) / 1e3)
            for op, part in table.groupby("op")}


def test_op_kernels_match_hta_on_alexnet(load_real):
    ours = load_real(
        "critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz"
    ).op_kernels(hta_window=True)
    rows, per_op = HTA_OP_KERNELS_ALEXNET
    assert len(ours) == rows
    sums = _op_sums(ours)
    assert set(sums) == set(per_op)
    for op, expected in per_op.items():
        assert sums[op] == pytest.approx(expected, abs=0.5), op
    conv = ours[ours["op"] == "aten::cudnn_convolution"]
    assert sorted(conv["count"]) == [2, 2, 6] and conv["kernel_sequence"].str.contains(" -> ").all()


@pytest.mark.parametrize("name", sorted(HTA_OP_KERNELS_SAMPLED))
def test_op_kernels_match_hta_on_the_sampled_traces(load_real, name):
    ours = load_real(name).op_kernels(hta_window=True)
    hta_rows, groups, totals = HTA_OP_KERNELS_SAMPLED[name]
    sums = _op_sums(ours)
    assert [sum(v[i] for v in sums.values()) for i in range(3)] == pytest.approx(totals, abs=1)
    for ops, expected in groups.items():
        together = [sum(sums.get(op, (0, 0, 0))[i] for op in ops) for i in range(3)]
        assert together == pytest.approx(expected, abs=0.5), ops
    assert hta_rows - 7 <= len(ours) < hta_rows  # HTA's other ops make rows of their own


def test_op_kernels_of_our_recording_are_launched_by_the_op_itself(repo_root):
    """In our recordings the op is the launch: no delay before it, and the kernel's start
    after the op's is its runtime delay."""
    trace = neuron_explorer.load(repo_root / "sample_traces" / "mlp_eager.pftrace")
    ours = trace.op_kernels()
    assert len(ours) and (ours["op_launch_delay_ns"] == 0).all()
    assert (ours["runtime_delay_ns"] >= 0).all() and ours["op"].str.startswith("aten::").all()
    kernels = trace.kernels
    assert ours["count"].sum() <= int((kernels["kind"] == "kernel").sum())


def test_our_eager_mlp_launches_kernels_shorter_than_their_launch(repo_root):
    """Our recordings: the op is the launch. Every kernel of the eager MLP runs shorter
    than the host takes to launch it, and none waits in its queue."""
    import neuron_explorer
    from neuron_explorer.analyses.launch_stats import launch_outliers

    stats = neuron_explorer.load(repo_root / "sample_traces" / "mlp_eager.pftrace").launch_stats()
    groups = launch_outliers(stats)
    assert len(stats) and len(groups["short"]) == len(stats) and not len(groups["delayed"])


def test_the_report_shows_each_streams_queue_and_launches(load_real):
    from neuron_explorer.report import render_report

    text = render_report(load_real("trace_filter__sampled_rank-0.json.gz"), "text")
    section = text.split("Queues and launches")[1].split("Top ops")[0]
    row = next(line.split() for line in section.splitlines() if line.startswith("stream 7 "))
    assert row[2:6] == ["1052", "201", "894", "11.94"]  # the whole trace: both steps
    assert "idle: host_wait" in section and row[-2:] == ["598.2", "ms"]  # stream 7's other
    cpu_only = render_report(load_real("cpu_only__rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"),
                             "text")
    assert "Queues and launches" not in cpu_only


# HTA 0.5.0 `get_idle_time_breakdown(ranks=[0], visualize=False)` (pandas 2.2.3): per
# stream and category, `idle_time` in us (its default consecutive_kernel_delay, 30 us)
HTA_IDLE = {
    "critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz": {
        ("stream 7", "host_wait"): 12855007.0, ("stream 7", "kernel_wait"): 104.0,
        ("stream 7", "other"): 0.0, ("stream 20", "host_wait"): 12011718.0,
        ("stream 20", "kernel_wait"): 3.0, ("stream 20", "other"): 0.0},
    "trace_filter__sampled_rank-0.json.gz": {
        ("stream 23", "host_wait"): 596037.0, ("stream 23", "kernel_wait"): 70.0,
        ("stream 23", "other"): 34.0, ("stream 84", "host_wait"): 148934.0,
        ("stream 84", "kernel_wait"): 6.0, ("stream 84", "other"): 0.0,
        ("stream 25", "kernel_wait"): 9.0, ("stream 25", "other"): 47865.0,
        ("stream 7", "host_wait"): 213825.0, ("stream 7", "kernel_wait"): 1985.0,
        ("stream 7", "other"): 261740.0, ("stream 203", "other"): 0.0},
}


@pytest.mark.parametrize("name", sorted(HTA_IDLE))
def test_stream_idle_matches_hta(load_real, name):
    """Idle time per stream in HTA's categories, over the kernels HTA keeps. HTA rounds
    each event's ts and dur down to whole us (ours are ns): within 0.5%, or 1 us per gap
    of the category where that is more (a category of many short gaps)."""
    ours = load_real(name).stream_idle(hta_window=True)
    got = ours.set_index(["stream", "idle_category"])
    assert {stream for stream, _ in HTA_IDLE[name]} == set(ours["stream"])
    for key, hta_us in HTA_IDLE[name].items():
        row = got.loc[key]
        tolerance = max(0.005 * hta_us, float(row["gaps"]), 1.0)
        assert row["idle_ns"] / 1e3 == pytest.approx(hta_us, abs=tolerance), key
    # a category HTA leaves out of its table is an empty one here
    missing = got.drop(index=list(HTA_IDLE[name]), errors="ignore")
    assert (missing["idle_ns"] == 0).all()


def test_stream_idle_of_our_host_bound_recording_is_host_wait(repo_root):
    """Our eager MLP (sample_traces/mlp_eager.pftrace) launches each kernel after the one
    before has finished: its queue's idle time is nearly all host_wait; the whole-trace
    figure holds more gaps than HTA's window."""
    trace = neuron_explorer.load(repo_root / "sample_traces" / "mlp_eager.pftrace")
    idle = trace.stream_idle()
    per_category = idle.groupby("idle_category")["idle_ns"].sum()
    assert per_category["host_wait"] > 0.9 * per_category.sum()
    assert idle["gaps"].sum() >= trace.stream_idle(hta_window=True)["gaps"].sum()


# HTA 0.5.0 `get_temporal_breakdown(visualize=False)` (pandas 2.2.3, printed by
# benchmarks/hta_parity_values.py): idle, compute, non-compute and kernel time in us, from
# the first kernel's start to the last one's end over the kernels HTA keeps
HTA_TEMPORAL = {
    "trace_filter__sampled_rank-0.json.gz": (321378, 106252, 172428, 600058),
    "trace_filter__sampled_rank-1.json.gz": (328671, 135548, 136455, 600674),
    # HTA also counts the profiler's sync events (Stream Sync, Context Sync, Stream Wait
    # Event: 179 us, the last ends 75.8 ms after the last kernel) as device work
    "critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz":
        (12929684, 10637, 55690, 12996011),
    # times with fractions of a us, which HTA 0.5 cuts to whole us: up to 2 us per event
    "amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz": (8780, 96, 35, 8911),
}


@pytest.mark.parametrize("name", sorted(HTA_TEMPORAL))
def test_temporal_breakdown_matches_hta(load_real, name):
    """Each figure within 0.5% of HTA's (or 1 us per kernel it sums, as for the kernel
    types); on alexnet, whose span HTA stretches over sync events, each share within 0.05
    points; on the AMD trace within HTA's 2 us lost per event."""
    trace = load_real(name)
    row = trace.temporal_breakdown(hta_window=True).iloc[0]
    idle, compute, non_compute, span = HTA_TEMPORAL[name]
    got = [row[c] / 1e3 for c in ("idle_ns", "compute_ns", "non_compute_ns", "span_ns")]
    assert row["idle_ns"] + row["compute_ns"] + row["non_compute_ns"] == row["span_ns"]
    kernels = len(trace.kernels)
    if name.startswith("critical_path__alexnet"):
        for ours, hta in zip(got[:3], (idle, compute, non_compute), strict=True):
            assert ours / got[3] == pytest.approx(hta / span, abs=0.0005)
        assert got[1] == pytest.approx(compute, abs=kernels)
        return
    per_event = 2 if name.startswith("amd_trace") else 0
    for ours, hta in zip(got, (idle, compute, non_compute, span), strict=True):
        assert ours == pytest.approx(hta, abs=max(0.005 * hta, per_event * kernels, 1.0))


def test_the_whole_trace_breakdown_counts_both_steps(load_real):
    """Without `hta_window` the span runs to the last step's last kernel: about twice."""
    trace = load_real("trace_filter__sampled_rank-0.json.gz")
    whole = trace.temporal_breakdown().iloc[0]
    hta_span_us = HTA_TEMPORAL["trace_filter__sampled_rank-0.json.gz"][3]
    assert 1.9 < whole["span_ns"] / (1e3 * hta_span_us) < 2.2
    assert whole[["idle_share", "compute_share", "non_compute_share"]].sum() == pytest.approx(1)


def test_temporal_breakdown_of_our_recording_and_of_a_cpu_trace(repo_root, load_real):
    """Ours: collectives on their own queue are communication (non-compute); a trace with
    no device work has no rows."""
    trace = neuron_explorer.load(repo_root / "sample_traces" / "mlp_eager.pftrace")
    row = trace.temporal_breakdown().iloc[0]
    assert row["compute_ns"] > 0 and row["idle_share"] > 0.5  # host-bound: mostly idle
    assert row["compute_ns"] + row["non_compute_ns"] <= int(trace.kernels["dur"].sum())
    cpu = load_real("cpu_only__rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")
    assert cpu.temporal_breakdown().empty


# HTA 0.5.0 `get_comm_comp_overlap(visualize=False)`: comp_comm_overlap_pctg (rounded to
# 0.01): the share of the communication kernels' merged time that computation overlaps
HTA_OVERLAP_PCT = {"trace_filter__sampled_rank-0.json.gz": 11.81,
                   "trace_filter__sampled_rank-1.json.gz": 20.05}


@pytest.mark.parametrize("name", sorted(HTA_OVERLAP_PCT))
def test_comm_comp_overlap_matches_hta(load_real, name):
    trace = load_real(name)
    ours = trace.communication(hta_window=True).iloc[0]
    assert round(ours["overlap_pct"], 2) == HTA_OVERLAP_PCT[name]
    # the same figure as the kernel-type breakdown's overlap rows
    types = trace.kernel_types(hta_window=True).set_index("kernel_type")["ns"]
    both = sum(ns for label, ns in types.items()
               if "computation" in label and "communication" in label)
    assert ours["overlap_ns"] == both
    # over the analysed steps (both of the file's), another window, another figure
    assert abs(trace.communication().iloc[0]["overlap_pct"] - HTA_OVERLAP_PCT[name]) > 0.01


def test_a_trace_without_device_work_has_no_rows_in_htas_tables(load_real):
    """HTA's CPU-only test trace: nothing launched, nothing to break down (HTA's temporal
    breakdown raises on it); each table is empty with its columns."""
    trace = load_real("cpu_only__rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")
    for table in (trace.kernel_types(), trace.temporal_breakdown(), trace.launch_stats(),
                  trace.op_kernels(), trace.queue_length_summary(), trace.stream_idle(),
                  trace.communication(hta_window=True), trace.copy_bandwidth(),
                  trace.cupti_counters()):
        assert table.empty and len(table.columns)
