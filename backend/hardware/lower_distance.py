"""cdist through the Tensor Engine: ||x - y||^2 = ||x||^2 + ||y||^2 - 2 x . y.

The cross term is one batched GEMM [P, M] @ [M, R]; the squared norms of the rows
are Vector Engine reductions; the Vector Engine adds the norms to the GEMM's result
as it leaves PSUM and the Scalar Engine takes the square root. The exponent p is not
part of an op's key (float arguments are not), so every cdist is costed as the
Euclidean distance, its default.
"""

from __future__ import annotations

from neuron_explorer.backend.hardware.builder import KernelBuilder
from neuron_explorer.backend.hardware.gemm import Gemm, emit_gemm
from neuron_explorer.backend.hardware.specs import OpSpec, TensorSpec
from neuron_explorer.backend.hardware.streaming import act, stream, vec

_NORM_STEPS = [vec("TensorTensorReduce", 1, 2.0)]  # square and sum each row
_COMBINE_STEPS = [vec("TensorTensor", 2, 2.0), act("Activation", 1, 1.0)]  # + norms, sqrt


def _rows(t: TensorSpec) -> tuple[int, int, int]:
    """(batch, rows, features) of x [*, P, M]."""
    if len(t.shape) < 2:
        return 1, 1, t.numel
    rows, feats = t.shape[-2], t.shape[-1]
    return max(t.numel // max(rows * feats, 1), 1), rows, feats


def lower_cdist(b: KernelBuilder, spec: OpSpec) -> None:
    """_cdist_forward(x1 [*, P, M], x2 [*, R, M]) -> [*, P, R]."""
    x1, x2 = spec.inputs[0], spec.inputs[1]
    batch, p, m = _rows(x1)
    _, r, _ = _rows(x2)
    dtype = x1.dtype
    dots = emit_gemm(b, Gemm(m=p, k=m, n=r, dtype=dtype, out_dtype=dtype, batch=batch,
                             a_bytes=x1.nbytes // batch, b_bytes=x2.nbytes // batch,
                             store=False))
    # the rows are in SBUF once the GEMM has loaded them
    norms = stream(b, x1.numel + x2.numel, dtype, _NORM_STEPS, deps=dots, resident_inputs=1)
    out = spec.outputs[0] if spec.outputs else TensorSpec((batch, p, r), dtype)
    stream(b, out.numel, dtype, _COMBINE_STEPS, outputs=[out.nbytes], deps=norms + dots,
           resident_inputs=2)
