"""Frequent kernel sequences (`Trace.kernel_sequences`): HTA's per-op patterns against HTA's
own numbers, our sliding windows on our recordings and on a hand-made trace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import neuron_explorer
import pytest

SAMPLED_0 = "trace_filter__sampled_rank-0.json.gz"
SAMPLED_1 = "trace_filter__sampled_rank-1.json.gz"

# HTA 0.5.0 `TraceAnalysis(trace_dir=...).get_frequent_cuda_kernel_sequences(
# operator_name=OP, output_dir=..., min_pattern_len=N, rank=R, visualize=False)` (pandas
# 2.2.3): its patterns, in us. Per (file, OP, N): patterns, their total count, "GPU kernel
# duration (us)" and "CPU op duration (us)" summed over them.
HTA_TOTALS = {
    (SAMPLED_0, "AddmmBackward0", 1): (36, 56, 9573, 9714),
    (SAMPLED_0, "AddmmBackward0", 2): (17, 19, 7221, 3600),
    (SAMPLED_0, "DifferentiableGraphBackward", 1): (14, 16, 5914, 8041),
    (SAMPLED_0, "DifferentiableGraphBackward", 2): (10, 11, 5256, 6386),
    (SAMPLED_0, "fbgemm::permute_2D_sparse_data", 3): (1, 1, 1222, 189),
    (SAMPLED_0, "aten::_foreach_add_", 3): (1, 1, 71, 18502),
    (SAMPLED_0, "forward", 3): (1, 1, 92167, 132826),  # "## forward ##", 183 kernels
    (SAMPLED_1, "AddmmBackward0", 1): (37, 53, 8480, 9030),
    (SAMPLED_1, "DifferentiableGraphBackward", 2): (11, 11, 4221, 6908),
    (SAMPLED_1, "CppNode<SplitLookupFunction", 3): (1, 1, 53879, 629),
}
# the same call, each pattern as (kernels in it, count, GPU us, CPU us), sorted
HTA_ROWS = {
    (SAMPLED_0, "AddmmBackward0", 2): [
        (2, 1, 24, 171), (2, 1, 29, 185), (2, 1, 40, 155), (2, 1, 45, 189), (2, 1, 77, 190),
        (2, 1, 82, 183), (2, 1, 97, 155), (2, 1, 132, 262), (2, 1, 140, 224),
        (2, 1, 264, 215), (2, 1, 278, 224), (2, 1, 295, 216), (2, 1, 445, 163),
        (2, 1, 2194, 198), (2, 1, 2631, 208), (2, 3, 48, 462), (3, 1, 400, 200)],
    (SAMPLED_0, "DifferentiableGraphBackward", 3): [
        (3, 1, 319, 1180), (4, 1, 34, 236), (4, 1, 391, 1094), (7, 1, 1540, 1282),
        (8, 1, 784, 844)],
    (SAMPLED_1, "DifferentiableGraphBackward", 3): [
        (3, 1, 296, 345), (3, 1, 300, 396), (5, 1, 42, 240), (5, 1, 109, 1188),
        (5, 1, 579, 797), (5, 1, 675, 1386), (5, 1, 1050, 1242)],
}


def _rows(frame) -> list[tuple[int, int, int, int]]:
    """Each pattern as HTA's tuple; these traces hold whole us, so the times are exact."""
    return sorted((int(r.kernels), int(r.count), int(r.total_ns) // 1000, int(r.op_ns) // 1000)
                  for r in frame.itertuples())


@pytest.mark.parametrize("key", sorted(HTA_TOTALS))
def test_op_patterns_match_hta(load_real, key):
    """Per op named like OP (the shallowest such slices), the kernels, copies and memsets
    it launched, over the kernels HTA keeps (the last ProfilerStep dropped)."""
    name, op, n = key
    ours = load_real(name).kernel_sequences(n=n, op=op, hta_window=True)
    rows = _rows(ours)
    assert (len(rows), sum(r[1] for r in rows), sum(r[2] for r in rows),
            sum(r[3] for r in rows)) == HTA_TOTALS[key]
    assert all(kernels >= n for kernels, *_ in rows)
    assert (ours["total_ns"] / ours["count"]).tolist() == ours["mean_ns"].tolist()


@pytest.mark.parametrize("key", sorted(HTA_ROWS))
def test_each_op_pattern_matches_hta(load_real, key):
    name, op, n = key
    assert _rows(load_real(name).kernel_sequences(n=n, op=op, hta_window=True)) == HTA_ROWS[key]


def test_the_most_frequent_op_pattern_is_htas(load_real):
    """HTA's first row of AddmmBackward0's patterns of two or more kernels: a GEMV pair,
    three times (`pattern` "autograd::engine::evaluate_function: AddmmBackward0|void
    gemmk1_kernel<float, 256, 5, ...|void gemvNSP_kernel<float, ...", count 3, 48 us)."""
    top = load_real(SAMPLED_0).kernel_sequences(n=2, op="AddmmBackward0",
                                                hta_window=True).iloc[0]
    assert top["op"] == "autograd::engine::evaluate_function: AddmmBackward0"
    first, second = top["sequence"].split(" | ")
    assert first.startswith("void gemmk1_kernel<float, 256, 5, false")
    assert second.startswith("void gemvNSP_kernel<float, float, float, float, 1, 32, 4")
    assert (top["count"], top["total_ns"], top["op_ns"]) == (3, 48_000, 462_000)


def test_op_patterns_over_the_whole_trace_hold_both_steps(load_real):
    """Without `hta_window` the last ProfilerStep counts too: the one permute of HTA's
    window (five kernels, 1222 us) is two, the second launching four."""
    whole = load_real(SAMPLED_0).kernel_sequences(n=3, op="fbgemm::permute_2D_sparse_data")
    assert sorted(whole["kernels"]) == [4, 5] and (whole["count"] == 1).all()
    assert whole.set_index("kernels").loc[5, "total_ns"] == 1_222_000


def test_an_op_that_launched_too_few_kernels_has_no_pattern(load_real):
    trace = load_real(SAMPLED_0)
    assert not len(trace.kernel_sequences(n=4, op="AddmmBackward0", hta_window=True))
    assert not len(trace.kernel_sequences(op="no such op"))
    with pytest.raises(ValueError, match="n=0"):
        trace.kernel_sequences(n=0)


def test_our_eager_mlp_repeats_the_optimizer_sequence_each_step(repo_root):
    """sample_traces/mlp_eager.pftrace: one host thread launches every kernel, one after
    another, to one queue, so every window of n kernels is a sequence; Adam's foreach
    kernels repeat once per step (6 steps) and lead. Its host<->device copies (kernels
    named copy_host_to_device) are no kernels to fuse: the upload at each step's start
    ends the chain of kernels, once per step."""
    from neuron_explorer.analyses.kernel_sequences import transfers

    trace = neuron_explorer.load(repo_root / "sample_traces" / "mlp_eager.pftrace")
    copies = transfers(trace, trace.kernels)
    assert copies.sum() == 19
    kernels = len(trace.kernels) - int(copies.sum())
    for n in (1, 2, 3, 4):
        assert (trace.kernel_sequences(n=n)["count"].sum()
                == kernels - (n - 1) * len(trace.steps))
    top = trace.kernel_sequences(n=3, top=3)
    assert len(top) == 3 and (top["count"] == len(trace.steps)).all()
    assert top["sequence"].iloc[0] == ("_foreach_lerp_f32_512x512 | _foreach_mul_f32_512x512"
                                       " | _foreach_addcmul_f32_512x512")
    total = int(trace.kernels["dur"].sum())
    assert top["share"].tolist() == pytest.approx((top["total_ns"] / total).tolist())
    # HTA's window drops the last step's launches
    assert trace.kernel_sequences(n=3, hta_window=True)["count"].sum() < kernels - 2


def _x(cat: str, name: str, pid: int, tid: int, ts: float, dur: float,
       **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": args}


def _kineto_block(t0: float, corr: int) -> list[dict[str, Any]]:
    """One thread's launches (times in us from t0). aten::a launches k_a1 and k_a2, then
    aten::b k_b, all on stream 7; aten::c launches k_c to stream 8 before aten::d's k_d
    (stream 7); a copy, then aten::e's k_e, end the block on stream 7."""
    ev = []
    launches = [("aten::a", 0, 50, [(1, "k_a1", 7, 100, 10), (3, "k_a2", 7, 110, 10)]),
                ("aten::b", 60, 10, [(61, "k_b", 7, 120, 10)]),
                ("aten::c", 71, 9, [(72, "k_c", 8, 130, 10)]),
                ("aten::d", 81, 9, [(82, "k_d", 7, 140, 10)]),
                ("aten::to", 91, 3, [(91, "Memcpy HtoD (Pageable -> Device)", 7, 150, 5)]),
                ("aten::e", 95, 4, [(96, "k_e", 7, 155, 10)])]
    for op, ts, dur, kernels in launches:
        ev.append(_x("cpu_op", op, 1, 1, t0 + ts, dur))
        for call_ts, kernel, stream, k_ts, k_dur in kernels:
            copy = kernel.startswith("Memcpy")
            ev.append(_x("cuda_runtime", "cudaMemcpyAsync" if copy else "cudaLaunchKernel",
                         1, 1, t0 + call_ts, 1, correlation=corr))
            ev.append(_x("gpu_memcpy" if copy else "kernel", kernel, 0, stream, t0 + k_ts,
                         k_dur, correlation=corr, device=0, stream=stream))
            corr += 1
    return ev


@pytest.fixture(scope="module")
def two_blocks(tmp_path_factory) -> neuron_explorer.Trace:
    path = Path(tmp_path_factory.mktemp("sequences")) / "blocks.json"
    events = _kineto_block(0, 1) + _kineto_block(1000, 101)
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return neuron_explorer.load(path)


@pytest.mark.parametrize("n", [1, 3])
def test_each_window_names_its_own_kernels(repo_root, load_real, n):
    """A window's sequence is its kernels' names in position order, on our eager and
    compiled recordings and on a real trace (each distinct sequence is worded once)."""
    from neuron_explorer.analyses.kernel_sequences import SEPARATOR, sequence_windows

    traces = [neuron_explorer.load(repo_root / "sample_traces" / name)
              for name in ("mlp_eager.pftrace", "gpt_compiled.pftrace")]
    for trace in [*traces, load_real(SAMPLED_0)]:
        w = sequence_windows(trace, n)
        assert len(w) and (w.groupby("window")["position"].count() == n).all()
        names = trace.table("slices")["name"].astype(str).to_numpy()
        w = w.sort_values(["window", "position"])
        worded = w.groupby("window")["id"].agg(lambda ids, names=names:
                                               SEPARATOR.join(names[ids]))
        assert (w.groupby("window")["sequence"].first() == worded).all()


@pytest.mark.parametrize(("base", "n"), [(5, 3), (1, 2), (300, 3), (70_000, 4)])
def test_distinct_rows_of_codes(base, n):
    """Rows as one number in base `base` (the last case past 63 bits: rows sorted as
    records): every distinct row once, each row's number pointing at its own."""
    import numpy as np
    from neuron_explorer.analyses.kernel_sequences import _distinct_rows

    rows = np.random.default_rng(base).integers(0, base, (1000, n))
    runs, which = _distinct_rows(rows, base)
    assert (runs[which] == rows).all()
    assert len(runs) == len(np.unique(rows, axis=0))


def test_a_sequence_breaks_at_another_queues_launch_and_at_a_copy(two_blocks):
    """k_a1 -> k_a2 (one op) -> k_b (the next launch) link; k_b -> k_d does not (k_c was
    launched between them), nor k_d -> copy -> k_e; the first block's k_e links to the
    second's k_a1 (the very next launch)."""
    pairs = two_blocks.kernel_sequences(n=2).set_index("sequence")
    assert pairs["count"].to_dict() == {"k_a1 | k_a2": 2, "k_a2 | k_b": 2, "k_e | k_a1": 1}
    assert pairs["total_ns"].to_dict() == {"k_a1 | k_a2": 40_000, "k_a2 | k_b": 40_000,
                                           "k_e | k_a1": 20_000}
    assert pairs.loc["k_a1 | k_a2", "mean_ns"] == 20_000
    # every kernel, copy and memset is in the share's whole: 2 x (6 x 10 us + 5 us)
    assert pairs.loc["k_a1 | k_a2", "share"] == pytest.approx(40 / 130)
    triples = two_blocks.kernel_sequences(n=3)
    assert triples[["sequence", "count"]].values.tolist() == [["k_a1 | k_a2 | k_b", 2],
                                                             ["k_e | k_a1 | k_a2", 1]]
    singles = two_blocks.kernel_sequences(n=1).set_index("sequence")["count"]
    assert "Memcpy HtoD (Pageable -> Device)" not in singles and singles.sum() == 12
    assert len(two_blocks.kernel_sequences(n=2, top=1)) == 1


def test_op_patterns_take_every_launch_of_the_op(two_blocks):
    """HTA's definition on the same trace: aten::a's two kernels twice; with n=1 the copy
    is aten::to's pattern, as HTA counts copies."""
    pairs = two_blocks.kernel_sequences(n=2, op="aten::a")
    assert pairs[["op", "sequence", "kernels", "count", "total_ns", "op_ns"]].values.tolist() \
        == [["aten::a", "k_a1 | k_a2", 2, 2, 40_000, 100_000]]
    singles = two_blocks.kernel_sequences(n=1, op="aten::").set_index("op")
    assert singles.loc["aten::to", "sequence"] == "Memcpy HtoD (Pageable -> Device)"
    assert singles["count"].sum() == 12  # a, b, c, d, to, e in each block


def test_compiled_fusion_of_our_sequences(repo_root, load_real):
    """On our device, an occurrence's ops compiled into one program (as `whatif --mode
    compiled` builds a graph): the GPT's matmul chains lose the fixed cost of each kernel
    and overlap one op's loads with the compute before it; Adam's memory-bound foreach
    kernels, whose values still go through HBM, gain nothing. A PyTorch-profiler trace
    and a compiled run's graph launches hold no op keys to compile: NaN."""
    gpt = neuron_explorer.load(repo_root / "sample_traces" / "gpt_eager.pftrace")
    rows = gpt.kernel_sequences(3, top=8, compiled=True)
    assert list(rows.columns) == ["sequence", "count", "total_ns", "mean_ns", "share",
                                  "compiled_ns"]
    assert rows["compiled_ns"].notna().all() and (rows["compiled_ns"] > 0).all()
    matmuls = rows[rows["sequence"].str.contains("mm_f32")]
    assert len(matmuls) and (matmuls["compiled_ns"] < 0.9 * matmuls["mean_ns"]).all()
    mlp = neuron_explorer.load(repo_root / "sample_traces" / "mlp_eager.pftrace")
    foreach = mlp.kernel_sequences(3, top=1, compiled=True).iloc[0]
    assert "_foreach_" in foreach["sequence"]
    assert foreach["compiled_ns"] == pytest.approx(foreach["mean_ns"], rel=0.05)
    for trace in (load_real(SAMPLED_0),
                  neuron_explorer.load(repo_root / "sample_traces" / "gpt_compiled.pftrace")):
        assert trace.kernel_sequences(3, top=3, compiled=True)["compiled_ns"].isna().all()
    assert "compiled_ns" not in gpt.kernel_sequences(3, top=3).columns


def test_a_run_of_one_kernel_counts_each_kernel_once_in_its_time(tmp_path):
    """Six launches of one kernel are four windows of three; their row's time is the six
    kernels' (a recording's 64 launches a step once made a row 228% of the device time)."""
    ev = [_x("cpu_op", "aten::loop", 1, 1, 0, 100)]
    for i in range(6):
        ev.append(_x("cuda_runtime", "cudaLaunchKernel", 1, 1, 1 + i, 1, correlation=i + 1))
        ev.append(_x("kernel", "k_x", 0, 7, 100 + 10 * i, 10, correlation=i + 1, device=0,
                     stream=7))
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": ev}))
    row = neuron_explorer.load(path).kernel_sequences(n=3).iloc[0]
    assert (row["sequence"], row["count"]) == ("k_x | k_x | k_x", 4)
    assert row["total_ns"] == 60_000 and row["mean_ns"] == 30_000
    assert row["share"] == pytest.approx(1.0)
