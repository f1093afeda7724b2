"""Fusion groups -> device kernels, built with the simulator's own lowering pieces.

A group of one op gets exactly the kernel the eager path lowers for it. A chain of
elementwise and reduction ops becomes one stream (`hardware.streaming.stream`): its
tiles load the group's inputs once, run every op's steps on the tile in SBUF, and
store only the values other kernels read; triple buffering overlaps the next tile's
loads with compute. A matmul group runs the GEMM (`hardware.emit_gemm`), keeps the
result in SBUF and streams its epilogue over it. The steps of each op are the
eager lowering table's, so instructions and costs are the eager path's; only the
kernels' boundaries (and so their DMA traffic) differ.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import zip_longest
from typing import TYPE_CHECKING

import torch
from neuron_explorer.backend.compiler.fusion import FusionGroup, OpKind, classify
from neuron_explorer.backend.compiler.op_keys import node_key, node_value, op_name, tensor_sig
from neuron_explorer.backend.compiler.region import FxRegion, emit_region
from neuron_explorer.backend.compiler.stream_steps import scaled, steps_for
from neuron_explorer.backend.hardware import Gemm, KernelBuilder, emit_gemm
from neuron_explorer.backend.hardware.lowering import emit_host_fallback
from neuron_explorer.backend.hardware.optable import NO_DEVICE_WORK, lowering_for
from neuron_explorer.backend.hardware.streaming import Step, stream
from neuron_explorer.common.dtypes import dtype_bytes
from neuron_explorer.common.op_families import ADDS_INPUT, GEMM, base_name
from torch import fx

if TYPE_CHECKING:
    from neuron_explorer.backend.devices import NeuronDevice

# Concatenations: in SBUF, pieces laid out side by side (no data moves on chip).
_CONCATS = {"cat", "stack"}


def laid_end_to_end(chains: Sequence[tuple[list[int], list[int], list[int], list[int]]]
                    ) -> tuple[list[int], list[int], list[int], list[int]]:
    """One stream's operands for chains run side by side, from each chain's (full-size
    inputs, small inputs, full-size outputs, small outputs) in bytes: the chains' k-th
    full-size operands one tensor of all their bytes, their small ones each loaded or
    stored once."""
    def summed(k: int) -> list[int]:
        return [sum(column) for column in zip_longest(*(c[k] for c in chains), fillvalue=0)]

    def listed(k: int) -> list[int]:
        return [nbytes for c in chains for nbytes in c[k]]

    return summed(0), listed(1), summed(2), listed(3)


def op_steps(node: fx.Node) -> list[Step] | None:
    """The per-tile steps of a node's op; None if it cannot share a stream."""
    if not isinstance(node.target, torch._ops.OpOverload):
        return None
    values = [node_value(a) for a in node.all_input_nodes]
    tensors = [t for t in values if isinstance(t, torch.Tensor)]
    out = node_value(node)
    converts = bool(tensors) and isinstance(out, torch.Tensor) and out.dtype != tensors[0].dtype
    return steps_for(op_name(node), len(tensors), converts)


def _through_views(node: fx.Node) -> fx.Node:
    """The op whose memory a chain of views reads."""
    while (classify(node) is OpKind.VIEW and node.all_input_nodes):
        node = node.all_input_nodes[0]
    return node


def can_fuse(node: fx.Node) -> bool:
    """Whether `node` may share a kernel with its neighbours (fusion planner hook)."""
    return op_steps(node) is not None


def _numel(node: fx.Node, binding: dict | None) -> int:
    sig = tensor_sig(node_value(node), binding)
    if sig is None:
        val = node_value(node)
        if isinstance(val, (list, tuple)):
            sigs = [tensor_sig(v, binding) for v in val]
            return max([_prod(s[0]) for s in sigs if s is not None] + [0])
        return 0
    return _prod(sig[0])


