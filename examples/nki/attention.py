"""A fused attention kernel, softmax(q k^T / sqrt(d)) v, for one head: scores stay
on chip (PSUM, then SBUF), probabilities are transposed on the Tensor Engine and
multiplied by v with the result accumulating in PSUM.

q [Sq, d], k [Sk, d], v [Sk, d]; d <= 128, Sq a multiple of 128, Sk a multiple of
128 and at most 512 (one PSUM bank of scores per query tile).

    python examples/nki/attention.py
"""

from __future__ import annotations

import math

import neuron_explorer.nki.isa as nisa
import neuron_explorer.nki.language as nl
import numpy as np
from neuron_explorer import nki


@nki.jit
def attention(q, k, v):
    sq, d = q.shape
    sk = k.shape[0]
    scale = 1.0 / math.sqrt(d)
    out = nl.ndarray((sq, d), dtype=q.dtype, buffer=nl.shared_hbm)
    # k^T [d, sk] and the v tiles, loaded once for every query tile
    kT = nl.ndarray((d, sk), dtype=k.dtype, buffer=nl.sbuf)
    v_tiles = []
    for j in nl.affine_range(sk // 128):
        kT[:, j * 128:(j + 1) * 128] = nl.transpose(nl.load(k[j * 128:(j + 1) * 128, :]))
        v_tiles.append(nl.load(v[j * 128:(j + 1) * 128, :]))
    for i in nl.affine_range(sq // 128):
        qT = nl.transpose(nl.load(q[i * 128:(i + 1) * 128, :]))          # [d, 128]
        scores = nl.matmul(qT, kT, transpose_x=True)                      # PSUM [128, sk]
        neg_max = nisa.tensor_reduce(op=nl.maximum, data=scores, axis=1, negate=True,
                                     keepdims=True)
        probs = nisa.activation(op=nl.exp, data=scores, bias=neg_max * scale, scale=scale)
        inv_sum = nl.reciprocal(nl.sum(probs, axis=1, keepdims=True))
        acc = nl.zeros((128, d), nl.float32, buffer=nl.psum)
        for j in nl.affine_range(sk // 128):
            pT = nl.transpose(probs[:, j * 128:(j + 1) * 128])            # [k, q]
            acc += nl.matmul(pT, v_tiles[j], transpose_x=True)            # [q, d]
        nl.store(out[i * 128:(i + 1) * 128, :], value=nl.multiply(acc, inv_sum, dtype=q.dtype))
    return out


def main() -> None:
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((256, 64)).astype(np.float32) for _ in range(3))
    out = nki.simulate_kernel(attention, q, k, v)
    s = q @ k.T / 8.0
    p = np.exp(s - s.max(1, keepdims=True))
    ref = (p / p.sum(1, keepdims=True)) @ v
    print(f"attention max error {np.abs(out - ref).max():.2e}")
    print(nki.benchmark(attention, q, k, v).table())


if __name__ == "__main__":
    main()
