"""Our critical path against Holistic Trace Analysis's `critical_path_analysis`, on HTA's
own critical-path test traces.

Data: tests/data/hta_critical_path/<name>.json.gz are HTA's files (MIT License, Copyright
(c) Meta Platforms, Inc. and affiliates; https://github.com/facebookresearch/
HolisticTraceAnalysis), byte for byte:
    simple_add.json.gz
        tests/data/critical_path/simple_add/benchmark_result_493459_1694039959_trace.json.gz
        (also HTA's end_to_end/simple_add/input/trace.json.gz: same bytes)
    alexnet.json.gz
        tests/data/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz
    cuda_event_sync.json.gz
        tests/data/critical_path/cuda_event_sync/event_sync_trace.json.gz
    cuda_event_sync_multi_stream.json.gz
        tests/data/critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz

Expected figures: HTA 0.5.0, `TraceAnalysis(trace_dir=...).critical_path_analysis(rank=0,
annotation=..., instance_id=...)` with the annotation and instance of HTA's own test for
that trace (tests/test_critical_path_analysis.py), run with pandas 2.2.3 / numpy 1.26.4 /
networkx 3.6.1 (HTA 0.5.0 fails on pandas 3), CRITICAL_PATH_ADD_ZERO_WEIGHT_LAUNCH_EDGE
unset (setting it to 1, as HTA's tests do, gives the same figures). HTA is not imported
here. All times in µs; every ts and dur in these traces is a whole µs, so our ns figures
are exact multiples of 1000 and no tolerance is needed for rounding.

The window: HTA clips the trace to one annotation instance; our critical path is per
ProfilerStep#N. simple_add and alexnet have no ProfilerStep, and cuda_event_sync_multi_stream
has no annotation at all (HTA's test passes annotation ""), so the test writes a copy of the
trace with a `ProfilerStep#<n>` user annotation over exactly HTA's window.

What HTA does not weigh (so it is left out before comparing totals): the host's time between
consecutive top-level ops (zero-weight DEPENDENCY edges; our `python`), waits on the device
(zero-weight SYNC_DEPENDENCY edges, and the span of the calls in CPGraph.BLOCKING_SYNC_CALLS;
our `sync`), and the window's time before the path's first node and after its last.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import neuron_explorer
import pandas as pd
import pytest

MEASURE = "[param|pytorch.model.alex_net|0|0|0|measure|forward]"
HOST = ("python", "op_dispatch", "dataloader", "compile")
DEVICE = ("kernel", "collective", "collective_wait")

# HTA's figures. window: absolute µs [lo, hi) of HTA's clip (critical_path_analysis():
# the annotation instance's span, or for annotation "" min(ts)..max(ts + dur) over the
# events HTA keeps). total: sum of the weights of the edges on HTA's path
# (get_critical_path_breakdown().duration.sum()). bound_by: the same by HTA's `bound_by`.
HTA = {
    # annotation MEASURE, instance_id=1 (test_critical_path_basic_add)
    "simple_add": {
        "step": 1, "window": (1694040009854190, 1694040010097541), "total": 241724,
        "bound_by": {"cpu_bound": 241190, "gpu_compute_bound": 508,
                  "gpu_kernel_kernel_overhead": 9, "gpu_kernel_launch_overhead": 17}},
    # annotation MEASURE, instance_id=1 (test_critical_path_inter_stream_sync)
    "alexnet": {
        "step": 1, "window": (1695835585827782, 1695835585864138), "total": 35834,
        "bound_by": {"cpu_bound": 32042, "gpu_compute_bound": 3712,
                  "gpu_kernel_kernel_overhead": 50, "gpu_kernel_launch_overhead": 30}},
    # annotation "ProfilerStep", instance_id=0 (test_critical_path_analysis_event_sync):
    # the trace's own ProfilerStep#100
    "cuda_event_sync": {
        "step": 100, "window": (1707417525509335, 1707417525512489), "total": 2401,
        "bound_by": {"cpu_bound": 2335, "gpu_compute_bound": 38,
                  "gpu_kernel_launch_overhead": 28}},
    # annotation "", instance_id=None (test_critical_path_analysis_event_sync_multistream)
    "cuda_event_sync_multi_stream": {
        "step": 0, "window": (1712867402348256, 1712867402368186), "total": 1178,
        "bound_by": {"cpu_bound": 1025, "gpu_compute_bound": 124,
                  "gpu_kernel_kernel_overhead": 15, "gpu_kernel_launch_overhead": 14}},
}

# The device events (kernels, memcpy, memset) whose span is an edge on HTA's path:
# (name prefix, start in µs after the window's start).
HTA_KERNELS = {
    "simple_add": [
        ("Memset (Device)", 242582), ("ampere_sgemm_32x32_sliced1x4_tn", 242173),
        ("ampere_sgemm_32x32_sliced1x4_tn", 242587),
        ("void at::native::vectorized_elementwise_kernel<4", 242575),
        ("void epilogue::impl::globalKernel<float, float, ", 242566),
        ("void epilogue::impl::globalKernel<float, float, ", 242686)],
    "alexnet": [
        ("Memset (Device)", 35966), ("ampere_gcgemm_64x64_nt", 32380),
        ("ampere_sgemm_32x32_sliced1x4_tn", 34719), ("ampere_sgemm_32x32_sliced1x4_tn", 35556),
        ("ampere_sgemm_32x32_sliced1x4_tn", 35971),
        ("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf", 33263),
        ("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf", 33715),
        ("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf", 34202),
        ("void at::native::(anonymous namespace)::adaptive", 34570),
        ("void at::native::(anonymous namespace)::fused_dr", 34708),
        ("void at::native::(anonymous namespace)::fused_dr", 35548),
        ("void at::native::(anonymous namespace)::max_pool", 33098),
        ("void at::native::(anonymous namespace)::max_pool", 34532),
        ("void at::native::elementwise_kernel<128, 2, at::", 32852),
        ("void at::native::elementwise_kernel<128, 2, at::", 33525),
        ("void at::native::elementwise_kernel<128, 2, at::", 34101),
        ("void at::native::elementwise_kernel<128, 2, at::", 34470),
        ("void at::native::vectorized_elementwise_kernel<4", 32990),
        ("void at::native::vectorized_elementwise_kernel<4", 33594),
        ("void at::native::vectorized_elementwise_kernel<4", 34147),
        ("void at::native::vectorized_elementwise_kernel<4", 34516),
        ("void at::native::vectorized_elementwise_kernel<4", 35542),
        ("void at::native::vectorized_elementwise_kernel<4", 35959),
        ("void cudnn::ops::nchwToNhwcKernel<float, float, ", 33222),
        ("void cudnn::ops::nchwToNhwcKernel<float, float, ", 33251),
        ("void cudnn::ops::nchwToNhwcKernel<float, float, ", 33646),
        ("void cudnn::ops::nchwToNhwcKernel<float, float, ", 33701),
        ("void cudnn::ops::nchwToNhwcKernel<float, float, ", 34164),
        ("void cudnn::ops::nchwToNhwcKernel<float, float, ", 34191),
        ("void epilogue::impl::globalKernel<float, float, ", 35532),
        ("void epilogue::impl::globalKernel<float, float, ", 35950),
        ("void epilogue::impl::globalKernel<float, float, ", 36070),
        ("void fft2d_c2r_32x32<float, false, false, 0u, fa", 32705),
        ("void fft2d_r2c_32x32<float, false, 0u, false>(fl", 32312)],
    "cuda_event_sync": [
        ("Memcpy DtoH (Device -> Pageable)", 2935),
        ("at::cuda::(anonymous namespace)::spin_kernel(lon", 3037)],
    "cuda_event_sync_multi_stream": [
        ("Memset (Device)", 19778), ("ampere_sgemm_128x64_nn", 19794)],
}

# Our path less `python` and `sync` (what HTA does not weigh) minus HTA's total: never
# negative, and at most this many µs, each explained by a modelling difference seen on the
# trace (measured: simple_add 126, alexnet 1, cuda_event_sync 13, multi_stream 16).
TOTAL_SLACK = {
    # 110 µs where our path follows the device (an op outlasting its own kernel counts as
    # waiting on it) while HTA's crosses a zero-weight DEPENDENCY edge between two ops;
    # 15 µs of op after HTA's last node; 1 µs of kernel gap HTA spans with a sync edge.
    "simple_add": 140,
    # 1 µs between a kernel's end and the next on another stream, spanned by HTA's
    # zero-weight SYNC_DEPENDENCY edge, our `dependency`.
    "alexnet": 5,
    # 10 µs of aten::_local_scalar_dense after its memcpy ended and before
    # cudaStreamSynchronize returned (HTA's SYNC_DEPENDENCY edge goes to the call's end),
    # 3 µs of cudaEventQuery (a BLOCKING_SYNC_CALLS entry: HTA zeroes its span); both our
    # op_dispatch.
    "cuda_event_sync": 20,
    # 16 µs of cudaEventQuery, zeroed by HTA as above, our op_dispatch.
    "cuda_event_sync_multi_stream": 20,
}

# Our kernel time on the path minus HTA's gpu_compute_bound, where the two paths take the
# same device stretches: the only extra device time on ours is tiny kernels whose op
# returned after they ended (our blocking-op rule sends the path through them; HTA counts
# the op's cudaLaunchKernel as cpu_bound instead). Measured: alexnet 4 (one 4 µs
# cask_cudnn::computeOffsetsKernel), cuda_event_sync 2 (two 1 µs elementwise kernels),
# multi_stream 2 (two 1 µs memsets). simple_add is left out: there the rule puts seven
# stretches (1830 µs more) on our path, a known difference, not a tolerance.
DEVICE_SLACK = {"alexnet": 5, "cuda_event_sync": 3, "cuda_event_sync_multi_stream": 3}


def _with_step(src: Path, dst: Path, lo_us: int, hi_us: int, step: int) -> Path:
    """A copy of `src` with a ProfilerStep#step user annotation over [lo, hi) µs on the
    thread of the trace's first cpu_op (the main thread)."""
    with gzip.open(src, "rt") as f:
        doc = json.load(f)
    ops = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    main = min(ops, key=lambda e: e["ts"])
    doc["traceEvents"].append({"ph": "X", "cat": "user_annotation",
                               "name": f"ProfilerStep#{step}", "pid": main["pid"],
                               "tid": main["tid"], "ts": lo_us, "dur": hi_us - lo_us,
                               "args": {}})
    with gzip.open(dst, "wt") as f:
        json.dump(doc, f)
    return dst


