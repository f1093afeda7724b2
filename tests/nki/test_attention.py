"""examples/nki/attention.py against torch's scaled_dot_product_attention."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from neuron_explorer import nki

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "nki"))
import attention


def test_fused_attention_matches_sdpa():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(256, 64, generator=g) for _ in range(3))
    out = nki.simulate_kernel(attention.attention, q.numpy(), k.numpy(), v.numpy())
    ref = torch.nn.functional.scaled_dot_product_attention(q[None], k[None], v[None])[0]
    np.testing.assert_allclose(out, ref.numpy(), rtol=1e-5, atol=1e-5)


def test_the_scores_matmul_is_attributed_to_its_nl_matmul_line():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((128, 64)).astype(np.float32) for _ in range(3))
    lines = {lt.source.split("#")[0].strip(): lt
             for lt in nki.benchmark(attention.attention, q, k, v).line_times()}
    scores = lines["scores = nl.matmul(qT, kT, transpose_x=True)"]
    assert set(scores.ns) == {"tensor"} and scores.instructions == 2
