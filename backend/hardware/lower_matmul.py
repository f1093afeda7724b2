"""Lowerings of matmul-like ops onto GEMMs: mm/addmm/bmm/baddbmm/matmul/linear/mv/dot,
convolutions (implicit GEMM) and scaled dot product attention (two GEMMs around a
softmax that stays in SBUF)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from neuron_explorer.backend.hardware.builder import KernelBuilder, tiles
from neuron_explorer.backend.hardware.gemm import Gemm, emit_gemm
from neuron_explorer.backend.hardware.lower_pointwise import outputs_of
from neuron_explorer.backend.hardware.specs import OpSpec, TensorSpec
from neuron_explorer.backend.hardware.streaming import act, stream, vec

MAX_ATTENTION_ITERATIONS = 64  # batch*heads iterations emitted; more are folded together


def _out_dtype(spec: OpSpec, default: str) -> str:
    outs = outputs_of(spec)
    return outs[0].dtype if spec.outputs else default


def _mat(t: TensorSpec) -> tuple[int, int]:
    """Rows and columns of the last two dims (a vector is one row)."""
    if len(t.shape) >= 2:
        return t.shape[-2], t.shape[-1]
    return 1, (t.shape[0] if t.shape else 1)


def lower_mm(b: KernelBuilder, spec: OpSpec, bias_first: bool = False) -> None:
    """mm / addmm / bmm / baddbmm / matmul: batch = leading dims of the result."""
    ins = spec.inputs[1:] if bias_first else spec.inputs
    bias = spec.inputs[0] if bias_first and spec.inputs else None
    a, w = ins[0], ins[1]
    m, k = _mat(a)
    n = w.shape[-1] if len(w.shape) >= 2 else 1  # matmul(A, v): one output column
    if len(a.shape) == 1:
        m = 1
    if len(w.shape) <= 2 and len(a.shape) > 2:  # shared weights: fold the batch into M
        m = a.numel // max(k, 1)
    batch = max(a.numel // max(m * k, 1), w.numel // max(k * n, 1), 1)
    dtype = a.dtype
    g = Gemm(m=m, k=k, n=n, dtype=dtype, out_dtype=_out_dtype(spec, dtype), batch=batch,
             a_bytes=a.nbytes // batch, b_bytes=w.nbytes // max(w.numel // max(k * n, 1), 1),
             bias_bytes=(bias.nbytes // batch if bias is not None else 0))
    emit_gemm(b, g)


def lower_addbmm(b: KernelBuilder, spec: OpSpec) -> None:
    """addbmm(input [M, N], b1 [B, M, K], b2 [B, K, N]) = input + sum over the batch of
    b1 @ b2: the batch sums away, so it is one GEMM whose contraction runs over B*K (the
    products accumulate in PSUM); its result and added input are [M, N], once."""
    bias, a, w = spec.inputs[0], spec.inputs[1], spec.inputs[2]
    m, k = _mat(a)
    n = w.shape[-1] if len(w.shape) >= 2 else 1
    batch = max(a.numel // max(m * k, 1), 1)
    emit_gemm(b, Gemm(m=m, k=batch * k, n=n, dtype=a.dtype,
                      out_dtype=_out_dtype(spec, a.dtype), a_bytes=a.nbytes,
                      b_bytes=w.nbytes, bias_bytes=bias.nbytes))


def lower_linear(b: KernelBuilder, spec: OpSpec) -> None:
    """linear(x [*, K], W [N, K], bias [N]) = x @ W^T + bias."""
    x, w = spec.inputs[0], spec.inputs[1]
    bias = spec.inputs[2] if len(spec.inputs) > 2 else None
    k = x.shape[-1] if x.shape else 1
    n = w.shape[0] if len(w.shape) == 2 else 1
    m = max(x.numel // max(k, 1), 1)
    emit_gemm(b, Gemm(m=m, k=k, n=n, dtype=x.dtype, out_dtype=_out_dtype(spec, x.dtype),
                      a_bytes=x.nbytes, b_bytes=w.nbytes,
                      bias_bytes=bias.nbytes if bias is not None else 0))


def lower_dot(b: KernelBuilder, spec: OpSpec) -> None:
    """dot/vdot: a 1 x K x 1 product (the Tensor Engine runs it, mostly idle)."""
    x = spec.inputs[0]
    k = x.numel
    emit_gemm(b, Gemm(m=1, k=k, n=1, dtype=x.dtype, out_dtype=_out_dtype(spec, x.dtype)))


def _conv_dims(inp: TensorSpec, weight: TensorSpec, out: TensorSpec | None, groups: int,
               transposed: bool = False) -> tuple[int, int, int, int]:
    """(batch=groups, M, K, N) of the implicit GEMM: M = N*out_spatial rows, K = C/g *
    kernel, N = O/g. A transposed convolution runs over the input positions instead:
    M = N*in_spatial, K = C_in/g, N = C_out/g * kernel (results scatter-add)."""
    kernel = math.prod(weight.shape[2:])
    channels = inp.shape[1] if len(inp.shape) > 1 else 1
    if transposed:
        rows = inp.numel // max(channels, 1)
        return groups, rows, max(weight.shape[0] // groups, 1), weight.shape[1] * kernel
    o = weight.shape[0]
    c_per_group = weight.shape[1] if len(weight.shape) > 1 else 1
    if out is not None and len(out.shape) >= 2:
        rows = out.numel // max(out.shape[1], 1)
    else:
        rows = inp.numel // max(channels, 1)
    return groups, rows, c_per_group * kernel, max(o // groups, 1)


def lower_convolution(b: KernelBuilder, spec: OpSpec) -> None:
    """convolution as an implicit GEMM: the input is read once from HBM and unfolded
    into K = C*kh*kw rows in SBUF by the DMA access pattern."""
    inp, weight = spec.inputs[0], spec.inputs[1]
    bias = spec.inputs[2] if len(spec.inputs) > 2 and len(spec.inputs[2].shape) == 1 else None
    groups = int(spec.attr("groups", 1) or 1)
    out = spec.outputs[0] if spec.outputs else None
    batch, m, k, n = _conv_dims(inp, weight, out, groups, bool(spec.attr("transposed")))
    emit_gemm(b, Gemm(m=m, k=k, n=n, dtype=inp.dtype, out_dtype=_out_dtype(spec, inp.dtype),
                      batch=batch, a_bytes=inp.nbytes // batch, b_bytes=weight.nbytes // batch,
                      bias_bytes=(bias.nbytes // batch if bias is not None else 0)))


def lower_convolution_backward(b: KernelBuilder, spec: OpSpec) -> None:
    """convolution_backward(grad_out, input, weight): grad_input and grad_weight GEMMs
    (each as large as the forward) and a reduction for grad_bias, per output_mask."""
    grad, inp, weight = spec.inputs[0], spec.inputs[1], spec.inputs[2]
    groups = int(spec.attr("groups", 1) or 1)
    mask = tuple(spec.attr("output_mask", (True, True, True)))
    batch, m, k, n = _conv_dims(inp, weight, grad, groups, bool(spec.attr("transposed")))
    if mask[0]:  # grad_input = grad_out (M x O) @ W (O x C*kk)
        emit_gemm(b, Gemm(m=m, k=n, n=k, dtype=grad.dtype, out_dtype=inp.dtype, batch=batch,
                          a_bytes=grad.nbytes // batch, b_bytes=weight.nbytes // batch,
                          bias_bytes=0))
    if len(mask) > 1 and mask[1]:  # grad_weight = grad_out^T (O x M) @ unfold(input)
        emit_gemm(b, Gemm(m=n, k=m, n=k, dtype=grad.dtype, out_dtype=weight.dtype,
                          batch=batch, a_bytes=grad.nbytes // batch,
                          b_bytes=inp.nbytes // batch))
    if len(mask) > 2 and mask[2]:
        stream(b, grad.numel, grad.dtype, [vec("TensorReduce", 1, 1.0)], inputs=[grad.nbytes],
               small_outputs=[weight.shape[0] * grad.itemsize])


def _attention_dims(spec: OpSpec) -> tuple[int, int, int, int, int, str]:
    """(batch*heads, L, S, E, Ev, dtype) from q [.., L, E], k [.., S, E], v [.., S, Ev]."""
    q, k, v = spec.inputs[0], spec.inputs[1], spec.inputs[2]
    lq, e = _mat(q)
    s = k.shape[-2] if len(k.shape) >= 2 else 1
    ev = v.shape[-1] if v.shape else 1
    heads = max(q.numel // max(lq * e, 1), 1)
    return heads, lq, s, e, ev, q.dtype


def lower_attention(b: KernelBuilder, spec: OpSpec) -> None:
    """SDPA forward, flash style: per (batch, head) scores = q k^T stay in PSUM/SBUF, the
    softmax runs on Vector+Scalar, then P v; only q, k, v and the output touch HBM."""
    heads, lq, s, e, ev, dtype = _attention_dims(spec)
    q, k, v = spec.inputs[0], spec.inputs[1], spec.inputs[2]
    out_dtype = _out_dtype(spec, dtype)
    masks = _load_extras(b, spec.inputs[3:])  # attention mask / bias, when given
    fold = max(1, -(-heads // MAX_ATTENTION_ITERATIONS))

    def finish(nb: int, probs: tuple[int, ...]) -> None:
        # P v contracts over S, which must sit on the partitions: transpose P first
        probs_t = b.transpose(lq * nb, s, dtype, probs)
        emit_gemm(b, Gemm(m=lq, k=s, n=ev, dtype=dtype, out_dtype=out_dtype, batch=nb,
                          a_bytes=0, b_bytes=v.nbytes // heads, load_a=False), deps=probs_t)

    # Software pipelined as a real kernel is: the Tensor Engine computes the next head's
    # scores while Vector and Scalar run this head's softmax.
    _pipeline_heads(b, heads, fold, q, k, (lq, s, e), dtype, masks, finish)
    for extra in spec.outputs[1:2]:  # logsumexp, when the op returns it
        b.dma_store(extra.nbytes, min(b.partitions, max(extra.numel, 1)))


def lower_attention_backward(b: KernelBuilder, spec: OpSpec) -> None:
    """SDPA backward (flash style): recompute scores, then dV = P^T dO, dP = dO V^T,
    dS = softmax backward, dQ = dS K, dK = dS^T Q: five GEMMs per head."""
    grad_out = spec.inputs[0]
    sub = spec.replace(inputs=spec.inputs[1:4])
    heads, lq, s, e, ev, dtype = _attention_dims(sub)
    q, k, v = spec.inputs[1], spec.inputs[2], spec.inputs[3]
    saved = _load_extras(b, spec.inputs[4:])  # output, logsumexp (and any mask)
    fold = max(1, -(-heads // MAX_ATTENTION_ITERATIONS))

    def finish(nb: int, probs: tuple[int, ...]) -> None:
        per: dict[str, Any] = {"dtype": dtype, "out_dtype": dtype, "batch": nb}
        dv = emit_gemm(b, Gemm(m=s, k=lq, n=ev, a_bytes=0, load_a=False,
                               b_bytes=grad_out.nbytes // heads, **per), deps=probs)
        dp = emit_gemm(b, Gemm(m=lq, k=ev, n=s, a_bytes=0, load_a=False,
                               b_bytes=v.nbytes // heads, store=False, evacuate=False,
                               **per), deps=probs)
        ds = stream(b, lq * s * nb, dtype, _SOFTMAX_BACKWARD_STEPS, deps=dp,
                    resident_inputs=2)
        ds_t = b.transpose(lq * nb, s, dtype, ds)  # dQ = dS K contracts over S
        emit_gemm(b, Gemm(m=lq, k=s, n=e, a_bytes=0, b_bytes=0, load_a=False, load_b=False,
                          **per), deps=ds_t)
        emit_gemm(b, Gemm(m=s, k=lq, n=e, a_bytes=0, b_bytes=0, load_a=False, load_b=False,
                          **per), deps=ds + dv)

    # Software pipelined like the forward: the next head's scores and probabilities are
    # computed while this head's gradients go through the engines.
    _pipeline_heads(b, heads, fold, q, k, (lq, s, e), dtype, saved, finish)


def _pipeline_heads(b: KernelBuilder, heads: int, fold: int, q: TensorSpec, k: TensorSpec,
                    dims: tuple[int, int, int], dtype: str, deps: tuple[int, ...],
                    finish: Callable[[int, tuple[int, ...]], None]) -> None:
    """Scores and softmax of each group of heads, with `finish` (what consumes the
    probabilities) for one group emitted after the next group's scores."""
    lq, s, e = dims
    waiting: tuple[int, tuple[int, ...]] | None = None
    for nb in tiles(heads, fold):
        scores = emit_gemm(b, Gemm(m=lq, k=e, n=s, dtype=dtype, out_dtype=dtype, batch=nb,
                                   a_bytes=q.nbytes // heads, b_bytes=k.nbytes // heads,
                                   store=False, evacuate=False))
        probs = stream(b, lq * s * nb, dtype, _SOFTMAX_STEPS, deps=scores + deps,
                       resident_inputs=1)
        if waiting is not None:
            finish(*waiting)
        waiting = (nb, probs)
    if waiting is not None:
        finish(*waiting)