@pytest.fixture(scope="module")
def paths(repo_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, pd.DataFrame]:
    """Our critical path over HTA's window, per trace (the step as in HTA)."""
    data = repo_root / "tests" / "data" / "hta_critical_path"
    tmp = tmp_path_factory.mktemp("hta_cp")
    out = {}
    for name, h in HTA.items():
        src = data / f"{name}.json.gz"
        lo, hi = h["window"]
        if name == "cuda_event_sync":  # its own ProfilerStep#100 is HTA's window
            path = src
        else:
            path = _with_step(src, tmp / src.name, lo, hi, h["step"])
        out[name] = neuron_explorer.load(path).critical_path(step=h["step"])
    return out


def _us(cp: pd.DataFrame, categories: tuple[str, ...] | None = None) -> float:
    rows = cp if categories is None else cp[cp["category"].isin(categories)]
    return float(rows["dur"].sum()) / 1000


@pytest.mark.parametrize("name", list(HTA))
def test_path_covers_htas_window(paths, name):
    """Ours spans the whole window (HTA's path: window less what it does not weigh)."""
    cp = paths[name]
    lo, hi = HTA[name]["window"]
    assert int(cp["ts"].min()) == lo * 1000
    assert int((cp["ts"] + cp["dur"]).max()) == hi * 1000
    assert _us(cp) == hi - lo
    assert _us(cp) >= HTA[name]["total"]


