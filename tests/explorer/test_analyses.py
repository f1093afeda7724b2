"""Every analysis on the `basic` scenario, against answers worked out by hand (see
scenarios.basic for the timeline)."""

from __future__ import annotations

from pathlib import Path

import neuron_explorer
import numpy as np
import pandas as pd
import pytest
from neuron_explorer.analyses.idle import idle_summary


def _bd(t: neuron_explorer.Trace, step: int, side: str) -> dict[str, int]:
    bd = t.breakdown()
    part = bd[(bd["step"] == step) & (bd["side"] == side)]
    return dict(zip(part["category"], part["ns"], strict=True))


@pytest.mark.parametrize("step", [0, 1])
def test_breakdown(basic_trace: neuron_explorer.Trace, step: int) -> None:
    device = _bd(basic_trace, step, "device")
    # busy: mm 2000 + relu 1000 + add 200 = 3200; split by engine busy: tensor 1500,
    # vector 500 + 1000 + 200
    assert device == {"tensor": 1500, "vector": 1700, "scalar": 0, "gpsimd": 0, "dma_only": 0,
                      "idle": 6800}
    host = _bd(basic_trace, step, "host")
    assert host == {"sync": 2000, "dataloader": 1000, "compile": 0, "op_dispatch": 2000,
                    "python": 5000}
    bd = basic_trace.breakdown()
    shares = bd[(bd["step"] == step) & (bd["side"] == "host")]["share"]
    assert shares.sum() == pytest.approx(1.0)


def test_idle_reasons(basic_trace: neuron_explorer.Trace) -> None:
    gaps = basic_trace.idle_reasons()
    got = list(zip(gaps["ts"], gaps["dur"], gaps["reason"], strict=True))
    assert got == [(4500, 500, "dependency"), (6000, 3200, "sync"), (9400, 3100, "host_launch"),
                   (14500, 500, "dependency"), (16000, 3200, "sync")]
    summary = idle_summary(basic_trace).set_index("reason")
    assert summary.loc["sync", "ns"] == 6400 and summary.loc["host_launch", "gaps"] == 1
    assert summary.loc["sync", "share"] == pytest.approx(6400 / 20000)


def test_op_module_kernel_stats(basic_trace: neuron_explorer.Trace) -> None:
    ops = basic_trace.op_stats().set_index("name")
    assert ops.loc["aten::mm", ["count", "device_ns", "host_ns", "flops"]].tolist() == \
        [2, 4000, 2000, 4_000_000]
    assert ops.loc["aten::mm", "mean_device_ns"] == 2000
    assert ops.loc["aten::mm", "share_of_step"] == pytest.approx(4000 / 20000)
    assert list(ops.index) == ["aten::mm", "aten::relu", "aten::add"]
    mods = basic_trace.module_stats().set_index(["module", "phase"])
    row = mods.loc[("model.fc", "forward")]
    assert (row["count"], row["total_ns"], row["device_ns"]) == (2, 8000, 6000)
    assert row["flops"] == 2 * (2_000_000 + 1000)
    ks = basic_trace.kernel_stats().set_index("name")
    assert ks.loc["k_mm", ["count", "total_ns", "min_ns", "max_ns", "hw_flops"]].tolist() == \
        [2, 4000, 2000, 2000, 5_000_000]


def test_engine_utilisation(basic_trace: neuron_explorer.Trace) -> None:
    util = basic_trace.engine_utilisation(bin_ns=1000)
    assert set(util["engine"]) == {"tensor", "vector"}
    assert ((util["utilisation"] >= 0) & (util["utilisation"] <= 1)).all()
    busy = util.groupby("engine")["utilisation"].sum() * 1000
    assert busy["tensor"] == pytest.approx(3000) and busy["vector"] == pytest.approx(3400)
    first = util[(util["engine"] == "tensor")].iloc[0]
    assert first["ts"] == 2500 and first["utilisation"] == 1.0