def _load_extras(b: KernelBuilder, extras: tuple[TensorSpec, ...]) -> tuple[int, ...]:
    """Load the op's other tensor inputs once (masks, saved outputs, statistics)."""
    ids: tuple[int, ...] = ()
    for t in extras:
        if t.numel > 1:
            ids = ids + b.dma_load(t.nbytes, min(b.partitions, t.numel))
    return ids


def lower_transpose_copy(b: KernelBuilder, spec: OpSpec) -> None:
    """A copy into a new layout. Keeping the last dim in place is only a DMA access
    pattern; moving it needs Tensor Engine transposes between the load and the store."""
    src = spec.inputs[0]
    dims = spec.attr("dims")
    if dims is None and spec.attr("dim0") is not None:
        d0, d1 = spec.attr("dim0") % max(len(src.shape), 1), spec.attr("dim1") % max(
            len(src.shape), 1)
        dims = tuple(d1 if i == d0 else d0 if i == d1 else i for i in range(len(src.shape)))
    last = len(src.shape) - 1
    if len(src.shape) < 2 or (dims is not None and dims[-1] % len(src.shape) == last):
        b.dma_copy(src.nbytes)
        return
    cols = src.shape[-1]
    rows = max(src.numel // max(cols, 1), 1)
    pieces = max(1, min(64, -(-src.nbytes // (2 << 20))))
    for i in range(pieces):
        share = src.nbytes * (i + 1) // pieces - src.nbytes * i // pieces
        loaded = b.dma_load(share)
        done = b.transpose(max(rows // pieces, 1), cols, src.dtype, loaded)
        b.dma_store(share, deps=done)
    b.note_sbuf(min(src.nbytes, 4 << 20))


# Flash softmax on the scores: the row max on Vector, exp(x - max) with the row sum
# accumulated on Scalar; dividing by the sum happens later on the small output.
_SOFTMAX_STEPS = [vec("TensorReduce", 1, 1.0), act("Activation", 1, 3.0)]
_SOFTMAX_BACKWARD_STEPS = [vec("TensorTensorReduce", 2, 2.0), vec("TensorTensor", 2, 2.0)]
