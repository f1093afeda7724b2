"""embedding_bag: gather the rows of each bag by indirect DMA, reduce them on the
Vector Engine, store one row per bag.

Like an embedding, indices are loaded and turned into addresses on GpSimd, then each
row moves by one indirect-DMA descriptor; the rows of a tile are summed (or averaged,
or maxed) per bag by a TensorReduce, so only the bags' rows go back to HBM.
"""

from __future__ import annotations

from neuron_explorer.backend.hardware.builder import KernelBuilder
from neuron_explorer.backend.hardware.specs import OpSpec

_INDEX_DTYPES = frozenset({"int64", "int32"})


def lower_embedding_bag(b: KernelBuilder, spec: OpSpec) -> None:
    """_embedding_bag(weight [V, D], indices [N], offsets [B], ...) -> bags [B, D]."""
    weight = spec.inputs[0]
    ints = [t for t in spec.inputs[1:] if t.dtype in _INDEX_DTYPES]
    indices = ints[0] if ints else spec.inputs[1]
    offsets = ints[1] if len(ints) > 1 else None
    per_sample = [t for t in spec.inputs[1:] if t.dtype not in _INDEX_DTYPES and t.numel > 1]
    row_elems = weight.shape[-1] if weight.shape else 1
    row = row_elems * weight.itemsize
    rows = max(indices.numel, 1)
    out = spec.outputs[0] if spec.outputs else weight
    pre = b.dma_load(offsets.nbytes, min(b.partitions, max(offsets.numel, 1))) if offsets else ()
    for t in per_sample:  # per_sample_weights: multiplied into the rows before the reduce
        pre = pre + b.dma_load(t.nbytes, min(b.partitions, t.numel))
    reduced: tuple[int, ...] = ()
    for lo in range(0, rows, b.gather_rows_per_tile()):
        n = min(b.gather_rows_per_tile(), rows - lo)
        idx = b.dma_load(indices.nbytes * n // rows, min(b.partitions, n))
        addr = b.gpsimd("IndexCompute", n, indices.dtype, idx + pre)
        got = b.dma_load(n * row, min(b.partitions, n), (addr,), row_bytes=row)
        free = max(1, n * row_elems // min(b.partitions, n))
        last = got
        if per_sample:
            last = (b.vector("TensorTensor", free, weight.dtype, 2, last, flops=n * row_elems),)
        # rows of one bag, spread over the partitions, summed into the bag's row
        reduced = reduced + (b.vector("TensorReduce", free, weight.dtype, 1, last + reduced[-1:],
                                      flops=n * row_elems),)
    b.add_model_flops(rows * row_elems)
    b.note_sbuf(min(rows, b.gather_rows_per_tile()) * row * 2 + out.nbytes)
    rows_out = max(out.shape[0] if out.shape else 1, 1)
    b.dma_store(out.nbytes, min(b.partitions, rows_out), reduced[-1:])
    for extra in spec.outputs[1:]:  # offset2bag, bag_size, max_indices
        if extra.nbytes:
            b.dma_store(extra.nbytes, min(b.partitions, max(extra.numel, 1)), reduced[-1:])
