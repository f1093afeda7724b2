"""An NKI matmul kernel called in a compiled model's forward, in an inference loop:
`nki_in_compiled.py [--as-op]` (`--as-op`: called through nki.as_torch_op, a custom op
the compiled graph runs as its kernel; otherwise through nki.jit, which breaks the
graph)."""

import sys

import neuron_explorer.nki.isa as nisa
import neuron_explorer.nki.language as nl
import torch
from neuron_explorer import nki
from torch import nn


@nki.jit
def proj_kernel(lhsT, rhs):
    """result[M, N] = lhsT[K, M].T @ rhs[K, N]."""
    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    lhsT_tile = nl.ndarray((128, 128), dtype=lhsT.dtype, buffer=nl.sbuf)
    rhs_tile = nl.ndarray((128, 512), dtype=rhs.dtype, buffer=nl.sbuf)
    res_sb = nl.ndarray((128, 512), dtype=result.dtype, buffer=nl.sbuf)
    for m in nl.affine_range(M // 128):
        for n in nl.affine_range(N // 512):
            res_psum = nl.ndarray((128, 512), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // 128):
                nisa.dma_copy(dst=lhsT_tile, src=lhsT[k * 128:(k + 1) * 128,
                                                      m * 128:(m + 1) * 128])
                nisa.dma_copy(dst=rhs_tile, src=rhs[k * 128:(k + 1) * 128,
                                                    n * 512:(n + 1) * 512])
                nisa.nc_matmul(dst=res_psum, stationary=lhsT_tile, moving=rhs_tile)
            nisa.tensor_copy(dst=res_sb, src=res_psum, dtype=result.dtype)
            nisa.dma_copy(dst=result[m * 128:(m + 1) * 128, n * 512:(n + 1) * 512],
                          src=res_sb)
    return result


project = nki.as_torch_op(proj_kernel) if "--as-op" in sys.argv else proj_kernel


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(128, 256)
        self.w = nn.Parameter(torch.randn(256, 512) * 0.02)
        self.out = nn.Linear(512, 10)

    def forward(self, x):
        h = torch.relu(self.inp(x))
        y = project(h.T.contiguous(), self.w)
        return self.out(torch.relu(y))


torch.manual_seed(0)
model = torch.compile(Model().to("neuron").eval(), backend="neuron")
with torch.no_grad():
    for _ in range(6):
        pred = model(torch.randn(128, 128).to("neuron")).argmax(1)
print(pred.cpu()[:4])
