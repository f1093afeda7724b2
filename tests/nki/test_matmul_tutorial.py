"""The NKI matmul tutorial's kernels (examples/nki/matmul.py): exact numerics at small
shapes, faster in the tutorial's order, and AWS's measured times at its shape."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from neuron_explorer import nki

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "nki"))
sys.path.insert(0, str(ROOT / "tests" / "hardware"))

import matmul
from published import MEASURED

SMALL_BLOCKS = {"TILES_IN_BLOCK_M": 2, "TILES_IN_BLOCK_N": 2, "TILES_IN_BLOCK_K": 2}


class Spec:
    """A kernel argument by shape and dtype only (timing runs need no values)."""

    def __init__(self, shape, dtype="bfloat16"):
        self.shape, self.dtype = shape, dtype


def _bf16(*shape):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)))
    return x.bfloat16().float().numpy()


def test_basic_kernel_numerics():
    lhsT, rhs = _bf16(128, 64), _bf16(128, 512)
    out = nki.simulate_kernel(matmul.matmul_basic, lhsT, rhs)
    np.testing.assert_allclose(out, lhsT.T @ rhs, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("name", [*matmul.VERSIONS, "tiled_language"])
def test_every_version_computes_the_product(name):
    kernel = matmul.VERSIONS.get(name) or matmul.matmul_tiled_language
    lhsT, rhs = _bf16(256, 256), _bf16(256, 1024)
    kw = SMALL_BLOCKS if name == "fully_optimized" else {}
    out = nki.simulate_kernel(kernel, lhsT, rhs, **kw)
    np.testing.assert_allclose(out, lhsT.T @ rhs, rtol=1e-5, atol=1e-4)


def test_bf16_inputs_give_the_fp32_product_rounded_once_to_bf16():
    lhsT, rhs = _bf16(256, 128), _bf16(256, 512)
    exact = torch.from_numpy(lhsT.T @ rhs).bfloat16().float().numpy()
    out = nki.simulate_kernel(_as_bf16(matmul.matmul_tiled), lhsT, rhs)
    # one rounding of the fp32 sum: at most one bf16 ulp from the rounded host product
    np.testing.assert_allclose(out, exact, rtol=2 ** -7, atol=1e-3)
    assert np.array_equal(out, torch.from_numpy(out).bfloat16().float().numpy())


def test_shapes_only_runs_compute_nothing():
    run = nki.run(matmul.matmul_tiled, (Spec((256, 128)), Spec((256, 512))), {},
                  numerics=False)
    assert run.outputs is None and len(run.kernel) > 0


def _as_bf16(kernel):
    """The kernel called with bf16 HBM inputs (numpy has no bf16: cast in the kernel's
    arguments)."""
    import neuron_explorer.nki.language as nl

    @nki.jit
    def wrapper(lhsT, rhs):
        a = nl.ndarray(lhsT.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
        b = nl.ndarray(rhs.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
        for src, dst in ((lhsT, a), (rhs, b)):
            for k in nl.affine_range(src.shape[0] // 128):
                nl.store(dst[k * 128:(k + 1) * 128, :],
                         nl.copy(nl.load(src[k * 128:(k + 1) * 128, :]), dtype=nl.bfloat16))
        return kernel.func(a, b)
    return wrapper


@functools.cache
def _at_2048(name: str):
    """The benchmark of version `name` at [2048, 2048] x [2048, 2048] bf16 on trn1, run once
    for the two tests that read it (results are read, never changed)."""
    shape = (Spec((2048, 2048)), Spec((2048, 2048)))  # lhsT [K, M], rhs [K, N]
    return nki.benchmark(matmul.VERSIONS[name], *shape, preset="trn1")


@pytest.mark.slow  # ~7 s: four kernels of ~10-40k instructions scheduled
def test_optimised_versions_get_faster_in_the_tutorials_order():
    times = {name: _at_2048(name).duration_ns for name in matmul.VERSIONS}
    order = list(matmul.VERSIONS)
    assert [times[n] for n in order] == sorted(times.values(), reverse=True), times


PUBLISHED = {pub.kernel[1].get("version", "fully_optimized"): pub for pub in MEASURED
             if pub.kernel[0] in ("matmul_tutorial", "matmul_fully_optimized")
             and pub.hardware == "trn1"}


# 1.1 M instructions, 12-17 s each: with --full only (trn1: 54.54 ms simulated against
# 51.80 ms measured, +5.3%; trn2 fp32: -1.4%)
_TILED = pytest.param("tiled", marks=pytest.mark.full)


@pytest.mark.slow  # 5-10 s each
@pytest.mark.parametrize("name", [_TILED, "hoist_load", "block_free", "fully_optimized"])
def test_simulated_time_matches_awss_measurement(name):
    """At the tutorial's shape on trn1, within test_published.py's 25% kernel tolerance
    (measured on this language: +5.3%, +3.1%, +3.5%, -5.6%; docs/nki.md)."""
    pub = PUBLISHED[name]
    kw = pub.kernel[1]
    args = (Spec((kw["k_size"], kw["m_size"])), Spec((kw["k_size"], kw["n_size"])))
    simulated = nki.benchmark(matmul.VERSIONS[name], *args, preset=pub.hardware).duration_ns
    assert abs(simulated / pub.measured_ns - 1) <= pub.tolerance, (simulated, pub.measured_ns)


TRN2_FP32 = {pub.kernel[1]["version"]: pub for pub in MEASURED
             if pub.kernel[0] == "matmul_tutorial" and pub.hardware == "trn2"}


@pytest.mark.slow  # 10-15 s each
@pytest.mark.parametrize("name", [_TILED, "hoist_load"])
def test_the_kernel_optimisation_guides_fp32_versions_on_trn2(name):
    """The same tiled and hoisted kernels with fp32 inputs on trn2, the kernel
    optimisation guide's v2 and v3 (measured -1.4% and +0.3%)."""
    pub = TRN2_FP32[name]
    kw = pub.kernel[1]
    args = (Spec((kw["k_size"], kw["m_size"]), "float32"),
            Spec((kw["k_size"], kw["n_size"]), "float32"))
    simulated = nki.benchmark(matmul.VERSIONS[name], *args, preset="trn2").duration_ns
    assert abs(simulated / pub.measured_ns - 1) <= pub.tolerance, (simulated, pub.measured_ns)


