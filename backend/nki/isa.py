"""`neuron_explorer.nki.isa` (`nisa`): one call, one engine instruction.

Each call takes its destination as `dst=` (NKI's current API) or, when `dst` is
omitted, returns a new tile (the earlier API). Names and operands follow AWS's NKI
documentation (nki.isa).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from neuron_explorer.common.trace_format import ENGINES
from neuron_explorer.nki import dtypes, ops
from neuron_explorer.nki.errors import NkiError
from neuron_explorer.nki.language import Op, add
from neuron_explorer.nki.tensor import PSUM, SBUF, Tensor
from neuron_explorer.nki.trace import current, where

tensor_engine, vector_engine, scalar_engine, gpsimd_engine = ENGINES


def _dst(dst, shape, dtype, buffer: str, at: str):
    if dst is None:
        return Tensor(shape, dtype, buffer, at=at).view()
    return ops.view_of(dst, at)


def _result(dst, view):
    return view.tensor if dst is None else None


def _np(op, at: str):
    if isinstance(op, Op):
        return op.np
    if callable(op):
        return op
    raise NkiError(f"unsupported op {op!r}: pass an nl operator such as nl.add", at)


def nc_matmul(dst=None, stationary=None, moving=None, *args, **kwargs):
    """dst[M, N] (PSUM) += stationary[K, M].T @ moving[K, N]. Also nc_matmul(stationary,
    moving) returning a new PSUM tile (the earlier API)."""
    trace = current("nisa.nc_matmul")
    at = where()
    if moving is None and stationary is not None and dst is not None:
        dst, stationary, moving = None, dst, stationary  # nc_matmul(stationary, moving)
    s, m = ops.view_of(stationary, at), ops.view_of(moving, at)
    out = _dst(dst, (s.shape[1], m.shape[1]), dtypes.float32, PSUM, at)
    ops.matmul(out, s, m, at, accumulate=None if dst is not None else False)
    ops.finish(trace)
    return _result(dst, out)


def nc_transpose(dst=None, data=None, engine=tensor_engine):
    """[P, F] -> [F, P] on the Tensor Engine (into PSUM)."""
    trace = current("nisa.nc_transpose")
    at = where()
    if data is None:
        dst, data = None, dst
    out = ops.transpose_to_psum(ops.view_of(data, at), at)
    if dst is not None:
        d = ops.view_of(dst, at)
        ops.engine_op("vector", "TensorCopy", d, (out.view(),), lambda a: a, at)
    ops.finish(trace)
    return out if dst is None else None


def activation(dst=None, op=None, data=None, bias=None, scale=1.0, dtype=None, **kwargs):
    """dst = op(data * scale + bias) on the Scalar Engine; bias is a [P, 1] tile."""
    trace = current("nisa.activation")
    at = where()
    if data is None:
        raise NkiError("nisa.activation needs data=", at)
    v = ops.view_of(data, at)
    fn = _np(op, at)
    inputs = [v]
    scale_tile = None
    if bias is not None:
        inputs.append(ops.view_of(bias, at))
    if isinstance(scale, (Tensor, ops.View)):
        scale_tile = ops.view_of(scale, at)
        inputs.append(scale_tile)
    out = _dst(dst, v.shape, dtype or v.dtype, SBUF, at)

    def compute(x, *rest):
        pending = list(rest)
        b = pending.pop(0) if bias is not None else 0.0
        s = pending.pop(0) if scale_tile is not None else np.float32(scale)
        return fn(x * s + b)

    ops.engine_op("scalar", "Activation", out, inputs, compute, at, free=v.free)
    ops.finish(trace)
    return _result(dst, out)


def tensor_tensor(dst=None, data1=None, data2=None, op=None, dtype=None, **kwargs):
    trace = current("nisa.tensor_tensor")
    at = where()
    a, b = ops.view_of(data1, at), ops.view_of(data2, at)
    shape = ops.broadcast_shape(a.shape, b.shape, "nisa.tensor_tensor", at)
    out = _dst(dst, shape, dtype or ops.result_dtype(a.dtype, b.dtype), SBUF, at)
    ops.engine_op("vector", "TensorTensor", out, (a, b), _np(op or add, at), at)
    ops.finish(trace)
    return _result(dst, out)


def tensor_scalar(dst=None, data=None, op0=None, operand0=None, reverse0: bool = False,
                  op1=None, operand1=None, reverse1: bool = False, dtype=None, **kwargs):
    """dst = (data op0 operand0) op1 operand1; operands are scalars or [P, 1] tiles."""
    trace = current("nisa.tensor_scalar")
    at = where()
    v = ops.view_of(data, at)
    steps = [(op0, operand0, reverse0)] + ([(op1, operand1, reverse1)] if op1 else [])
    inputs = [v]
    for _op, operand, _rev in steps:
        if isinstance(operand, (Tensor, ops.View)):
            inputs.append(ops.view_of(operand, at))
    out = _dst(dst, v.shape, dtype or v.dtype, SBUF, at)

    def compute(x, *tiles):
        pending = list(tiles)
        for op, operand, rev in steps:
            val = pending.pop(0) if isinstance(operand, (Tensor, ops.View)) else np.float32(operand)
            fn = _np(op, at)
            x = fn(val, x) if rev else fn(x, val)
        return x

    ops.engine_op("vector", "TensorScalar", out, inputs, compute, at, free=v.free)
    ops.finish(trace)
    return _result(dst, out)


def tensor_reduce(dst=None, op=None, data=None, axis=1, negate: bool = False,
                  keepdims: bool = False, dtype=None, **kwargs):
    trace = current("nisa.tensor_reduce")
    at = where()
    v = ops.view_of(data, at)
    axes = tuple(a % len(v.shape) for a in (axis if isinstance(axis, (tuple, list))
                                            else (axis,)))
    if 0 in axes:
        raise NkiError("nisa.tensor_reduce reduces free dimensions only (axis 0 is the "
                       "partition dimension)", at)
    reducers: dict[str, Callable[..., Any]] = {"add": np.sum, "maximum": np.max,
                                               "minimum": np.min, "multiply": np.prod}
    reducer = reducers.get(getattr(op, "name", ""))
    if reducer is None:
        raise NkiError(f"nisa.tensor_reduce supports nl.add, nl.maximum, nl.minimum, "
                       f"nl.multiply, not {op!r}", at)
    shape = tuple(1 if i in axes else d for i, d in enumerate(v.shape)
                  if keepdims or i not in axes)
    out = _dst(dst, shape, dtype or v.dtype, SBUF, at)
    sign = -1 if negate else 1
    ops.engine_op("vector", "TensorReduce", out, (v,),
                  lambda x: sign * reducer(x, axis=axes, keepdims=keepdims), at, free=v.free)
    ops.finish(trace)
    return _result(dst, out)


def tensor_copy(dst=None, src=None, dtype=None, engine=vector_engine, **kwargs):
    trace = current("nisa.tensor_copy")
    at = where()
    if src is None:
        dst, src = None, dst
    s = ops.view_of(src, at)
    out = _dst(dst, s.shape, dtype or s.dtype, SBUF, at)
    ops._same_shape(out.shape, s.shape, "nisa.tensor_copy", at)
    eng = engine if engine in ops.ENGINE_ISSUERS else "vector"
    ops.engine_op(eng, "TensorCopy", out, (s,), lambda a: a, at)
    ops.finish(trace)
    return _result(dst, out)


def dma_copy(dst=None, src=None, mask=None, **kwargs) -> None:
    """One DMA transfer between HBM and SBUF (or HBM to HBM); no dtype conversion."""
    trace = current("nisa.dma_copy")
    at = where()
    if dst is None or src is None:
        raise NkiError("nisa.dma_copy needs dst= and src=", at)
    d, s = ops.view_of(dst, at), ops.view_of(src, at)
    m = None if mask is None else np.broadcast_to(np.asarray(mask, bool), d.shape)
    ops.dma(d, s, at, m)
    ops.finish(trace)


def memset(dst=None, value=0.0, shape=None, dtype=None, engine=vector_engine, **kwargs):
    """Fill a tile with `value` (memset(dst=t, value=0.0), or memset(shape, value, dtype))."""
    trace = current("nisa.memset")
    at = where()
    if dst is not None and not isinstance(dst, (Tensor, ops.View)):
        dst, shape = None, dst
    out = _dst(dst, shape, dtype, SBUF, at) if dst is None else ops.view_of(dst, at)
    eng = engine if engine in ops.ENGINE_ISSUERS else "vector"
    ops.engine_op(eng, "Memset", out, (), lambda: np.float32(value), at)
    ops.finish(trace)
    return _result(dst, out)


def iota(expr=None, dtype=None, dst=None, **kwargs):
    """Index values generated on GpSimd: iota(nl.arange(128)[:, None] * 4, dtype)."""
    trace = current("nisa.iota")
    at = where()
    values = np.asarray(expr)
    if values.ndim == 1:
        values = values[:, None]
    out = _dst(dst, values.shape, dtype or dtypes.int32, SBUF, at)
    ops.engine_op("gpsimd", "Iota", out, (), lambda: values, at)
    ops.finish(trace)
    return _result(dst, out)
