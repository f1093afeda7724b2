"""Lowerings of elementwise ops: arithmetic, activations, copies, fills, iota, random
numbers, dropout and the `_foreach_*` / fused optimizer ops (multi-tensor streams)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from neuron_explorer.backend.hardware.builder import KernelBuilder
from neuron_explorer.backend.hardware.specs import OpSpec, TensorSpec
from neuron_explorer.backend.hardware.streaming import Step, simd, stream, vec

ARITH = "Arith"  # placeholder opcode: TensorTensor with two tensor operands, else TensorScalar


def outputs_of(spec: OpSpec) -> tuple[TensorSpec, ...]:
    """The tensors an op writes: its outputs, or `self` for in-place ops given none."""
    return spec.outputs or spec.inputs[:1]


def _resolve(steps: Sequence[Step], n_tensor_inputs: int) -> list[Step]:
    out = []
    for st in steps:
        if st.opcode == ARITH:
            n = max(1, min(n_tensor_inputs, 3))
            opcode = "TensorTensor" if n >= 2 else "TensorScalar"
            st = Step(st.engine, opcode, n, st.flops)
        out.append(st)
    return out


def lower_pointwise(b: KernelBuilder, spec: OpSpec, steps: Sequence[Step],
                    extra_outputs: int = 0) -> None:
    """Full-size inputs stream tile by tile; smaller (broadcast) inputs load once."""
    outs = outputs_of(spec)
    elements = max([t.numel for t in outs] + [t.numel for t in spec.inputs] + [1])
    dtype = outs[0].dtype if outs else "float32"
    full = [t.nbytes for t in spec.inputs if t.numel == elements]
    small = [t.nbytes for t in spec.inputs if 0 < t.numel < elements]
    stream(b, elements, dtype, _resolve(steps, len(spec.inputs)),
           inputs=full, small_inputs=small, outputs=[t.nbytes for t in outs])


def lower_glu(b: KernelBuilder, spec: OpSpec, steps: Sequence[Step]) -> None:
    """glu: out = a * sigmoid(b) over the input's two halves: the steps run once per
    output element (half the input's), and both halves are read."""
    outs = outputs_of(spec)
    out = outs[0] if outs else spec.inputs[0]
    elements = max(out.numel, 1)
    stream(b, elements, out.dtype, _resolve(steps, 2),
           inputs=[t.nbytes for t in spec.inputs], outputs=[t.nbytes for t in outs])


def lower_slice_scatter(b: KernelBuilder, spec: OpSpec) -> None:
    """slice_scatter(self, src) and its kin: `self` with `src` written into a slice of
    it. What lies outside the slice is copied and `src` copied in, HBM to HBM (the two
    parts are disjoint: the copies run side by side)."""
    outs = outputs_of(spec)
    out = outs[0] if outs else spec.inputs[0]
    src = spec.inputs[1] if len(spec.inputs) > 1 else spec.inputs[0]
    pieces = b.preset.dma_engines
    for part in (max(out.nbytes - src.nbytes, 0), min(src.nbytes, out.nbytes)):
        if part:
            b.dma_copy(part, row_bytes=max(part / pieces, 1.0))


def lower_copy(b: KernelBuilder, spec: OpSpec) -> None:
    """Same dtype: one HBM -> HBM DMA; a dtype change goes through the Vector Engine."""
    outs = outputs_of(spec)
    src = spec.inputs[-1] if spec.inputs else outs[0]
    dst = outs[0]
    if len(spec.inputs) >= 2 and spec.outputs == ():  # copy_(self, src): writes self
        dst, src = spec.inputs[0], spec.inputs[1]
    if src.dtype == dst.dtype:
        # HBM -> HBM needs no partitions: the 16 DMA engines each copy one contiguous
        # piece, whatever the tensor's rank
        pieces = b.preset.dma_engines
        b.dma_copy(dst.nbytes, row_bytes=max(dst.nbytes / pieces, 1.0))
        return
    stream(b, dst.numel, dst.dtype, [vec("TensorCopy", 1, flops=0.0)],
           inputs=[src.nbytes] if src.numel == dst.numel else [],
           small_inputs=[] if src.numel == dst.numel else [src.nbytes],
           outputs=[dst.nbytes])


def lower_concat(b: KernelBuilder, spec: OpSpec) -> None:
    """cat/stack: each input is copied by DMA into its slice of the output."""
    for t in spec.inputs:
        if t.nbytes:
            rows = max(1, min(b.partitions, t.numel // max(t.shape[-1] if t.shape else 1, 1)))
            b.dma_copy(t.nbytes, rows)


def lower_generate(b: KernelBuilder, spec: OpSpec, steps: Sequence[Step]) -> None:
    """Ops that write new values with no full-size input: fill, iota, random numbers."""
    outs = outputs_of(spec)
    elements = max(t.numel for t in outs) if outs else 1
    small = [t.nbytes for t in spec.inputs if t.numel < elements]
    stream(b, elements, outs[0].dtype if outs else "float32", steps,
           small_inputs=small, outputs=[t.nbytes for t in outs])


def lower_dropout(b: KernelBuilder, spec: OpSpec) -> None:
    """native_dropout: random numbers on GpSimd, mask and scale on Vector; writes out+mask."""
    x = spec.inputs[0]
    outs = spec.outputs or (x, TensorSpec(x.shape, "bool"))
    steps = [simd("Random", 4.0), vec("TensorScalar", 1, flops=1.0),
             vec("TensorTensor", 2, flops=1.0)]
    stream(b, x.numel, x.dtype, steps, inputs=[x.nbytes], outputs=[t.nbytes for t in outs])


def _group_size(tensors: Sequence[TensorSpec], n_outputs: int) -> int:
    """How many tensors each list of a `_foreach_*` op holds."""
    if n_outputs:
        return n_outputs
    n = len(tensors)
    for size in range(1, n + 1):  # the shortest period of shapes that divides the inputs
        if n % size == 0 and all(tensors[i].shape == tensors[i % size].shape for i in range(n)):
            return size
    return n


def lower_foreach(b: KernelBuilder, spec: OpSpec, base: Callable[..., None], **params) -> None:
    """One kernel for a whole list of tensors (multi-tensor apply): one stream per tensor,
    the streams spread over the DMA queues and run back to back on the engines."""
    n = _group_size(spec.inputs, len(spec.outputs))
    if n == 0:
        return
    lists = max(1, len(spec.inputs) // n)
    for j in range(n):
        ins = tuple(spec.inputs[j + k * n] for k in range(lists) if j + k * n < len(spec.inputs))
        outs = (spec.outputs[j],) if spec.outputs else ins[:1]
        base(b, spec.replace(inputs=ins, outputs=outs), **params)


def _parameter_count(spec: OpSpec, tensors: Sequence[TensorSpec]) -> int:
    """How many parameters a fused optimizer step updates: its outputs (the parameter
    list it writes), else its 0-d state steps (one a parameter, in keys recorded with the
    first parameter as the only output), else the shortest period of the shapes."""
    if len(spec.outputs) > 1:
        return len(spec.outputs)
    steps = len(spec.inputs) - len(tensors)
    if steps and len(tensors) % steps == 0:
        return steps
    return _group_size(tensors, 0)


def lower_fused_optimizer(b: KernelBuilder, spec: OpSpec, steps: Sequence[Step]) -> None:
    """_fused_adam(w): per parameter read param, grad and two moments; write three back."""
    tensors = [t for t in spec.inputs if t.shape != ()]  # state steps are 0-d scalars
    n = _parameter_count(spec, tensors)
    lists = max(1, len(tensors) // max(n, 1))
    for j in range(n):
        group = [tensors[j + k * n] for k in range(lists) if j + k * n < len(tensors)]
        param = group[0]
        full = [t.nbytes for t in group if t.numel == param.numel]
        stream(b, param.numel, param.dtype, steps, inputs=full,
               outputs=full[:1] + full[2:4])
