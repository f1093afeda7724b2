"""The engine instructions every language call lowers to: DMA transfers, Tensor
Engine matmuls and transposes, Vector/Scalar/GpSimd instructions. Each checks what
the hardware checks, computes the numbers on the host (numpy, fp32 inside the
engines) and issues its instructions with the dependencies its tiles impose."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from neuron_explorer.nki import dtypes
from neuron_explorer.nki.errors import NkiError
from neuron_explorer.nki.tensor import HBM, PSUM, SBUF, Tensor, View, operand
from neuron_explorer.nki.trace import Trace, caller_line, current
from numpy.typing import ArrayLike

TENSOR_ENGINE_DTYPES = dtypes.FLOATS


class PendingMatmul:
    """`nl.matmul(...)`: issued where it is used, so `psum_tile += nl.matmul(...)`
    accumulates in PSUM with one Tensor Engine instruction, as in NKI."""

    def __init__(self, stationary: View, moving: View, at: str) -> None:
        self.stationary = stationary
        self.moving = moving
        self.at = at
        self.shape = (stationary.shape[1], moving.shape[1])
        self.dtype = dtypes.float32
        self.buffer = PSUM
        self.issued: View | None = None  # the PSUM tile it went to, once read
        self.line = caller_line()  # issued later, but attributed to the nl.matmul line


def view_of(x, at: str) -> View:
    """A tile operand as a view (a pending matmul is issued into a new PSUM tile)."""
    if isinstance(x, PendingMatmul):
        if x.issued is None:  # issued once, however many times it is read
            trace = current("nl.matmul")
            trace.tag(caller_line())
            out = new_tile(x.shape, dtypes.float32, PSUM, at)
            matmul(out.view(), x.stationary, x.moving, at, accumulate=False)
            trace.tag(x.line)
            x.issued = out.view()
        return x.issued
    return operand(x, at)


def new_tile(shape, dtype, buffer: str, at: str, name: str | None = None) -> Tensor:
    return Tensor(shape, dtype, buffer, name=name, at=at)


def finish(trace: Trace) -> None:
    trace.tag(caller_line())


def _on_chip(v: View, what: str, at: str) -> None:
    if v.buffer == HBM:
        raise NkiError(f"{what} reads SBUF/PSUM tiles, but {v.tensor.describe()} is in "
                       "HBM: load it first (nl.load / nisa.dma_copy)", at)
    if v.partition_pos not in (0,):
        raise NkiError(f"{what}: the partition dimension of {v.tensor.describe()} must be "
                       "the first dimension of the tile (index the block dimensions "
                       "before it)", at)


def _same_shape(a: tuple, b: tuple, what: str, at: str) -> None:
    if tuple(a) != tuple(b):
        raise NkiError(f"{what}: shape mismatch, {list(a)} vs {list(b)}", at)


def _compute_dtype(dtype: str) -> np.dtype:
    return np.dtype(np.float32) if dtype in dtypes.FLOATS else dtypes.host_dtype(dtype)


def _f(values: np.ndarray | None, dtype: str) -> np.ndarray | None:
    return None if values is None else values.astype(_compute_dtype(dtype), copy=False)


# --- DMA ---------------------------------------------------------------------------
def dma(dst: View, src: View, at: str, mask: np.ndarray | None = None) -> None:
    trace = current("a DMA")
    b = trace.builder
    if PSUM in (dst.buffer, src.buffer):
        raise NkiError("DMA cannot reach PSUM: copy the tile to SBUF first (nl.copy / "
                       "nisa.tensor_copy)", at)
    if dst.dtype != src.dtype:
        raise NkiError(f"DMA cannot convert dtypes ({src.dtype} -> {dst.dtype}): load with "
                       "the source dtype and cast on an engine (nl.copy(x, dtype=...))", at)
    if math.prod(dst.shape) != math.prod(src.shape) or (
            len(dst.shape) == len(src.shape) and tuple(dst.shape) != tuple(src.shape)):
        raise NkiError(f"DMA shape mismatch: {list(src.shape)} -> {list(dst.shape)}", at)
    src.check_bounds(mask, at)
    dst.check_bounds(mask, at)
    values = src.values(at, mask)
    if values is not None:
        values = values.reshape(dst.shape)
    count = math.prod(dst.shape) if mask is None else int(np.broadcast_to(
        mask, dst.shape).sum())
    nbytes = count * dst.tensor.itemsize
    deps = src.read_deps() + dst.write_deps()
    if src.buffer == HBM and dst.buffer == HBM:
        ids = b.dma_copy(nbytes, 128, deps, row_bytes=min(src.contiguous_bytes(),
                                                           dst.contiguous_bytes()))
    elif src.buffer == HBM:
        parts = dst.partitions
        ids = b.dma_load(nbytes, parts, deps,
                         row_bytes=min(src.contiguous_bytes(), max(nbytes / parts, 1)))
    elif dst.buffer == HBM:
        parts = src.partitions
        ids = b.dma_store(nbytes, parts, deps,
                          row_bytes=min(dst.contiguous_bytes(), max(nbytes / parts, 1)))
    else:  # SBUF -> SBUF
        parts = dst.partitions
        ids = b.dma_load(nbytes, parts, deps, row_bytes=max(nbytes / parts, 1))
        b.hbm_read_bytes -= nbytes
    dst.store(values, None if mask is None else np.broadcast_to(mask, dst.shape))
    src.record(ids, write=False)
    dst.record(ids, write=True)


# --- Tensor Engine -----------------------------------------------------------------
def _te_dtype(*views: View, at: str) -> str:
    for v in views:
        if v.dtype not in TENSOR_ENGINE_DTYPES:
            raise NkiError(f"the Tensor Engine cannot take {v.dtype} tiles "
                           f"({v.tensor.describe()}): cast to bfloat16 first", at)
    return dtypes.float32 if any(v.dtype == dtypes.float32 for v in views) else views[0].dtype


def matmul(dst: View, stationary: View, moving: View, at: str,
           accumulate: bool | None = None) -> None:
    """dst[M, N] (PSUM, fp32) (+)= stationary[K, M].T @ moving[K, N]. `accumulate=None`:
    accumulate where dst holds data, overwrite where it does not."""
    trace = current("a matmul")
    p = trace.preset
    for v, role in ((stationary, "stationary"), (moving, "moving")):
        _on_chip(v, f"matmul {role}", at)
        if v.buffer != SBUF or len(v.shape) != 2:
            raise NkiError(f"matmul {role} must be a 2-D SBUF tile, got {list(v.shape)} in "
                           f"{v.buffer.upper()}", at)
    dtype = _te_dtype(stationary, moving, at=at)
    k, m = stationary.shape
    k2, n = moving.shape
    if k != k2:
        raise NkiError(f"matmul contraction mismatch: stationary has {k} partitions, "
                       f"moving {k2}", at)
    if m > p.te_cols:
        raise NkiError(f"matmul stationary free size {m} exceeds "
                       f"nl.tile_size.gemm_stationary_fmax ({p.te_cols})", at)
    if n > 512:
        raise NkiError(f"matmul moving free size {n} exceeds nl.tile_size.gemm_moving_fmax "
                       "(512)", at)
    if dst.buffer != PSUM or dst.dtype != dtypes.float32:
        raise NkiError(f"matmul results land in PSUM as float32, but the destination is "
                       f"{dst.tensor.describe()}", at)
    _same_shape(dst.shape, (m, n), "matmul destination", at)
    weights = stationary.read_deps()
    deps = weights + moving.read_deps() + dst.write_deps()
    b = trace.builder
    mm = b.matmul(k, m, n, dtype, deps, weight_deps=weights)
    b.add_model_flops(2 * k * m * n)
    s_data, m_data = stationary.values(at), moving.values(at)
    if s_data is not None and m_data is not None:  # both None when run without numerics
        prod = s_data.astype(np.float32).T @ m_data.astype(np.float32)
        t = dst.tensor
        if accumulate is False or t.written is None:
            dst.store(prod)
        else:
            held = t.written[dst.key]
            assert t.data is not None  # with numerics on every tensor holds its values
            dst.store(np.where(held, t.data[dst.key] + prod, prod))
    else:
        dst.store(None)
    stationary.record((mm - 1,), write=False)
    moving.record((mm,), write=False)
    dst.record((mm,), write=True)


def transpose_to_psum(data: View, at: str) -> Tensor:
    """nisa.nc_transpose on the Tensor Engine: an identity matmul, [P, F] -> [F, P]."""
    trace = current("a transpose")
    _on_chip(data, "transpose", at)
    if len(data.shape) != 2 or max(data.shape) > trace.preset.te_rows:
        raise NkiError(f"nc_transpose takes a 2-D tile of at most 128x128, got "
                       f"{list(data.shape)}", at)
    dtype = _te_dtype(data, at=at)
    p, f = data.shape
    out = new_tile((f, p), dtypes.float32, PSUM, at)
    deps = data.read_deps()
    mm = trace.builder.matmul(p, f, p, dtype, deps, weight_deps=deps)
    values = data.values(at)
    out.view().store(None if values is None else values.astype(np.float32).T)
    data.record((mm - 1,), write=False)
    out.view().record((mm,), write=True)
    return out


def transpose_to_sbuf(data: View, dtype: str, at: str) -> Tensor:
    """nl.transpose: Tensor Engine transpose and the copy out of PSUM, into SBUF."""
    trace = current("nl.transpose")
    _on_chip(data, "transpose", at)
    if len(data.shape) != 2 or max(data.shape) > trace.preset.te_rows:
        raise NkiError(f"nl.transpose takes a 2-D tile of at most 128x128, got "
                       f"{list(data.shape)}", at)
    _te_dtype(data, at=at)
    p, f = data.shape
    out = new_tile((f, p), dtype, SBUF, at)
    (last,) = trace.builder.transpose(p, f, data.dtype, data.read_deps())
    values = data.values(at)
    out.view().store(None if values is None else values.T)
    data.record((last,), write=False)
    out.view().record((last,), write=True)
    return out


# --- Vector, Scalar, GpSimd ----------------------------------------------------------
ENGINE_ISSUERS = ("vector", "scalar", "gpsimd")


def engine_op(engine: str, opcode: str, dst: View, inputs: Sequence[View],
              compute: Callable[..., ArrayLike], at: str, free: int | None = None) -> None:
    """One Vector/Scalar/GpSimd instruction: reads `inputs`, writes `compute(*values)`."""
    trace = current(opcode)
    b = trace.builder
    for v in inputs:
        _on_chip(v, opcode, at)
    _on_chip(dst, opcode, at)
    parts = {v.partitions for v in inputs if v.shape} | {dst.partitions}
    if len(parts) > 1:
        raise NkiError(f"{opcode}: partition sizes differ ({sorted(parts)}); engines work "
                       "lane by lane on equal partitions", at)
    values = [v.values(at) for v in inputs]
    work = free if free is not None else max([dst.free] + [v.free for v in inputs])
    deps = [i for v in inputs for i in v.read_deps()] + dst.write_deps()
    n_in = max(1, len(inputs))
    if engine == "scalar":
        iid = b.scalar(opcode, work, dst.dtype, n_in, deps)
    elif engine == "gpsimd":
        iid = b.gpsimd(opcode, work * dst.partitions, dst.dtype, deps)
    else:
        iid = b.vector(opcode, work, dst.dtype, n_in, deps)
    if trace.numerics:
        result = compute(*[_f(x, v.dtype) for x, v in zip(values, inputs, strict=True)])
        try:
            fitted = np.broadcast_to(result, dst.shape)
        except ValueError:
            raise NkiError(f"{opcode}: result shape {list(np.shape(result))} does not fit "
                           f"the destination {list(dst.shape)}", at) from None
        dst.store(fitted)
    else:
        dst.store(None)
    for v in inputs:
        v.record((iid,), write=False)
    dst.record((iid,), write=True)


def broadcast_shape(a: tuple, b: tuple, what: str, at: str) -> tuple:
    """Free dimensions broadcast numpy-style; partition sizes must be equal."""
    if a and b and a[0] != b[0]:
        raise NkiError(f"{what}: shape mismatch, {list(a)} vs {list(b)} (the partition "
                       "dimensions differ)", at)
    try:
        return tuple(np.broadcast_shapes(a, b))
    except ValueError:
        raise NkiError(f"{what}: shape mismatch, {list(a)} vs {list(b)}", at) from None


def result_dtype(*dts: str) -> str:
    if dtypes.float32 in dts:
        return dtypes.float32
    floats = [d for d in dts if d in dtypes.FLOATS]
    return floats[0] if floats else dts[0]

