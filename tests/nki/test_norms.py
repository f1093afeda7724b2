"""examples/nki/norms.py: RMSNorm, LayerNorm and softmax against torch, with a row
count that is not a multiple of 128 (masked last tile)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from neuron_explorer import nki

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "nki"))
import norms

rng = np.random.default_rng(1)
A = rng.standard_normal((300, 192)).astype(np.float32)
W = rng.standard_normal((1, 192)).astype(np.float32)
B = rng.standard_normal((1, 192)).astype(np.float32)


def test_rms_norm():
    out = nki.simulate_kernel(norms.rms_norm, A, W)
    x = torch.from_numpy(A)
    ref = x * torch.rsqrt(x.square().mean(1, keepdim=True) + 1e-6) * torch.from_numpy(W)
    np.testing.assert_allclose(out, ref.numpy(), rtol=1e-5, atol=1e-5)


def test_layer_norm():
    out = nki.simulate_kernel(norms.layer_norm, A, W, B)
    ref = torch.nn.functional.layer_norm(torch.from_numpy(A), (192,), torch.from_numpy(W[0]),
                                         torch.from_numpy(B[0]), eps=1e-5)
    np.testing.assert_allclose(out, ref.numpy(), rtol=1e-4, atol=1e-5)


def test_softmax():
    out = nki.simulate_kernel(norms.softmax, A)
    np.testing.assert_allclose(out, torch.softmax(torch.from_numpy(A), 1).numpy(),
                               rtol=1e-5, atol=1e-7)


def test_row_tiles_overlap_loads_with_compute():
    """affine_range tiles are independent: every tile's load is issued before the first
    tile's store, and the kernel takes well under three times one tile's time."""
    one = nki.benchmark(norms.layer_norm, A[:128], W, B).duration_ns
    bench = nki.benchmark(norms.layer_norm, A, W, B)
    rows = bench.schedule()
    line = next(lt.location for lt in bench.line_times() if "x = nl.load(a[" in lt.source)
    load_starts = [r["start_ns"] for r in rows if r["source"] == line]
    first_store = min(r["start_ns"] for r in rows if r["opcode"] == "DmaStore")
    assert len(load_starts) > 3 and max(load_starts) < first_store
    assert bench.duration_ns < 2 * one
