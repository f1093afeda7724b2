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
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, Protocol

import torch
from neuron_explorer.backend.compiler.fusion import FusionGroup, is_batched_matmul
from neuron_explorer.backend.compiler.op_keys import node_key, node_value, tensor_sig
from neuron_explorer.backend.compiler.stream_steps import steps_for
from neuron_explorer.backend.hardware import Gemm, KernelBuilder, emit_gemm
from neuron_explorer.backend.hardware.streaming import Step, stream
from torch import fx

MAX_CHUNKS = 8  # groups of heads the region is pipelined over

Op = Any  # a member of a region, or a value it reads (hashable)


class Region(Protocol):
    """What the emission reads of a region: the compile path's fusion group (`FxRegion`)
    or a recorded program's ops (what_if/fused_program.py)."""

    @property
    def members(self) -> Sequence[Op]:
        """In program order."""

    def reads(self, op: Op) -> Sequence[Op]:
        """The values `op` reads: members, or values made outside the region."""

    def stored(self, op: Op) -> bool:
        """Whether `op`'s result is read outside the region (stored to HBM)."""

    def nbytes(self, value: Op) -> int: ...

    def numel(self, op: Op) -> int: ...

    def dtype(self, op: Op) -> str: ...

    def is_matmul(self, op: Op) -> bool:
        """A batched matmul, [batch, m, k] @ [batch, k, n]."""

    def matmul_dims(self, op: Op) -> tuple[int, int, int, int, str]:
        """batch, m, k, n and the operands' dtype."""

    def score_math_only(self, op: Op) -> bool:
        """Whether only the region's score math (not a matmul, nothing outside) reads `op`."""

    def steps(self, op: Op) -> list[Step]:
        """Per-tile steps of a score-math op ([]: no device work)."""


def emit_region(b: KernelBuilder, region: Region,
                enter: Callable[[Op], None] | None = None,
                on_chip: AbstractSet[Op] = frozenset()) -> None:
    """Emit `region` into `b`; `enter(op)` is called before each op's instructions (the
    program labels them with that op); inputs in `on_chip` are already in SBUF."""
    members = set(region.members)
    batch = max([1] + [region.matmul_dims(n)[0] for n in region.members if region.is_matmul(n)])
    chunks = max(1, min(batch, MAX_CHUNKS))
    loads: dict[Op, tuple[int, ...]] = {}
    for node in region.members:
        for src in region.reads(node):
            if src in members or src in on_chip or src in loads:
                continue
            if enter is not None:
                enter(node)
            loads[src] = b.dma_load(region.nbytes(src))
    done: dict[Op, list[tuple[int, ...]]] = {}
    for node in region.members:
        if enter is not None:
            enter(node)
        sources = region.reads(node)
        inside = [s for s in sources if s in members]
        outside: tuple[int, ...] = tuple(i for s in sources if s not in members
                                         for i in loads.get(s, ()))
        tails = []
        for c in range(chunks):
            deps = outside + tuple(i for s in inside for i in done[s][c])
            if region.is_matmul(node):
                tail = _matmul(b, region, node, chunks, deps, members)
            else:
                tail = _score_math(b, region, node, chunks, deps, len(inside))
            if region.stored(node):
                tail = b.dma_store(region.nbytes(node) // chunks, deps=tail)
            tails.append(tail or deps)
        done[node] = tails


def _matmul(b: KernelBuilder, region: Region, node: Op, chunks: int, deps: tuple[int, ...],
            members: set[Op]) -> tuple[int, ...]:
    batch, m, k, n, dtype = region.matmul_dims(node)
    nb = max(1, -(-batch // chunks))
    a_src = next(iter(region.reads(node)), None)
    if a_src in members:
        # Made on chip with its rows on the partitions: the contraction needs it the
        # other way round.
        deps = b.transpose(m * nb, k, dtype, deps)
    # Scores only the score math reads stay in PSUM; anything else is copied to SBUF.
    gemm = Gemm(m=m, k=k, n=n, dtype=dtype, out_dtype=region.dtype(node), batch=nb,
                a_bytes=0, b_bytes=0, load_a=False, load_b=False, store=False,
                evacuate=not region.score_math_only(node) or region.stored(node))
    return emit_gemm(b, gemm, deps=deps)


def _score_math(b: KernelBuilder, region: Region, node: Op, chunks: int,
                deps: tuple[int, ...], resident: int) -> tuple[int, ...]:
    steps = region.steps(node)
    if not steps:
        return deps
    return stream(b, max(1, region.numel(node) // chunks), region.dtype(node), steps,
                  deps=deps, resident_inputs=max(resident, 1))


class FxRegion:
    """An ATTENTION fusion group of a graph, for `emit_region`."""

    def __init__(self, group: FusionGroup, binding: dict | None) -> None:
        self.group = group
        self.binding = binding
        self.members = group.nodes
        self._members = set(group.nodes)
        self._stored = set(group.outputs)

    def reads(self, op: fx.Node) -> list[fx.Node]:
        return self.group.reads.get(op, [])

    def stored(self, op: fx.Node) -> bool:
        return op in self._stored

    def nbytes(self, value: fx.Node) -> int:
        sig = tensor_sig(node_value(value), self.binding)
        return math.prod(sig[0]) * sig[1].itemsize if sig is not None else 0

    def numel(self, op: fx.Node) -> int:
        sig = tensor_sig(node_value(op), self.binding)
        return math.prod(sig[0]) if sig is not None else 0

    def dtype(self, op: fx.Node) -> str:
        val = node_value(op)
        return str(val.dtype).removeprefix("torch.") if isinstance(val, torch.Tensor) \
            else "float32"

    def is_matmul(self, op: fx.Node) -> bool:
        return is_batched_matmul(op)

    def matmul_dims(self, op: fx.Node) -> tuple[int, int, int, int, str]:
        (a_shape, a_dtype), (w_shape, _) = node_key(op, self.binding)[1][:2]
        return (a_shape[0], a_shape[1], a_shape[2], w_shape[-1],
                str(a_dtype).removeprefix("torch."))

    def score_math_only(self, op: fx.Node) -> bool:
        return all(u in self._members and not is_batched_matmul(u) for u in _readers(op))

    def steps(self, op: fx.Node) -> list[Step]:
        values = [node_value(a) for a in op.all_input_nodes]
        tensors = [t for t in values if isinstance(t, torch.Tensor)]
        out = node_value(op)
        converts = bool(tensors) and isinstance(out, torch.Tensor) \
            and out.dtype != tensors[0].dtype
        target = op.target
        assert isinstance(target, torch._ops.OpOverload)  # region members are aten ops
        return steps_for(str(target._schema.name), len(tensors), converts) or []


def _readers(node: fx.Node) -> list[fx.Node]:
    out = []
    for user in node.users:
        if isinstance(user.target, torch._ops.OpOverload) and user.target.is_view:
            out.extend(_readers(user))
        else:
            out.append(user)
    return out
