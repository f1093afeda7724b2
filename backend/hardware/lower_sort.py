"""Lowerings of ordering and counting ops on GpSimd: sort, top-k, searchsorted, bincount.

The Vector and Scalar engines apply one operation to every element; comparisons
that depend on other elements of the row (a sorting network, a selection, a binary
search, a histogram's read-modify-write) run on GpSimd's general-purpose cores. Rows
stream through SBUF tile by tile, as any stream does; the cycles per element are
those of the algorithm each core runs:

- sort: a bitonic network, L (L + 1) / 2 compare-exchange stages for rows of 2^L;
- top-k: one pass keeping the k best in a heap, about log2(k) + 1 steps per element;
- searchsorted: a binary search of each value, log2(n) + 1 steps, the sorted
  sequence loaded once;
- bincount: one read-modify-write of a bin per element (2 steps), bins stored once.
"""

from __future__ import annotations

import math

from neuron_explorer.backend.hardware.builder import KernelBuilder
from neuron_explorer.backend.hardware.specs import OpSpec, TensorSpec
from neuron_explorer.backend.hardware.streaming import simd, stream


def _log2(n: int) -> int:
    return max(1, math.ceil(math.log2(max(n, 2))))


def _row_length(t: TensorSpec, spec: OpSpec) -> int:
    """Length of the dim an op orders along (`dim`, default the last)."""
    if not t.shape:
        return 1
    dim = spec.attr("dim", -1)
    dim = dim if isinstance(dim, int) else -1
    return t.shape[dim if -len(t.shape) <= dim < len(t.shape) else -1]


def _written(spec: OpSpec) -> tuple[TensorSpec, ...]:
    """What the op writes: its outputs, or its out= tensors (passed after `self`)."""
    return spec.outputs or spec.inputs[1:]


def _outputs_bytes(spec: OpSpec) -> list[int]:
    return [t.nbytes for t in _written(spec) if t.nbytes]


def lower_sort(b: KernelBuilder, spec: OpSpec) -> None:
    """sort / argsort (values and int64 indices) along a dim."""
    x = spec.inputs[0]
    stages = _log2(_row_length(x, spec))
    steps = [simd("Sort", stages * (stages + 1) / 2, flops=stages * (stages + 1) / 2)]
    stream(b, x.numel, x.dtype, steps, inputs=[x.nbytes], outputs=_outputs_bytes(spec))


def lower_topk(b: KernelBuilder, spec: OpSpec) -> None:
    """topk(self, k, dim): the k largest (or smallest) of each row and their indices."""
    x = spec.inputs[0]
    out = _written(spec)[0] if _written(spec) else x
    k = max(1, _row_length(out, spec))
    steps = [simd("TopK", _log2(k) + 1, flops=_log2(k) + 1)]
    stream(b, x.numel, x.dtype, steps, inputs=[x.nbytes], outputs=_outputs_bytes(spec))


def lower_searchsorted(b: KernelBuilder, spec: OpSpec) -> None:
    """searchsorted(sorted_sequence, values): one binary search per value."""
    seq = spec.inputs[0]
    values = spec.inputs[1] if len(spec.inputs) > 1 else TensorSpec((1,), seq.dtype)
    n = seq.shape[-1] if seq.shape else 1
    steps = [simd("BinarySearch", _log2(n) + 1, flops=_log2(n) + 1)]
    stream(b, values.numel, values.dtype, steps, inputs=[values.nbytes],
           outputs=_outputs_bytes(spec), small_inputs=[seq.nbytes])


def lower_bincount(b: KernelBuilder, spec: OpSpec) -> None:
    """bincount(self, weights, minlength): a histogram built in SBUF, stored once."""
    x = spec.inputs[0]
    weights = [t.nbytes for t in spec.inputs[1:2]]
    steps = [simd("Histogram", 2.0, flops=1.0)]
    stream(b, x.numel, x.dtype, steps, inputs=[x.nbytes, *weights],
           small_outputs=_outputs_bytes(spec))