@pytest.mark.slow  # ~3 s: two kernels of ~10-20k instructions scheduled
def test_the_profile_explains_the_speedup():
    """The tiled kernel is DMA bound with little overlap; the optimised one keeps the
    Tensor Engine busy with its DMA hidden under compute."""
    tiled = _at_2048("tiled").profile()
    best = _at_2048("fully_optimized").profile()
    assert tiled["critical_engine"] == "dma" and tiled["busy_pct"]["dma"] > 95
    assert tiled["busy_pct"]["tensor"] < 15 and best["busy_pct"]["tensor"] > 50
    assert tiled["dma_compute_overlap_pct"] < 20 and best["dma_compute_overlap_pct"] > 70
    assert best["sbuf_bytes"] > tiled["sbuf_bytes"] > 0


def test_the_recorded_versions_get_faster_in_order_and_the_report_says_why():
    """sample_traces/nki_kernels.pftrace (examples/nki/profile_kernels.py): each
    optimisation is faster, moves its data in fewer transfers at a higher rate and hides
    more of it under compute, and the report says so per kernel."""
    import neuron_explorer
    from neuron_explorer.kernel_report import kernel_summary
    from neuron_explorer.report import render_report

    trace = neuron_explorer.load(ROOT / "sample_traces" / "nki_kernels.pftrace")
    names = [f"matmul_{v}" for v in matmul.VERSIONS]
    s = [kernel_summary(trace, n) for n in names]
    durations = [x["duration_ns"] for x in s]
    assert durations == sorted(durations, reverse=True) and len(set(durations)) == 4
    transfers = [x["dma_transfers"] for x in s]
    assert transfers == sorted(transfers, reverse=True)
    overlap = [x["dma_compute_overlap_pct"] for x in s]
    assert overlap == sorted(overlap) and overlap[0] < 50 < overlap[-1]
    assert s[-1]["dma_bytes_per_s"] > 1.3 * s[0]["dma_bytes_per_s"]  # longer rows
    text = render_report(trace, "text")
    for name, summary in zip(names, s, strict=True):
        block = text.split(f"Kernel {name}: profile")[1].split("line profile")[0]
        assert f"{summary['dma_transfers']} DMA transfers" in block
        assert f"{summary['dma_compute_overlap_pct']:.0f}% of the DMA time" in block
    assert "not pipelined" in text.split("Kernel matmul_tiled: profile")[1].split(
        "line profile")[0]
