"""An attention region's instructions: batched matmuls and the score math between them,
with every intermediate kept on chip (flash-attention style).

The region's inputs (q, k, v, masks, saved probabilities, incoming gradients) are
loaded from HBM once; the heads are split into chunks, and for each op in graph order
every chunk runs on its engine: batched matmuls on the Tensor Engine (scores stay in
PSUM when only the score math reads them; an operand made inside the region is
transposed on the Tensor Engine first, as P is before P @ V), the softmax, scaling and
masking on the Vector and Scalar engines, with the eager table's steps. Emitting op by
op over the chunks pipelines the engines: the Tensor Engine computes the next chunk's
scores while the Vector Engine normalises this one's. Only values read outside the
region are stored.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from collections.abc import Set as AbstractSet

import torch
from neuron_explorer.backend.compiler.fusion import FusionGroup, is_batched_matmul
from neuron_explorer.backend.compiler.op_keys import node_key, node_value, tensor_sig
from neuron_explorer.backend.compiler.stream_steps import steps_for
from neuron_explorer.backend.hardware import Gemm, KernelBuilder, emit_gemm
from neuron_explorer.backend.hardware.streaming import stream
from torch import fx

MAX_CHUNKS = 8  # groups of heads the region is pipelined over


def _dtype(node: fx.Node) -> str:
    val = node_value(node)
    return str(val.dtype).removeprefix("torch.") if isinstance(val, torch.Tensor) else "float32"


def _numel(node: fx.Node, binding: dict | None) -> int:
    sig = tensor_sig(node_value(node), binding)
    return math.prod(sig[0]) if sig is not None else 0


def _bytes(node: fx.Node, binding: dict | None) -> int:
    sig = tensor_sig(node_value(node), binding)
    return math.prod(sig[0]) * sig[1].itemsize if sig is not None else 0


def _batch(group: FusionGroup, binding: dict | None) -> int:
    """Matrices per batched matmul (batch x heads), the count the region chunks over."""
    sizes = [1]
    for n in group.nodes:
        if is_batched_matmul(n):
            sig = tensor_sig(node_value(n), binding)
            assert sig is not None  # a batched matmul's value is a tensor
            sizes.append(sig[0][0])
    return max(sizes)


def emit_region(b: KernelBuilder, group: FusionGroup, binding: dict | None,
                enter: Callable[[fx.Node], None] | None = None,
                on_chip: AbstractSet[fx.Node] = frozenset()) -> None:
    """Emit `group` (an ATTENTION group) into `b`; `enter(node)` is called before each
    op's instructions (the program labels them with that op); inputs in `on_chip` are
    already in SBUF."""
    members = set(group.nodes)
    chunks = max(1, min(_batch(group, binding), MAX_CHUNKS))
    loads: dict[fx.Node, tuple[int, ...]] = {}
    for src in group.inputs_of(group.nodes):
        if src in on_chip:
            continue
        if enter is not None:
            enter(next(n for n in group.nodes if src in group.reads.get(n, ())))
        loads[src] = b.dma_load(_bytes(src, binding))
    done: dict[fx.Node, list[tuple[int, ...]]] = {}
    for node in group.nodes:
        if enter is not None:
            enter(node)
        sources = group.reads.get(node, [])
        inside = [s for s in sources if s in members]
        outside: tuple[int, ...] = tuple(i for s in sources if s not in members
                                         for i in loads.get(s, ()))
        tails = []
        for c in range(chunks):
            deps = outside + tuple(i for s in inside for i in done[s][c])
            if is_batched_matmul(node):
                tail = _matmul(b, node, binding, chunks, deps, group, members)
            else:
                tail = _score_math(b, node, binding, chunks, deps, len(inside))
            if node in group.outputs:
                tail = b.dma_store(_bytes(node, binding) // chunks, deps=tail)
            tails.append(tail or deps)
        done[node] = tails


def _matmul(b: KernelBuilder, node: fx.Node, binding: dict | None, chunks: int,
            deps: tuple[int, ...], group: FusionGroup, members: set[fx.Node]) -> tuple[int, ...]:
    (a_shape, a_dtype), (w_shape, _) = node_key(node, binding)[1][:2]
    batch, m, k = a_shape[0], a_shape[1], a_shape[2]
    n = w_shape[-1]
    nb = max(1, -(-batch // chunks))
    dtype = str(a_dtype).removeprefix("torch.")
    a_src = group.reads.get(node, [None])[0]
    if a_src in members:
        # Made on chip with its rows on the partitions: the contraction needs it the
        # other way round.
        deps = b.transpose(m * nb, k, dtype, deps)
    # Scores only the score math reads stay in PSUM; anything else is copied to SBUF.
    readers_inside = all(u in members and not is_batched_matmul(u) for u in _readers(node))
    gemm = Gemm(m=m, k=k, n=n, dtype=dtype, out_dtype=_dtype(node), batch=nb, a_bytes=0,
                b_bytes=0, load_a=False, load_b=False, store=False,
                evacuate=not readers_inside or node in group.outputs)
    return emit_gemm(b, gemm, deps=deps)


def _readers(node: fx.Node) -> list[fx.Node]:
    out = []
    for user in node.users:
        if isinstance(user.target, torch._ops.OpOverload) and user.target.is_view:
            out.extend(_readers(user))
        else:
            out.append(user)
    return out


def _score_math(b: KernelBuilder, node: fx.Node, binding: dict | None, chunks: int,
                deps: tuple[int, ...], resident: int) -> tuple[int, ...]:
    values = [node_value(a) for a in node.all_input_nodes]
    tensors = [t for t in values if isinstance(t, torch.Tensor)]
    out = node_value(node)
    converts = bool(tensors) and isinstance(out, torch.Tensor) and out.dtype != tensors[0].dtype
    target = node.target
    assert isinstance(target, torch._ops.OpOverload)  # region members are aten ops
    steps = steps_for(str(target._schema.name), len(tensors), converts) or []
    if not steps:
        return deps
    return stream(b, max(1, _numel(node, binding) // chunks), _dtype(node), steps, deps=deps,
                  resident_inputs=max(resident, 1))
