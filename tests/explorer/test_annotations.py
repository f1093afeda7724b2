"""Device time per user annotation region (`Trace.annotations`): HTA's per-name figures on
real traces, and hand-computed values on small traces in both formats."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import neuron_explorer
import pytest
import scenarios

ALEXNET = "critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz"
SAMPLED_0 = "trace_filter__sampled_rank-0.json.gz"
AMD = "amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz"

# HTA 0.5.0 `TraceAnalysis(trace_dir=...).get_gpu_user_annotation_breakdown(
# use_gpu_annotation=False, visualize=False)` (pandas 2.2.3): per user_annotation name,
# "sum (us)" and the count ("sum (us)" / "mean (us)") of its host durations; HTA's
# ProfilerStep rows (steps here, not regions) left out
HTA_HOST = {
    ALEXNET: {
        "[param|clear_cache]": (56408, 2), "[param|cuda]": (43425283, 1),
        "[param|pytorch.model.alex_net|0|0|0]": (12840436, 1),
        "[param|pytorch.model.alex_net|0|0|0|measure|forward]": (116034, 2),
        "[param|pytorch.model.alex_net|0|0|0|warmup|forward]": (25500733, 2)},
    SAMPLED_0: {
        "## DisaggregatedTowerArchAwaitable wait() ##": (1235, 1),
        "## KJTAllToAllSplitsAwaitable wait() ##": (1616, 1),
        "## KJTAllToAllTensorsAwaitable wait() ##": (1361, 1),
        "## KJTListAwaitable wait() ##": (1392, 1),
        "## KJTListSplitsAwaitable wait() ##": (1662, 1),
        "## PooledEmbeddingsAwaitable wait() ##": (1068, 1), "## Request wait() ##": (1046, 1),
        "## all2all_data:kjt splits ##": (424, 1), "## all2all_data:recat_permute_gen ##": (472, 1),
        "## all2all_data:recat_values ##": (300, 1), "## alltoall_fwd_single ##": (290, 1),
        "## backward ##": (234964, 1), "## data_load ##": (3918, 1),
        "## decoder fp8 None ##": (284, 2), "## encoder fp8 None ##": (285, 2),
        "## forward ##": (132826, 1), "## optimizer ##": (204454, 1),
        "## recmetrics_update ##": (6128, 1), "## sdd_preprocess_splits ##": (13058, 1),
        "## sdd_preprocess_tensors ##": (1820, 1), "## sdd_wait_tensors ##": (1533, 1),
        "<class '<torch_package_0>.dper3.modules.grouped_embedding._FeatureProcessorWrapper'>":
            (753, 1),
        "<class '<torch_package_0>.dper3.modules.low_level_modules.single_operators.Gather'>":
            (191, 1),
        "<class '<torch_package_0>.dper3.modules.low_level_modules.single_operators."
        "LengthsRangeFill'>": (222, 1),
        "<class '<torch_package_0>.dper3.modules.position_weighted.PositionWeighted'>": (600, 1),
        "DistributedDataParallel.forward": (132750, 1),
        "Optimizer.step#EMAOptimizer.step": (13316, 1), "Optimizer.step#Shampoo.step": (190900, 1),
        "nccl:_all_gather_base": (135, 1), "nccl:all_reduce": (218, 2),
        "nccl:all_to_all": (436, 2)},
}


@pytest.mark.parametrize("name", sorted(HTA_HOST))
def test_host_time_per_annotation_matches_hta(load_real, name):
    """Host time and count per name, over the ranges HTA keeps (begun before the last
    ProfilerStep; alexnet has none, so all). These traces hold whole us: exact."""
    ours = load_real(name).annotations(hta_window=True)
    per_name = ours.groupby("name")[["host_ns", "count"]].sum()
    got = {n: (int(row["host_ns"]) // 1000, int(row["count"])) for n, row in per_name.iterrows()}
    assert got == HTA_HOST[name]


def test_device_span_matches_htas_gpu_annotation(load_real):
    """The AMD trace holds `gpu_user_annotation` ranges. HTA 0.5.0 `get_gpu_user_annotation_
    breakdown(use_gpu_annotation=True, visualize=False)`: Optimizer.step#SGD.step 8 us
    (its range in the file: 8.483 us, from its kernel's start; HTA keeps whole us), host
    265 us (use_gpu_annotation=False; 266.215 us in the file). HTA's other row,
    ProfilerStep#1, is a step here."""
    trace = load_real(AMD)
    ours = trace.annotations(hta_window=True).set_index("name")
    assert list(ours.index) == ["Optimizer.step#SGD.step"]
    row = ours.loc["Optimizer.step#SGD.step"]
    assert row["device_span_ns"] == pytest.approx(8_000, abs=1_000)
    s = trace.table("slices")
    on_device = s[(s["category"] == "gpu_user_annotation") & (s["name"] == row.name)]
    assert row["device_span_ns"] == pytest.approx(int(on_device["dur"].iloc[0]), abs=5)
    assert row["host_ns"] == pytest.approx(265_000, abs=2_000)
    assert (row["kernels"], row["depth"], row["count"]) == (1, 0, 1)


def test_nested_regions_add_up(load_real):
    """A region's device time with its nested regions' is its own plus theirs; "## forward
    ##" launched the 183 kernels (92,167 us) of HTA's get_frequent_cuda_kernel_sequences(
    operator_name="forward", min_pattern_len=3) pattern, all in DistributedDataParallel
    .forward and the regions below it."""
    ours = load_real(SAMPLED_0).annotations(hta_window=True).set_index("path")
    for path, row in ours.iterrows():
        below = ours[(ours.index == path) | ours.index.str.startswith(path + " > ")]
        assert row["device_total_ns"] == below["device_ns"].sum(), path
        assert row["depth"] == path.count(" > ")
    forward = ours.loc["## forward ##"]
    assert (forward["device_total_ns"], forward["device_ns"]) == (92_167_000, 0)
    assert ours.loc["## forward ## > DistributedDataParallel.forward", "kernels"] == 173
    assert ours["share"].sum() < 1  # kernels outside every region are in no row


def _x(cat: str, name: str, pid: int, tid: int, ts: float, dur: float,
       **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": args}


def _launch(op: str, tid: int, ts: float, kernels: list[tuple[str, float, float]],
            corr: int) -> list[dict[str, Any]]:
    """An op on thread `tid` launching `kernels` (name, start, dur) to stream 7."""
    ev = [_x("cpu_op", op, 1, tid, ts, 9)]
    for i, (name, k_ts, k_dur) in enumerate(kernels):
        ev.append(_x("cuda_runtime", "cudaLaunchKernel", 1, tid, ts + 1 + i, 1,
                     correlation=corr + i))
        ev.append(_x("kernel", name, 0, 7, k_ts, k_dur, correlation=corr + i, device=0,
                     stream=7))
    return ev


def test_a_kernel_belongs_to_the_innermost_region_on_its_thread(tmp_path: Path):
    """Times in us. Thread 1: ProfilerStep#1 [0, 500) around "## fwd ##" [0, 100), which
    holds "inner" [0, 55) (aten::a: k_a1 [100, 110), k_a2 [110, 120)) and aten::b (k_b
    [140, 150)); aten::e (k_e [300, 310)) is in no region. Thread 2: "## bwd ##" [20, 80),
    overlapping "## fwd ##" in time, launches k_z [200, 205)."""
    events = [_x("user_annotation", "ProfilerStep#1", 1, 1, 0, 500),
              _x("user_annotation", "## fwd ##", 1, 1, 0, 100),
              _x("user_annotation", "inner", 1, 1, 0, 55),
              *_launch("aten::a", 1, 10, [("k_a1", 100, 10), ("k_a2", 110, 10)], 1),
              *_launch("aten::b", 1, 60, [("k_b", 140, 10)], 10),
              *_launch("aten::e", 1, 290, [("k_e", 300, 10)], 20),
              _x("user_annotation", "## bwd ##", 1, 2, 20, 60),
              *_launch("aten::z", 2, 30, [("k_z", 200, 5)], 30)]
    path = tmp_path / "regions.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    ours = neuron_explorer.load(path).annotations().set_index("path")
    columns = ["name", "depth", "count", "host_ns", "kernels", "device_ns", "device_total_ns",
               "device_span_ns"]
    assert ours[columns].to_dict("index") == {
        "## bwd ##": dict(zip(columns, ["## bwd ##", 0, 1, 60_000, 1, 5_000, 5_000, 5_000],
                              strict=True)),
        "## fwd ##": dict(zip(columns, ["## fwd ##", 0, 1, 100_000, 1, 10_000, 30_000, 50_000],
                              strict=True)),
        "## fwd ## > inner": dict(zip(columns, ["inner", 1, 1, 55_000, 2, 20_000, 20_000,
                                                20_000], strict=True))}
    assert ours["share"].to_dict() == pytest.approx(
        {"## bwd ##": 5 / 45, "## fwd ##": 10 / 45, "## fwd ## > inner": 20 / 45})


def test_our_recordings_annotations(tmp_path: Path):
    """Ours: `annotation` slices (neuron_explorer.annotate, record_function) around ops.
    Per 10 us step (ns from its start): "fwd" [100, 5000) holds "attn" [200, 2000) with
    aten::mm (kernel [1000, 1500)) and aten::add (kernel [2500, 2800)); aten::relu's
    kernel [7000, 7200) is in no region. HTA's window drops the last of the two steps."""
    sc = scenarios.Scenario()
    for step in (0, 1):
        t0 = sc.step(step)
        sc.b.slice(sc.host, t0 + 100, 4900, "fwd", "annotation", {"step": step})
        sc.b.slice(sc.host, t0 + 200, 1800, "attn", "annotation", {"step": step})
        sc.op(t0 + 300, 400, "aten::mm", 10 * step + 1, step, kernel=(t0 + 1000, 500))
        sc.op(t0 + 2100, 100, "aten::add", 10 * step + 2, step, kernel=(t0 + 2500, 300))
        sc.op(t0 + 6000, 100, "aten::relu", 10 * step + 3, step, kernel=(t0 + 7000, 200))
    trace = neuron_explorer.load(sc.write(tmp_path, "annotated"))
    columns = ["depth", "count", "host_ns", "kernels", "device_ns", "device_total_ns",
               "device_span_ns", "share"]
    whole = trace.annotations().set_index("path")[columns]
    assert whole.to_dict("index") == {
        "fwd": dict(zip(columns, [0, 2, 9800, 2, 600, 1600, 3600, 0.3], strict=True)),
        "fwd > attn": dict(zip(columns, [1, 2, 3600, 2, 1000, 1000, 1000, 0.5], strict=True))}
    window = trace.annotations(hta_window=True).set_index("path")
    assert window["count"].tolist() == [1, 1] and window["device_total_ns"].tolist() == [800, 500]


def test_a_range_split_at_step_ends_counts_once(tmp_path: Path):
    """Our recorder splits a range still open at a step's end into one slice per step: a
    request around each model call, whose return ends the step, leaves a piece of no
    length at the next step's start (as a recording on the modelled clock has it). Three
    requests over three 10 us steps, each from 1 us into its step to the step's end: 3
    ranges, not 5."""
    sc = scenarios.Scenario()
    for step in (0, 1, 2):
        t0 = sc.step(step)
        if step:  # the piece of the request before, split at this step's start
            sc.b.slice(sc.host, t0, 0, "request", "annotation", {"request": step - 1})
        sc.b.slice(sc.host, t0 + 1_000, 9_000, "request", "annotation", {"request": step})
    regions = neuron_explorer.load(sc.write(tmp_path, "split")).annotations()
    assert regions.set_index("path")["count"].to_dict() == {"request": 3}