def _prod(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _nbytes(node: fx.Node, binding: dict | None) -> list[tuple[int, int]]:
    """(numel, bytes) of each tensor a node produces."""
    val = node_value(node)
    values = val if isinstance(val, (list, tuple)) else [val]
    out = []
    for v in values:
        sig = tensor_sig(v, binding)
        if sig is not None:
            n = _prod(sig[0])
            out.append((n, n * dtype_bytes(str(sig[1]).removeprefix("torch."))))
    return out


def _dtype_of(node: fx.Node) -> str:
    val = node_value(node)
    if isinstance(val, (list, tuple)):
        val = next((v for v in val if isinstance(v, torch.Tensor)), None)
    if isinstance(val, torch.Tensor):
        return str(val.dtype).removeprefix("torch.")
    return "float32"


class GroupKernels:
    """Emits the instructions of each fusion group, for one preset and one set of
    shapes, into the builder of the graph's program."""

    def __init__(self, device: NeuronDevice, binding: dict | None = None) -> None:
        self.device = device
        self.preset = device.preset
        self.binding = binding
        # Values earlier ops of the program left in SBUF: read there, never reloaded.
        self.on_chip: set[fx.Node] = set()

    def emit(self, b: KernelBuilder, group: FusionGroup,
             enter: Callable[[fx.Node], None] | None = None) -> None:
        reads_on_chip = any(v in self.on_chip for v in group.inputs)
        if group.chains:
            self._side_by_side(b, group)
        elif group.kind is OpKind.ATTENTION:
            emit_region(b, FxRegion(group, self.binding), enter, self.on_chip)
        elif len(group.nodes) == 1 and (base_name(op_name(group.nodes[0])) in _CONCATS
                                        or not (reads_on_chip
                                                and self._streams(group.nodes[0]))):
            self._eager(b, group.nodes[0])
        elif len(group.nodes) == 1 and group.kind is not OpKind.MATMUL:
            self._stream(b, group, group.nodes)
        elif group.kind is OpKind.MATMUL:
            self._matmul_with_epilogue(b, group)
        else:
            self._stream(b, group, group.nodes)

    def reads_on_chip(self, group: FusionGroup) -> bool:
        """Whether the group's kernel can take its operands from SBUF (an op lowered
        as its eager kernel loads its own)."""
        return (group.kind is OpKind.ATTENTION or len(group.nodes) > 1
                or self._streams(group.nodes[0]))

    def loads_itself(self, group: FusionGroup, value: fx.Node) -> bool:
        """Whether the group's kernel loads `value` on its own terms: a GEMM's bias,
        added as the result leaves PSUM."""
        anchor = group.nodes[0]
        if group.kind is not OpKind.MATMUL or base_name(op_name(anchor)) not in ADDS_INPUT:
            return False
        return isinstance(anchor.args[0], fx.Node) and _through_views(anchor.args[0]) is value

    def _streams(self, node: fx.Node) -> bool:
        """Whether the op has a form that reads its operands from SBUF: a stream of
        steps, or a plain GEMM."""
        if base_name(op_name(node)) in GEMM:
            return self._gemm(node, store=True) is not None
        if base_name(op_name(node)) in _CONCATS:
            return True
        return bool(op_steps(node))

    def _eager(self, b: KernelBuilder, node: fx.Node) -> None:
        """The instructions the eager path lowers for this op (a host round trip, with
        the eager path's warning, for an op the device cannot run)."""
        from neuron_explorer.backend import runtime

        key = node_key(node, self.binding)
        spec = runtime.spec_for(key)
        base = base_name(spec.name)
        if base in NO_DEVICE_WORK or (spec.outputs and all(t.numel == 0 for t in spec.outputs)):
            return
        if base in _CONCATS and all(_through_views(a) in self.on_chip
                                    for a in node.all_input_nodes):
            # The pieces are in SBUF already: laid out side by side, they are the
            # result; only its store to HBM remains.
            out = spec.outputs[0]
            b.dma_store(out.nbytes, min(b.partitions, max(out.shape[0] if out.shape else 1, 1)))
            return
        fn = lowering_for(base)
        if fn is None and spec.name.startswith("nki::"):
            from neuron_explorer.nki.torch_op import lower_into

            if lower_into(b, spec):  # an NKI kernel: its own instructions, in the program
                return
        if fn is None:
            runtime.lower(self.device, key)  # warns once, as eager does
            emit_host_fallback(b, spec)
        else:
            fn(b, spec)

    def _stream_io(self, group: FusionGroup, members: Sequence[fx.Node], elements: int,
                   resident: set[fx.Node]) -> tuple[list[int], list[int], list[int], list[int]]:
        full_in: list[int] = []
        small_in: list[int] = []
        full_out: list[int] = []
        small_out: list[int] = []
        for src in group.inputs_of(list(members)):
            if src in resident or src in self.on_chip:
                continue
            for numel, nbytes in _nbytes(src, self.binding):
                (full_in if numel == elements else small_in).append(nbytes)
        for out in group.outputs:
            if out not in members:
                continue
            for numel, nbytes in _nbytes(out, self.binding):
                (full_out if numel == elements else small_out).append(nbytes)
        return full_in, small_in, full_out, small_out

    def _steps(self, members: Sequence[fx.Node], elements: int) -> list[Step]:
        steps: list[Step] = []
        for node in members:
            own = op_steps(node) or []
            touched = max([_numel(node, self.binding)]
                          + [_numel(a, self.binding) for a in node.all_input_nodes])
            steps.extend(scaled(own, touched / max(elements, 1)))
        return steps

    def _elements(self, group: FusionGroup, members: Sequence[fx.Node]) -> int:
        sizes = [_numel(n, self.binding) for n in members]
        sizes += [_numel(n, self.binding) for n in group.inputs_of(list(members))]
        return max(sizes + [1])

    def _stream(self, b: KernelBuilder, group: FusionGroup, members: Sequence[fx.Node]
                ) -> None:
        elements = self._elements(group, members)
        self._emit_stream(b, group, members, elements, resident=set(), deps=())

    def _emit_stream(self, b: KernelBuilder, group: FusionGroup, members: Sequence[fx.Node],
                     elements: int, resident: set[fx.Node], deps: Sequence[int]) -> None:
        full_in, small_in, full_out, small_out = self._stream_io(group, members, elements,
                                                                 resident)
        biggest = max(members, key=lambda n: _numel(n, self.binding))
        stream(b, elements, _dtype_of(biggest), self._steps(members, elements),
               inputs=full_in, outputs=full_out, small_inputs=small_in,
               small_outputs=small_out, deps=tuple(deps),
               resident_inputs=len(resident | (self.on_chip & set(group.inputs))))

    def _side_by_side(self, b: KernelBuilder, group: FusionGroup) -> None:
        """Foreach pieces side by side: one stream over every chain's elements, each of
        its inputs and results one tensor of all the chains' bytes (a foreach kernel's
        lists, laid end to end), the steps the first chain's."""
        chains = [(chain, self._elements(group, chain)) for chain in group.chains]
        full_in, small_in, full_out, small_out = laid_end_to_end(
            [self._stream_io(group, chain, elements, set()) for chain, elements in chains])
        first, elements = chains[0]
        stream(b, sum(e for _, e in chains), _dtype_of(first[-1]), self._steps(first, elements),
               inputs=full_in, outputs=full_out, small_inputs=small_in,
               small_outputs=small_out,
               resident_inputs=len(self.on_chip & set(group.inputs_of(first))))

    def _matmul_with_epilogue(self, b: KernelBuilder, group: FusionGroup) -> None:
        anchor, epilogue = group.nodes[0], group.nodes[1:]
        if (not self._steps(epilogue, 1) and not group.inputs_of(epilogue)
                and anchor not in group.outputs and len(group.outputs) == 1):
            # Only copies and views follow: the GEMM stores straight to their result.
            gemm = self._gemm(anchor, store=True)
            if gemm is not None:
                emit_gemm(b, gemm)
                return
        gemm = self._gemm(anchor, store=anchor in group.outputs)
        if gemm is None:  # not a plain GEMM: the anchor's own kernel, then the stream
            start = len(b)
            self._eager(b, anchor)
            self._emit_stream(b, group, epilogue, self._elements(group, epilogue),
                              resident=set(), deps=b.finished(start))
            return
        tails = emit_gemm(b, gemm)
        if not epilogue:
            return
        elements = max(self._elements(group, epilogue), gemm.batch * gemm.m * gemm.n)
        # The GEMM's result is resident in SBUF; the epilogue never reloads it.
        self._emit_stream(b, group, epilogue, elements, resident={anchor}, deps=tails)

    def _gemm(self, node: fx.Node, store: bool) -> Gemm | None:
        """The GEMM of an mm/addmm/bmm/baddbmm node (bias added on the PSUM copy)."""
        base = base_name(op_name(node))
        if base not in GEMM:
            return None
        key = node_key(node, self.binding)
        inputs = key[1]
        if base in ADDS_INPUT:
            bias, a, w = inputs[0], inputs[1], inputs[2]
        else:
            bias, a, w = None, inputs[0], inputs[1]
        (a_shape, a_dtype), (w_shape, _) = a, w
        args = [_through_views(x) for x in node.args if isinstance(x, fx.Node)]
        a_node, w_node = (args[1], args[2]) if bias is not None else (args[0], args[1])
        if len(a_shape) < 2 or len(w_shape) < 2:
            return None
        m, k, n = a_shape[-2], a_shape[-1], w_shape[-1]
        batch = max(_prod(a_shape) // max(m * k, 1), 1)
        dtype = str(a_dtype).removeprefix("torch.")
        es = dtype_bytes(dtype)
        out_dtype = str(key[2][0][1]).removeprefix("torch.") if key[2] else dtype
        bias_bytes = _prod(bias[0]) * dtype_bytes(str(bias[1]).removeprefix("torch.")) \
            if bias is not None else 0
        return Gemm(m=m, k=k, n=n, dtype=dtype, out_dtype=out_dtype, batch=batch,
                    a_bytes=m * k * es, b_bytes=k * n * es, bias_bytes=bias_bytes // batch,
                    store=store, load_a=a_node not in self.on_chip,
                    load_b=w_node not in self.on_chip)