def test_engine_utilisation_of_dma_queues_and_devices_is_per_engine_family(tmp_path) -> None:
    """Every DMA queue is one `dma` engine; each device's engines apart: as the frame of
    each device's and engine's instructions gives (what it was computed from before)."""
    from neuron_explorer.analyses.engine_utilisation import engine_family
    from neuron_explorer.common.intervals import Union

    path = Path(__file__).parents[2] / "sample_traces" / "nki_kernels.pftrace"
    trace = neuron_explorer.load(path, cache=False)
    ins = trace.instructions
    ins = pd.concat([ins, ins.assign(device=7, ts=ins["ts"] + 5)], ignore_index=True)
    trace.__dict__["instructions"] = ins  # a second device, shifted
    util = trace.engine_utilisation(bin_ns=10_000)
    assert "dma" in set(util["engine"]) and set(util["device"]) == {0, 7}
    lo, hi = int(ins["ts"].min()), int((ins["ts"] + ins["dur"]).max())
    starts = np.arange(lo, hi, 10_000, dtype=np.int64)
    for (device, engine), part in util.groupby(["device", "engine"], sort=False):
        mine = ins[(ins["device"] == device)
                   & (engine_family(ins["engine"]) == engine)]
        covered = Union(mine["ts"].to_numpy(), (mine["ts"] + mine["dur"]).to_numpy())
        want = covered.covered(starts, starts + 10_000) / 10_000
        np.testing.assert_allclose(part["utilisation"].to_numpy(), want)
    order = util.drop_duplicates(["device", "engine"])
    for device, engines in order.groupby("device")["engine"]:
        assert engines.tolist() == sorted(engines), device  # each device's by name


def test_engine_utilisation_from_kernels(clean_trace: neuron_explorer.Trace) -> None:
    util = clean_trace.engine_utilisation(bin_ns=100)
    busy = util.groupby("engine")["utilisation"].sum() * 100
    assert busy["tensor"] == pytest.approx(2 * 9300)
    assert busy["scalar"] == pytest.approx(2 * 3000)


def test_efficiency(basic_trace: neuron_explorer.Trace) -> None:
    eff = basic_trace.efficiency().set_index("step")
    # per step 2,002,000 model FLOPs, 2,502,000 executed, 116,000 bytes in 10 us
    assert eff.loc[0, "mfu"] == pytest.approx(2_002_000 / (1e14 * 1e-5))
    assert eff.loc[0, "hfu"] == pytest.approx(2_502_000 / (1e14 * 1e-5))
    assert eff.loc[1, "mbu"] == pytest.approx(116_000 / (1e11 * 1e-5))
    s = basic_trace.summary()
    assert s["mfu"] == pytest.approx(0.002002) and s["n_steps"] == 2
    assert s["step_time_ns"] == 10_000 and s["device_busy_share"] == pytest.approx(0.32)


def test_roofline(basic_trace: neuron_explorer.Trace) -> None:
    rf = basic_trace.roofline().set_index("name")
    mm = rf.loc["aten::mm"]
    assert mm["dtype"] == "float32" and mm["intensity"] == pytest.approx(500)
    assert mm["ridge"] == pytest.approx(250) and mm["bound"] == "compute"
    assert mm["achieved_flops_per_s"] == pytest.approx(4_000_000 / 4e-6)
    relu = rf.loc["aten::relu"]
    assert relu["ridge"] == pytest.approx(1000) and relu["bound"] == "memory"
    assert relu["attainable_flops_per_s"] == pytest.approx(0.01 * 1e11)


