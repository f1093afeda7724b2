"""Lowerings of index ops: embeddings, gathers, scatters and index_put.

Indices are loaded and turned into addresses on GpSimd; rows then move by indirect
DMA, one descriptor per row, so short rows cost far more per byte than long ones.
"""

from __future__ import annotations

import math

from neuron_explorer.backend.hardware.builder import KernelBuilder
from neuron_explorer.backend.hardware.lower_pointwise import outputs_of
from neuron_explorer.backend.hardware.specs import OpSpec, TensorSpec
from neuron_explorer.backend.hardware.streaming import simd, stream, vec

INDEX_DTYPES = frozenset({"int64", "int32", "int16", "int8", "uint8", "bool"})


def _gather_rows(b: KernelBuilder, rows: int, row_bytes: int, index: TensorSpec,
                 store_bytes_per_row: int) -> None:
    """Gather `rows` rows of `row_bytes` by index, tile by tile, and store them."""
    rows = max(rows, 1)
    for lo in range(0, rows, b.gather_rows_per_tile()):
        n = min(b.gather_rows_per_tile(), rows - lo)
        idx = b.dma_load(index.nbytes * n // rows, min(b.partitions, n))
        addr = b.gpsimd("IndexCompute", n, index.dtype, idx)
        got = b.dma_load(n * row_bytes, min(b.partitions, n), (addr,), row_bytes=row_bytes)
        b.dma_store(n * store_bytes_per_row, min(b.partitions, n), got)
    b.note_sbuf(min(rows, b.gather_rows_per_tile()) * row_bytes * 2)


def _index_of(spec: OpSpec) -> TensorSpec:
    ints = [t for t in spec.inputs if t.dtype in INDEX_DTYPES]
    return ints[0] if ints else TensorSpec((1,), "int64")


def lower_embedding(b: KernelBuilder, spec: OpSpec) -> None:
    """embedding(weight [V, D], indices) -> [*, D]: one gathered row per index."""
    weight = spec.inputs[0]
    index = spec.inputs[1] if len(spec.inputs) > 1 else _index_of(spec)
    row = weight.shape[-1] * weight.itemsize if weight.shape else weight.itemsize
    _gather_rows(b, index.numel, row, index, row)


def lower_index_select(b: KernelBuilder, spec: OpSpec) -> None:
    """index_select / aten::index: rows of the output come from indexed rows of self."""
    index = _index_of(spec)
    out = outputs_of(spec)[0] if spec.outputs else spec.inputs[0]
    rows = max(index.numel, 1)
    row_elems = max(1, out.numel // rows)
    row = row_elems * out.itemsize
    _gather_rows(b, rows, row, index, row)


def lower_gather(b: KernelBuilder, spec: OpSpec) -> None:
    """gather(self, dim, index): element gather. From SBUF when self fits there (load it
    once, GpSimd picks elements); otherwise one indirect DMA descriptor per element."""
    src = spec.inputs[0]
    index = _index_of(spec)
    out = outputs_of(spec)[0] if spec.outputs else TensorSpec(index.shape, src.dtype)
    if src.nbytes <= b.preset.sbuf_bytes // 4:
        stream(b, out.numel, src.dtype, [simd("Gather", 2.0)], inputs=[index.nbytes],
               small_inputs=[src.nbytes], outputs=[out.nbytes])
        return
    _gather_rows(b, out.numel, src.itemsize, index, src.itemsize)


def lower_scatter(b: KernelBuilder, spec: OpSpec) -> None:
    """scatter/index_add/index_put: copy self when out of place, load the values and
    indices, compute addresses on GpSimd, and write rows by indirect DMA (accumulate
    happens in the DMA engine)."""
    dst = spec.inputs[0]
    index = _index_of(spec)
    values = [t for t in spec.inputs[1:] if t is not index and t.dtype not in INDEX_DTYPES]
    value = max(values, key=lambda t: t.numel) if values else TensorSpec((index.numel,),
                                                                        dst.dtype)
    copied: tuple[int, ...] = ()
    if spec.outputs:  # out-of-place: the result starts as a copy of self
        copied = b.dma_copy(dst.nbytes)
    rows = max(index.numel, 1)
    row_elems = max(1, value.numel // rows)
    row = row_elems * dst.itemsize
    for lo in range(0, rows, b.gather_rows_per_tile()):
        n = min(b.gather_rows_per_tile(), rows - lo)
        idx = b.dma_load(index.nbytes * n // rows, min(b.partitions, n))
        vals = b.dma_load(value.nbytes * n // rows, min(b.partitions, n))
        addr = b.gpsimd("IndexCompute", n, index.dtype, idx + vals, 2.0)
        b.dma_store(n * row, min(b.partitions, n), copied + (addr,), row_bytes=row)
    b.add_model_flops(value.numel if spec.attr("accumulate") or "add" in spec.name else 0)


def lower_index_fill(b: KernelBuilder, spec: OpSpec) -> None:
    """index_fill(self, dim, index, value): whole rows of self set to a scalar. A copy of
    self first when out of place; then the indices load, GpSimd computes the addresses,
    and a memset row goes to each by indirect DMA (nothing but the indices read)."""
    dst = spec.inputs[0]
    index = _index_of(spec)
    copied: tuple[int, ...] = ()
    if spec.outputs:  # out-of-place: the result starts as a copy of self
        copied = b.dma_copy(dst.nbytes)
    rows = max(index.numel, 1)
    dim = int(spec.attr("dim") or 0) % max(len(dst.shape), 1)
    row = dst.nbytes // max(dst.shape[dim] if dst.shape else 1, 1)  # one slice along dim
    for lo in range(0, rows, b.gather_rows_per_tile()):
        n = min(b.gather_rows_per_tile(), rows - lo)
        idx = b.dma_load(index.nbytes * n // rows, min(b.partitions, n))
        elements = n * max(row // dst.itemsize, 1)
        fill = b.vector("Memset", -(-elements // b.partitions), dst.dtype, 1)  # all partitions
        addr = b.gpsimd("IndexCompute", n, index.dtype, idx, 2.0)
        b.dma_store(n * row, min(b.partitions, n), copied + (addr, fill), row_bytes=row)


def lower_embedding_backward(b: KernelBuilder, spec: OpSpec) -> None:
    """embedding_dense_backward(grad [*, D], indices, V): zero the [V, D] table, then
    scatter-add one gradient row per index."""
    grad, index = spec.inputs[0], spec.inputs[1]
    out = outputs_of(spec)[0] if spec.outputs else None
    dim = grad.shape[-1] if grad.shape else 1
    if out is None:
        vocab = int(spec.attr("num_weights", max(index.numel, 1)))
        out = TensorSpec((vocab, dim), grad.dtype)
    zeroed = stream(b, out.numel, out.dtype, [vec("Memset", 1, flops=0.0)],
                    outputs=[out.nbytes])
    rows = max(index.numel, 1)
    row = dim * out.itemsize
    for lo in range(0, rows, b.gather_rows_per_tile()):
        n = min(b.gather_rows_per_tile(), rows - lo)
        idx = b.dma_load(index.nbytes * n // rows, min(b.partitions, n))
        g = b.dma_load(grad.nbytes * n // rows, min(b.partitions, n))
        addr = b.gpsimd("ScatterAdd", n * dim, grad.dtype, idx + g, 1.0, flops=n * dim)
        b.dma_store(n * row, min(b.partitions, n), zeroed + (addr,), row_bytes=row)
    b.add_model_flops(math.prod(grad.shape))
