"""Every example kernel called once with neuron tensors, for a recorded trace with a
line profile per kernel (sample_traces/nki_kernels.pftrace):

    neuron-explorer record --level engine -o nki.pftrace -- python examples/nki/profile_kernels.py
    neuron-explorer report nki.pftrace        # a profile and line profile per kernel
    neuron-explorer view nki.pftrace          # the Kernel page

The matmuls run at lhsT [1024, 1024] x rhs [1024, 2048] in bf16, small enough to record
quickly and large enough that the tutorial's versions keep their order.
"""

from __future__ import annotations

import sys
from pathlib import Path

import neuron_explorer
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import attention
import matmul
import norms

MATMUL_SHAPE = (1024, 1024, 2048)  # K, M, N
BLOCKS = {"TILES_IN_BLOCK_M": 4, "TILES_IN_BLOCK_N": 2, "TILES_IN_BLOCK_K": 8}


def main() -> None:
    gen = torch.Generator().manual_seed(0)

    def randn(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=gen).to(dtype).to("neuron")

    k, m, n = MATMUL_SHAPE
    lhsT, rhs = randn(k, m), randn(k, n)
    for name, kernel in matmul.VERSIONS.items():
        kernel(lhsT, rhs, **(BLOCKS if name == "fully_optimized" else {}))
    a, g = randn(512, 1024, dtype=torch.float32), randn(1, 1024, dtype=torch.float32)
    norms.rms_norm(a, g)
    norms.layer_norm(a, g, g)
    norms.softmax(a)
    q, kk, v = (randn(256, 64, dtype=torch.float32) for _ in range(3))
    attention.attention(q, kk, v)
    torch.neuron.synchronize()
    neuron_explorer.step()  # one step: the report's per-step figures cover the kernels


if __name__ == "__main__":
    main()