def test_memory(basic_trace: neuron_explorer.Trace) -> None:
    tl = basic_trace.memory_timeline()
    assert tl[["ts", "device", "in_use_bytes"]].values.tolist() == \
        [[2500, 0, 1000], [5000, 0, 3000], [9300, 0, 2500]]
    peak = basic_trace.memory_at_peak()
    assert peak["op"].tolist() == ["aten::relu", "aten::mm"]
    assert peak["bytes"].tolist() == [2000, 1000]
    assert peak["share_of_peak"].tolist() == pytest.approx([2 / 3, 1 / 3])
    assert set(peak["module"]) == {"model.fc"}


def test_compile_summary(tmp_path) -> None:
    import scenarios

    sc = scenarios.basic()
    for g, t0 in ((1, 5100), (2, 15_100)):
        sc.b.slice(sc.host, t0, 300, "dynamo", "compile", {"graph_id": g})
        sc.b.slice(sc.host, t0 + 50, 200, "neuron_compile", "compile", {"graph_id": g})
    sc.b.instant(sc.host, 10_050, "graph_break", "graph_break",
                 {"reason": "data-dependent branch", "source": "model.py:7"})
    sc.b.instant(sc.host, 10_060, "recompile", "recompile", {"reason": "shape changed"})
    t = neuron_explorer.load(sc.write(tmp_path, "compiled"))
    cs = t.compile_summary()
    assert cs["graphs"][["graph_id", "name", "dur", "spans", "step"]].values.tolist() == \
        [[1, "dynamo", 300, 2, 0], [2, "dynamo", 300, 2, 1]]
    assert cs["graph_breaks"][["reason", "source", "step"]].values.tolist() == \
        [["data-dependent branch", "model.py:7", 1]]
    assert cs["recompiles"]["reason"].tolist() == ["shape changed"]
    assert cs["totals"].iloc[0].tolist() == [600, 2, 0, 1, 1]  # time, graphs, NKI kernels...
    assert not len(cs["kernels"])
    host = t.breakdown()
    assert host[(host["side"] == "host") & (host["category"] == "compile")]["ns"].tolist() == \
        [300, 300]


def test_empty_frames_on_cpu_only_trace(load_real) -> None:
    t = load_real("cpu_only__rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")
    assert len(t.kernels) == 0 and len(t.idle_reasons()) == 0
    assert list(t.engine_utilisation().columns) == ["ts", "device", "engine", "utilisation"]
    assert len(t.memory_timeline()) == 0 and len(t.memory_at_peak()) == 0
    assert np.isnan(t.efficiency()["mfu"]).all()
    dev = t.breakdown()
    assert not len(dev[dev["side"] == "device"])  # no device: not a device idle 100%
    assert t.bottlenecks() == []
    assert t.summary()["n_kernels"] == 0
    # its 4 ops lie outside the analysed step: the report says so beside the summary's count
    from neuron_explorer.report import render_report

    assert len(t.ops) == 4 and not len(t.op_stats())
    assert "none in the analysed steps (the trace's 4 ops lie outside them)" in \
        render_report(t, "text")


FACADE = ("summary", "breakdown", "idle_reasons", "op_stats", "module_stats", "kernel_stats",
          "engine_utilisation", "efficiency", "roofline", "memory_timeline", "memory_at_peak",
          "compile_summary", "bottlenecks")


@pytest.mark.parametrize("name", [
    "amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz",
    "cpu_only__rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    "trace_filter__sampled_rank-0.json.gz",
    "mtia_trace_single_rank__mtia_rank_0.json.gz",
])
def test_facade_on_real_traces(load_real, name: str) -> None:
    """Every facade method answers on traces without engines or hardware figures."""
    t = load_real(name)
    for method in FACADE:
        assert getattr(t, method)() is not None, method
    bd = t.breakdown()
    for _, part in bd.groupby(["step", "side"]):
        assert part["share"].sum() == pytest.approx(1.0)
    s = t.summary()
    assert s["source_format"] == "kineto_json" and s["mfu"] is None
    if len(t.kernels):
        assert 0 < s["device_busy_share"] <= 1
        # the statistics are of the analysed steps: kernels launched outside them are not in
        in_steps = (t.kernels["step"].isin(t.steps["step"]) if len(t.steps)
                    else t.kernels["step"] > -2)
        assert t.kernel_stats()["count"].sum() == int(in_steps.sum()) > 0