@pytest.mark.parametrize("name", list(HTA))
def test_total_without_host_gaps_and_waits_is_htas(paths, name):
    cp = paths[name]
    comparable = _us(cp) - _us(cp, ("python", "sync"))
    assert 0 <= comparable - HTA[name]["total"] <= TOTAL_SLACK[name]


@pytest.mark.parametrize("name", list(HTA))
def test_htas_device_events_are_on_our_path(paths, name):
    """Every kernel/copy/memset on HTA's path is on ours, at the same start (whole µs)."""
    cp = paths[name]
    lo = HTA[name]["window"][0]
    dev = cp[cp["category"].isin(DEVICE)]
    ours = list(zip(dev["name"], (dev["ts"] // 1000 - lo).astype(int), strict=True))
    for prefix, start in HTA_KERNELS[name]:
        assert any(n.startswith(prefix) and s == start for n, s in ours), (prefix, start)


@pytest.mark.parametrize("name", list(DEVICE_SLACK))
def test_device_time_is_htas(paths, name):
    extra = _us(paths[name], ("kernel",)) - HTA[name]["bound_by"]["gpu_compute_bound"]
    assert 0 <= extra <= DEVICE_SLACK[name]


def test_alexnet_host_share_is_htas(paths):
    """The one window where the host's gaps are small (499 of 36356 µs): our host-work share
    of the whole path is HTA's cpu_bound share (89.42 %; ours 89.38 %). 0.5 points: HTA's
    path is 522 µs shorter (its unweighted gaps and waits), which moves a share by at most
    522 / 35834 = 1.5 points in the worst case, and here the gaps are host time on both
    sides, so the two shares differ by 0.04 points."""
    cp = paths["alexnet"]
    hta = HTA["alexnet"]["bound_by"]["cpu_bound"] / HTA["alexnet"]["total"]
    assert _us(cp, HOST) / _us(cp) == pytest.approx(hta, abs=0.005)


# HTA's whole-trace window of simple_add (annotation "", instance_id=0: HTA's
# EndToEndTestCase, whose input is this file): [param|cuda]'s start to the last event's end.
SIMPLE_ADD_WHOLE = (1694039968955744, 1694040010535645)


def test_an_idle_device_is_no_kernel_gap(repo_root, tmp_path):
    """Over the whole simple_add trace HTA's path has 11,897 µs of
    gpu_kernel_kernel_overhead, 11,865 of them one edge: from a vectorized_elementwise
    kernel's end to a `Memset (Device)` launched by cudaMemsetAsync 11.8 ms later. HTA
    takes a kernel-kernel edge, not a launch edge, because when the memset started the
    next kernel was already queued (its queue length was 1, the launch edge needs 0), and
    so keeps the idle device on its path. We walk from the memset to its launch and stay on
    the host: our device gaps (`dependency`) over the same window are the few µs between
    back-to-back kernels (48 µs)."""
    lo, hi = SIMPLE_ADD_WHOLE
    src = repo_root / "tests" / "data" / "hta_critical_path" / "simple_add.json.gz"
    cp = neuron_explorer.load(_with_step(src, tmp_path / "whole.json.gz", lo, hi, 0)) \
        .critical_path(step=0)
    assert _us(cp) == hi - lo
    assert _us(cp, ("dependency",)) < 100  # HTA: 11897


def test_a_long_launch_call_is_the_hosts_work(repo_root, tmp_path):
    """The first cuDNN convolution of simple_add holds one cudaLaunchKernel of 4.2 s (the
    library's set-up), and its kernel starts when the call returns. That time is the
    host's, inside the runtime call (HTA: cpu_bound), not launch latency: only the time
    from the call's return to the kernel's start is `launch`."""
    lo, hi = SIMPLE_ADD_WHOLE
    src = repo_root / "tests" / "data" / "hta_critical_path" / "simple_add.json.gz"
    cp = neuron_explorer.load(_with_step(src, tmp_path / "whole.json.gz", lo, hi, 0)) \
        .critical_path(step=0)
    assert _us(cp, ("launch",)) < 1_000  # it was 4,219,264 µs counted from the call's start
    assert _us(cp, ("op_dispatch",)) > 4_219_000
