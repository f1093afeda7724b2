"""Figures Holistic Trace Analysis computes, against HTA's own numbers on the same files.

The expected values were computed with HolisticTraceAnalysis 0.5.0 (`TraceAnalysis(
trace_dir=...).get_gpu_kernel_breakdown(visualize=False, include_memory_kernels=True)`,
its `sum` column, in us) on the real traces in tests/data/real_traces; HTA itself is not a
dependency of this project. docs/explorer.md says where our definitions differ.
"""

from __future__ import annotations

import pytest

# kernel type -> HTA's time in us
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