def test_ridge_in_hardware_figures(basic_pf: neuron_explorer.Trace) -> None:
    assert basic_pf.hardware_figures["ridge"] == pytest.approx(1000)


def test_kineto_memory_and_sync(tmp_path) -> None:
    """PyTorch-profiler memory instants and a synchronize call inside a step."""
    import json

    ev = [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#7", "pid": 1, "tid": 1,
         "ts": 0, "dur": 100},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 10,
         "args": {"External id": 5}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
         "ts": 2, "dur": 5, "args": {"correlation": 9}},
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 20, "dur": 30,
         "args": {"correlation": 9, "device": 0}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "pid": 1, "tid": 1,
         "ts": 20, "dur": 30},
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 3,
         "s": "t", "args": {"Total Allocated": 4096, "Device Id": 0, "Bytes": 4096}},
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1,
         "ts": 60, "s": "t", "args": {"Total Allocated": 1024, "Device Id": 0, "Bytes": -3072}},
    ]
    path = tmp_path / "kineto.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": ev}))
    t = neuron_explorer.load(path)
    assert t.steps["step"].tolist() == [7]
    assert t.kernels[["name", "op_id", "step"]].values.tolist() == [["gemm", 5, 7]]
    assert t.ops.loc[0, "device_dur"] == 30_000
    assert t.memory_timeline()[["ts", "in_use_bytes"]].values.tolist() == \
        [[3000, 4096], [60_000, 1024]]
    sync = [f for f in t.bottlenecks() if f.rule_id == "sync_in_step"]
    assert len(sync) == 1 and sync[0].time_lost_ns == 30_000
    assert "cudaDeviceSynchronize" in sync[0].explanation


def test_set_up_before_the_first_step_is_not_its_work(tmp_path) -> None:
    """The set-up copies (the model and data moved to the device) carry step 0's number
    but run before its slice: a run that crashed in its first step counted 12.5 MB of them
    against its 12 us, MBU 387%."""
    import scenarios

    sc = scenarios.Scenario()
    sc.op(0, 1000, "aten::_to_copy", 1, 0, kernel=(1000, 50_000), nbytes=100_000_000,
          busy={"dma": 50_000}, instructions=False)  # before step 0 begins
    sc.b.slice(sc.host, 100_000, 20_000, "step 0", "step", {"step": 0})
    sc.op(100_000, 1000, "aten::mm", 2, 0, kernel=(101_000, 10_000), flops=10**9,
          nbytes=1000, busy={"tensor": 10_000}, instructions=False)
    trace = neuron_explorer.load(sc.write(tmp_path, "setup"))
    eff = trace.efficiency().set_index("step")
    assert eff.loc[0, "bytes"] == 1000 and eff.loc[0, "flops"] == 10**9
    assert eff.loc[0, "mbu"] < 1


def test_slice_names_are_the_name_column_by_slice_id(basic_pf, load_real) -> None:
    """`tables.slice_names`: the names as the column holds them (ours, a categorical over
    Arrow strings; a PyTorch-profiler trace's), by slice id, made once per trace."""
    from neuron_explorer.tables import slice_names

    for trace in (basic_pf, load_real("mtia_trace_single_rank__mtia_rank_0.json.gz")):
        names = slice_names(trace)
        column = trace.table("slices")["name"]
        ids = np.arange(len(column))
        assert len(names) == len(column)
        assert names[ids].tolist() == column.astype(object).tolist()
        assert [names[i] for i in ids[::97].tolist()] == column.astype(object).tolist()[::97]
        assert names[ids[::-3]].tolist() == column.astype(object).tolist()[::-3]
        assert slice_names(trace) is names
