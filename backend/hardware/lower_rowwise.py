"""Lowerings of reductions, softmax, normalisations and losses: streams whose steps
keep per-row statistics in SBUF and whose small results are stored once."""

from __future__ import annotations

from collections.abc import Sequence

from neuron_explorer.backend.hardware.builder import KernelBuilder
from neuron_explorer.backend.hardware.lower_pointwise import outputs_of
from neuron_explorer.backend.hardware.specs import OpSpec
from neuron_explorer.backend.hardware.streaming import Step, act, simd, stream, vec


def _split(spec: OpSpec, elements: int) -> tuple[list[int], list[int]]:
    """Byte sizes of the full-size inputs and of the small (broadcast) ones."""
    full = [t.nbytes for t in spec.inputs if t.numel == elements]
    small = [t.nbytes for t in spec.inputs if 0 < t.numel < elements]
    return full, small


def lower_reduction(b: KernelBuilder, spec: OpSpec, steps: Sequence[Step]) -> None:
    """Reduce the input tile by tile into partial results in SBUF; store the (small) result.
    A result as large as the input (cumsum, reductions over a size-1 dim) streams out."""
    x = spec.inputs[0]
    elements = max(x.numel, 1)
    full, small = _split(spec, elements)
    outs = [t.nbytes for t in outputs_of(spec)]
    big = [n for n, t in zip(outs, outputs_of(spec), strict=True) if t.numel == elements]
    little = [n for n, t in zip(outs, outputs_of(spec), strict=True) if t.numel != elements]
    stream(b, elements, x.dtype, steps, inputs=full, small_inputs=small, outputs=big,
           small_outputs=little)


def lower_rows(b: KernelBuilder, spec: OpSpec, steps: Sequence[Step]) -> None:
    """Row-wise ops (softmax, norms and their backward): the largest input sets the size;
    outputs of that size stream out per tile, statistics are stored at the end."""
    elements = max([t.numel for t in spec.inputs] + [1])
    full, small = _split(spec, elements)
    outs = outputs_of(spec)
    big = [t.nbytes for t in outs if t.numel == elements]
    little = [t.nbytes for t in outs if t.numel != elements]
    widest = max(spec.inputs, key=lambda t: t.numel) if spec.inputs else None
    dtype = widest.dtype if widest is not None else "float32"
    # A row that does not fit in one partition's share of SBUF is read twice: once for
    # its statistics, once more to normalise it (the second read is a spill reload).
    row = widest.shape[-1] * widest.itemsize if widest is not None and widest.shape else 0
    reload = full if row * 4 > b.preset.sbuf_partition_bytes else []
    stream(b, elements, dtype, steps, inputs=full, small_inputs=small, outputs=big,
           small_outputs=little, reload_inputs=reload)


def lower_nll_loss(b: KernelBuilder, spec: OpSpec) -> None:
    """nll_loss forward: gather one logit per target row (an indirect DMA of single
    elements), then reduce; the logits are never read in full."""
    logits, target = spec.inputs[0], spec.inputs[1]
    rows = max(target.numel, 1)
    idx = b.dma_load(target.nbytes, min(b.partitions, rows))
    addr = b.gpsimd("IndexCompute", rows, target.dtype, idx)
    got = b.dma_load(rows * logits.itemsize, min(b.partitions, rows), (addr,),
                     row_bytes=logits.itemsize)
    red = b.vector("TensorReduce", -(-rows // b.partitions), logits.dtype, 1, got, flops=rows)
    b.add_model_flops(rows)
    for out in outputs_of(spec)[:2]:
        b.dma_store(out.nbytes, 1, (red,))


def lower_nll_loss_backward(b: KernelBuilder, spec: OpSpec) -> None:
    """nll_loss backward: zero the [N, C] gradient, then scatter -grad_output * w/N at
    each target (grad_output: a scalar, or one value per target without reduction)."""
    outs = outputs_of(spec)
    grad_in = outs[0] if spec.outputs else spec.inputs[1]
    target = spec.inputs[2] if len(spec.inputs) > 2 else spec.inputs[-1]
    zeroed = stream(b, grad_in.numel, grad_in.dtype, [vec("Memset", 1, flops=0.0)],
                    outputs=[grad_in.nbytes])
    rows = max(target.numel, 1)
    grad_out = b.dma_load(spec.inputs[0].nbytes, min(b.partitions, max(spec.inputs[0].numel, 1)))
    idx = b.dma_load(target.nbytes, min(b.partitions, rows))
    addr = b.gpsimd("IndexCompute", rows, target.dtype, idx)
    b.dma_store(rows * grad_in.itemsize, min(b.partitions, rows), zeroed + (addr,) + grad_out,
                row_bytes=grad_in.itemsize)


# Step chains (one entry per instruction each tile needs).
SUM = [vec("TensorReduce", 1, 1.0)]
MINMAX = [vec("TensorReduce", 1, 1.0)]
ARGMINMAX = [vec("TensorReduce", 1, 1.0), simd("MaxIndex", 1.0)]
VAR = [vec("BnStats", 1, 3.0), vec("BnAggr", 1, 1.0, free_scale=1 / 64)]
NORM = [vec("TensorTensorReduce", 1, 2.0)]
LOGSUMEXP = [vec("TensorReduce", 1, 1.0), act("Activation", 1, 2.0)]
SCAN = [vec("TensorScan", 1, 1.0)]
SOFTMAX = [vec("TensorReduce", 1, 1.0), act("Activation", 1, 3.0),
           vec("TensorScalar", 1, 1.0)]
LOG_SOFTMAX = [vec("TensorReduce", 1, 1.0), act("Activation", 1, 3.0),
               vec("TensorScalar", 1, 1.0)]
SOFTMAX_BACKWARD = [vec("TensorTensorReduce", 2, 2.0), vec("TensorScalar", 1, 1.0),
                    vec("TensorTensor", 2, 1.0)]
LOG_SOFTMAX_BACKWARD = [vec("TensorReduce", 1, 1.0), act("Activation", 1, 1.0),
                        vec("TensorTensor", 2, 2.0)]
LAYER_NORM = [vec("BnStats", 1, 3.0), vec("BnAggr", 1, 1.0, free_scale=1 / 64),
              vec("TensorScalar", 1, 2.0), vec("TensorTensor", 2, 1.0),
              vec("TensorTensor", 2, 1.0)]
LAYER_NORM_BACKWARD = [vec("TensorScalar", 1, 2.0), vec("TensorTensor", 2, 1.0),
                       vec("TensorTensorReduce", 2, 2.0), vec("TensorTensorReduce", 2, 2.0),
                       vec("TensorScalar", 1, 2.0), vec("TensorTensor", 2, 2.0),
                       vec("TensorTensor", 2, 2.0), vec("TensorReduce", 1, 1.0)]
RMS_NORM = [act("Activation", 1, 2.0), vec("TensorScalar", 1, 1.0),
            vec("TensorTensor", 2, 1.0)]
MSE = [vec("TensorTensor", 2, 1.0), vec("TensorTensorReduce", 1, 2.0)]
BCE_LOGITS = [act("Activation", 1, 4.0), vec("TensorTensor", 2, 2.0),
              vec("TensorReduce", 1, 1.0)]
