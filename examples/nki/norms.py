"""RMSNorm, LayerNorm and softmax over rows, in the style of AWS's NKI tutorials:
rows in tiles of 128 partitions (the last one masked), statistics reduced over the
free axis, the weight row broadcast over partitions by the load itself.

    python examples/nki/norms.py
"""

from __future__ import annotations

import neuron_explorer.nki.isa as nisa
import neuron_explorer.nki.language as nl
import numpy as np
from neuron_explorer import nki


@nki.jit
def rms_norm(a, g, eps=1e-6):
    """out = a / sqrt(mean(a^2) + eps) * g, for a [rows, n] and g [1, n]."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    rows, n = a.shape
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(n)[None, :]
    g_tile = nl.load(g[i_p * 0, i_f])  # one row, read by all 128 partitions
    for t in nl.affine_range((rows + 127) // 128):
        mask = t * 128 + i_p < rows
        a_tile = nl.load(a[t * 128 + i_p, i_f], mask=mask)
        mean_sq = nl.sum(nl.square(a_tile), axis=[1], keepdims=True) * (1.0 / n)
        scale = nl.rsqrt(mean_sq + eps)
        out_tile = nl.multiply(nl.multiply(a_tile, scale), g_tile)
        nl.store(out[t * 128 + i_p, i_f], value=out_tile, mask=mask)
    return out


@nki.jit
def layer_norm(a, gamma, beta, eps=1e-5):
    """out = (a - mean) / sqrt(var + eps) * gamma + beta over each row."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    rows, n = a.shape
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(n)[None, :]
    w = nl.load(gamma[i_p * 0, i_f])
    b = nl.load(beta[i_p * 0, i_f])
    for t in nl.affine_range((rows + 127) // 128):
        mask = t * 128 + i_p < rows
        x = nl.load(a[t * 128 + i_p, i_f], mask=mask)
        mean = nl.mean(x, axis=1, keepdims=True)
        centred = nisa.tensor_scalar(data=x, op0=nl.subtract, operand0=mean)
        var = nl.mean(nl.square(centred), axis=1, keepdims=True)
        inv_std = nl.rsqrt(var + eps)
        y = nisa.tensor_scalar(data=centred, op0=nl.multiply, operand0=inv_std)
        nl.store(out[t * 128 + i_p, i_f], value=y * w + b, mask=mask)
    return out


@nki.jit
def softmax(a):
    """Row softmax: exp(x - max) / sum, with the max subtracted as the activation's bias."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    rows, n = a.shape
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(n)[None, :]
    for t in nl.affine_range((rows + 127) // 128):
        mask = t * 128 + i_p < rows
        x = nl.load(a[t * 128 + i_p, i_f], mask=mask)
        neg_max = nisa.tensor_reduce(op=nl.maximum, data=x, axis=1, negate=True,
                                     keepdims=True)
        e = nisa.activation(op=nl.exp, data=x, bias=neg_max)
        inv_sum = nl.reciprocal(nl.sum(e, axis=1, keepdims=True))
        nl.store(out[t * 128 + i_p, i_f], value=nl.multiply(e, inv_sum), mask=mask)
    return out


def main() -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((300, 1000)).astype(np.float32)
    g = rng.standard_normal((1, 1000)).astype(np.float32)
    out = nki.simulate_kernel(rms_norm, a, g)
    ref = a / np.sqrt((a * a).mean(1, keepdims=True) + 1e-6) * g
    print(f"rms_norm max error {np.abs(out - ref).max():.2e}")
    print(nki.benchmark(layer_norm, a, g, g, preset="trn1").table())


if __name__ == "__main__":
    main()
