"""Fusion decisions: a pure function from an FX graph of aten ops to fusion groups.

A group becomes one device kernel. Chains of elementwise and reduction ops share a
group, so their intermediates stay in SBUF; a matmul (or convolution) takes the
elementwise ops that consume its result as an epilogue (bias, activation,
residual). Views cost nothing and belong to no group. Ops we cannot fuse (attention,
embeddings, gathers, concatenation, ...) get a kernel of their own.

Nothing here touches a device: the decisions depend on the graph alone (and the
shapes in `node.meta["val"]` where present), so they can be tested on any graph.
"""

from __future__ import annotations

import enum
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from neuron_explorer.common.op_families import GEMM
from torch import fx

aten = torch.ops.aten

# A group holds at most this many compute ops: the kernel's instruction stream and
# its SBUF working set stay bounded, as a real compiler's would.
MAX_GROUP_OPS = 48


# the meta key `foreach_ops.expand` marks a foreach op's per-tensor pieces with:
# (the foreach node's name, the piece's place in its lists)
FOREACH_PIECE = "foreach_piece"


class OpKind(enum.Enum):
    """How an op takes part in fusion."""

    VIEW = "view"  # metadata only: no kernel, no data movement
    ELEMENTWISE = "elementwise"  # fuses with producers and consumers
    REDUCTION = "reduction"  # fuses with elementwise producers and consumers
    MATMUL = "matmul"  # anchors a group; takes an elementwise epilogue
    ATTENTION = "attention"  # batched matmuls and the score math between them, on chip
    OPAQUE = "opaque"  # a kernel of its own
    CONSTANT = "constant"  # computed at compile time: program data, no device work


# Matmuls whose result can stay on chip for an elementwise epilogue: the GEMMs.
_EPILOGUE_ANCHORS = {getattr(aten, name).default for name in GEMM}
# Group anchors: the GEMMs and the convolutions as AOTAutograd's graphs hold them. The
# other matmuls (vector products, addbmm) keep a kernel of their own.
_MATMULS = _EPILOGUE_ANCHORS | {aten.convolution.default, aten.convolution_backward.default}

# Ops without the `reduction` tag that a vector engine computes row by row, like a
# reduction followed by elementwise work: they fuse the same way.
_ROW_REDUCTIONS = {
    aten.native_layer_norm.default,
    aten.native_layer_norm_backward.default,
    aten._softmax.default,
    aten._safe_softmax.default,
    aten._log_softmax.default,
    aten._softmax_backward_data.default,
    aten._log_softmax_backward_data.default,
    aten.native_batch_norm.default,
    aten._native_batch_norm_legit_functional.default,
    aten._native_batch_norm_legit_no_training.default,
    aten.native_batch_norm_backward.default,
    aten.var_mean.correction,
}

# Ops that are not pointwise by tag but move or create data elementwise.
_ELEMENTWISE_EXTRA = {
    aten._to_copy.default,
    aten.copy_.default,
    aten.copy.default,
    aten.full.default,
    aten.full_like.default,
    aten.zeros.default,
    aten.zeros_like.default,
    aten.ones_like.default,
    aten.scalar_tensor.default,
    aten.native_dropout.default,
    aten.native_dropout_backward.default,
    aten.lift_fresh_copy.default,
    aten.select_backward.default,
    aten.slice_backward.default,
}

# Not views by schema, but metadata-only when their input is contiguous, as it is
# in the graphs AOTAutograd hands us.
_VIEW_EXTRA = {aten._unsafe_view.default, aten.lift_fresh.default}

# Batched matmuls: the matmuls of attention (scores, then probabilities @ values, and
# their gradients). With the score math between them they form one on-chip region.
_BATCHED_MATMULS = {aten.bmm.default}
# A region keeps its operands and intermediates in SBUF: it stays within this share.
ATTENTION_SBUF_SHARE = 0.5
SBUF_BYTES = 24 * 1024 * 1024  # the smallest preset's SBUF (trn1)


def reaches(start: int, target: int, reads: Callable[[int], Iterable[int]]) -> bool:
    """Whether group `target` is `start` or a group it reads from (`reads(g)`: the groups
    g reads), directly or not: a group that joined it would read its own output."""
    stack, seen = [start], set()
    while stack:
        g = stack.pop()
        if g == target:
            return True
        if g not in seen:
            seen.add(g)
            stack.extend(reads(g))
    return False


def independent(groups: Iterable[int], reads: Callable[[int], Iterable[int]]) -> bool:
    """Whether none of `groups` reads another of them, directly or not (one walk from
    each: a few hundred parameters' pieces are checked in linear time, not in pairs)."""
    members = set(groups)
    for start in members:
        stack, seen = list(reads(start)), set()
        while stack:
            g = stack.pop()
            if g in members:
                return False
            if g not in seen:
                seen.add(g)
                stack.extend(reads(g))
    return True


def dependency_order(reads: dict[int, Iterable[int]]) -> list[int]:
    """The groups (keys) ordered so each comes after those it reads, the lowest first
    where free (an op that joined an early group may read a later one)."""
    pending = {g: set(deps) for g, deps in reads.items()}
    ordered = []
    while pending:
        ready = min(g for g, deps in pending.items() if not deps)
        del pending[ready]
        for deps in pending.values():
            deps.discard(ready)
        ordered.append(ready)
    return ordered


def kind_of_op(op_name: str) -> OpKind:
    """How a recorded aten op `op_name` ("aten::relu_", "max_pool2d_with_indices") takes part
    in fusion, as `classify` says of its node in an AOTAutograd graph, where an in-place op
    is its functional form ("relu_" as "relu"): the what-if's compiled replay fuses an
    eager recording's ops with it."""
    name = op_name.removeprefix("aten::")
    if name.endswith("_") and not name.endswith("__") and hasattr(aten, name[:-1]):
        name = name[:-1]
    packet = getattr(aten, name, None)
    if packet is None:
        return OpKind.OPAQUE
    return _kind_of([getattr(packet, o) for o in packet.overloads()])


def _kind_of(overloads: list) -> OpKind:
    """How ops of these overloads (a node's one, or every overload of a recorded op's name)
    take part in fusion."""
    if any(o in _BATCHED_MATMULS for o in overloads):
        return OpKind.ATTENTION
    if any(o in _MATMULS for o in overloads):
        return OpKind.MATMUL
    if overloads and all(o.is_view or o in _VIEW_EXTRA for o in overloads):
        return OpKind.VIEW
    if any(o in _ROW_REDUCTIONS or torch.Tag.reduction in o.tags for o in overloads):
        return OpKind.REDUCTION
    if any(torch.Tag.pointwise in o.tags or o in _ELEMENTWISE_EXTRA for o in overloads):
        return OpKind.ELEMENTWISE
    return OpKind.OPAQUE


def is_write_back(node: fx.Node) -> bool:
    """A `copy_` into a graph input, as AOTAutograd ends a graph that mutates its inputs
    (an optimizer's parameters, BatchNorm's running stats): it stores its value to that
    input's memory, read or not by anything after it."""
    return node.target is aten.copy_.default


def is_batched_matmul(node: fx.Node) -> bool:
    return node.target in _BATCHED_MATMULS


def is_constant(node: fx.Node, constant: set[fx.Node]) -> bool:
    """Whether `node`'s value is known at compile time: a deterministic op whose tensor
    inputs are all such constants (factories like ones, full, arange, scalar_tensor,
    and what is computed from them, such as a tril mask)."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return False
    if not isinstance(node.meta.get("val"), torch.Tensor):
        return False
    if torch.Tag.nondeterministic_seeded in target.tags or target._schema.is_mutable:
        return False
    return all(a in constant for a in node.all_input_nodes)


def classify(node: fx.Node) -> OpKind:
    """Say how `node` takes part in fusion."""
    target = node.target
    if target is operator.getitem:
        return OpKind.VIEW
    if not isinstance(target, torch._ops.OpOverload):
        # Host-side arithmetic on sizes (SymInt math) does no device work.
        return OpKind.OPAQUE if isinstance(node.meta.get("val"), torch.Tensor) else OpKind.VIEW
    return _kind_of([target])


@dataclass
class FusionGroup:
    """Ops that become one kernel, with the values it reads from and writes to HBM."""

    group_id: int
    kind: OpKind  # ELEMENTWISE (incl. reductions), MATMUL or OPAQUE
    nodes: list[fx.Node] = field(default_factory=list)  # compute ops, in graph order
    inputs: list[fx.Node] = field(default_factory=list)  # values loaded from HBM
    outputs: list[fx.Node] = field(default_factory=list)  # values stored to HBM
    reads: dict[fx.Node, list[fx.Node]] = field(default_factory=dict)  # member -> values it reads
    # pieces of the same foreach ops side by side (`_Planner._side_by_side`): one stream
    # over all of their elements, each piece's chain of ops in `nodes` in turn
    chains: list[list[fx.Node]] = field(default_factory=list)

    def inputs_of(self, members: list[fx.Node]) -> list[fx.Node]:
        """The values `members` read from outside the group (HBM loads)."""
        inside = set(self.nodes)
        found = [v for m in members for v in self.reads.get(m, ()) if v not in inside]
        return list(dict.fromkeys(found))

    @property
    def is_attention(self) -> bool:
        """Attention proper: scores, a softmax (or its gradient) and a second product."""
        return (self.kind is OpKind.ATTENTION
                and sum(n.target in _BATCHED_MATMULS for n in self.nodes) >= 2
                and any("softmax" in _short_name(n) for n in self.nodes))

    @property
    def anchor(self) -> fx.Node | None:
        """The matmul of a MATMUL group."""
        return self.nodes[0] if self.kind is OpKind.MATMUL else None

    @property
    def name(self) -> str:
        """A kernel name that says what was fused, e.g. "fused_mm_add_gelu"."""
        if self.chains:
            parts = [_short_name(n) for n in self.chains[0]]
            return f"foreach_{'_'.join(parts[:6])}_x{len(self.chains)}"
        parts = [_short_name(n) for n in self.nodes]
        if len(parts) == 1:
            return parts[0]
        if self.is_attention:
            backward = any("backward" in p for p in parts)
            return "flash_attention_backward" if backward else "flash_attention"
        shown = parts[:6] + ([f"{len(parts) - 6}more"] if len(parts) > 6 else [])
        return "fused_" + "_".join(shown)


def _short_name(node: fx.Node) -> str:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return target.overloadpacket.__name__.strip("_")
    return getattr(target, "__name__", str(target))


def _bytes(node: fx.Node) -> int | None:
    """Bytes of a node's tensor; None when unknown (symbolic sizes: reading them here
    would add guards to the graph)."""
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor) and all(type(d) is int for d in val.shape):
        return val.numel() * val.element_size()
    return None


def _fits_on_chip(node: fx.Node) -> bool:
    """Whether a node's operands and result fit in an attention region's SBUF share."""
    sizes = [_bytes(n) for n in [*node.all_input_nodes, node]]
    known = [s for s in sizes if s is not None]
    return len(known) == len(sizes) and sum(known) <= ATTENTION_SBUF_SHARE * SBUF_BYTES


def _batched(node: fx.Node) -> bool:
    """Work over a batch of matrices (heads): rank 3 or more."""
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and val.dim() >= 3


def _numel(node: fx.Node) -> int | None:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return val.numel()
    return None


def _pieces_signature(group: FusionGroup) -> tuple | None:
    """What a stream of foreach pieces runs: per member, its op and the foreach op it is
    a piece of (a write-back, the `copy_` of a piece's value); None for any other group."""
    if group.kind is not OpKind.ELEMENTWISE or group.chains:
        return None
    signature = []
    for node in group.nodes:
        origin = node.meta.get(FOREACH_PIECE)
        if origin is None and not is_write_back(node):
            return None
        signature.append((node.target, origin[0] if origin else None))
    if all(origin is None for _, origin in signature):
        return None
    return tuple(signature)


def one_iteration_space(size: int | None, read: list[int | None], spans: list[int | None],
                        sizes: list[int | None]) -> bool:
    """Whether an elementwise op or reduction passing over `size` elements may join a
    stream group (`_Planner._one_iteration_space`): `read`, the sizes of the values it
    reads from the group; `spans` and `sizes`, the most elements each member passes over
    and its result's (None: not known)."""
    if size is None or size in read or None in read:
        return True
    known = [s for s in spans if s is not None]
    if len(known) < len(spans) or size == max(known):
        return True
    return all(s in (0, 1) for s in sizes)


def _static_numel(node: fx.Node) -> int | None:
    """A node's tensor's element count; None when not a tensor or symbolic (reading a
    symbolic size here would add guards to the graph)."""
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor) and all(type(d) is int for d in val.shape):
        return val.numel()
    return None


def _touched(node: fx.Node) -> int | None:
    """The most elements a node's op passes over: its result's, or its largest input's
    (a reduction's)."""
    own = _static_numel(node)
    if own is None:
        return None
    inputs = (_static_numel(n) for n in node.all_input_nodes)
    return max([own, *(s for s in inputs if s is not None)])


class _Planner:
    """Greedy fusion over the graph in topological order."""

    def __init__(self, graph: fx.Graph, can_fuse: Callable[[fx.Node], bool] | None) -> None:
        self.graph = graph
        self.kind = {n: classify(n) for n in graph.nodes if n.op == "call_function"}
        if can_fuse is not None:
            for node, kind in self.kind.items():
                if kind in (OpKind.ELEMENTWISE, OpKind.REDUCTION) and not can_fuse(node):
                    self.kind[node] = OpKind.OPAQUE
        self.constants: set[fx.Node] = set()
        for node in graph.nodes:
            if node in self.kind and is_constant(node, self.constants):
                self.constants.add(node)
                if self.kind[node] is not OpKind.VIEW:
                    self.kind[node] = OpKind.CONSTANT
        self.region_bytes: dict[int, int] = {}  # attention group -> bytes it holds
        for node, kind in self.kind.items():
            # a batched matmul too large to hold on chip is a plain matmul
            if kind is OpKind.ATTENTION and not _fits_on_chip(node):
                self.kind[node] = OpKind.MATMUL
        self.group_of: dict[fx.Node, FusionGroup] = {}
        self.groups: list[FusionGroup] = []
        # Groups each group reads from (directly), to rule out cycles when merging.
        self.reads: dict[int, set[int]] = {}

    def sources(self, node: fx.Node) -> list[fx.Node]:
        """The compute ops (or graph inputs) whose values `node` reads, through views: a
        write-back reads what it writes, not the memory it overwrites."""
        found: list[fx.Node] = []
        for arg in node.all_input_nodes:
            if not (is_write_back(node) and arg is node.args[0]):
                found.extend(self._through_views(arg))
        return list(dict.fromkeys(found))

    def _through_views(self, node: fx.Node) -> list[fx.Node]:
        if self.kind.get(node) is OpKind.VIEW:
            out: list[fx.Node] = []
            for arg in node.all_input_nodes:
                out.extend(self._through_views(arg))
            return out
        return [node]

    def _reaches(self, start: int, target: int) -> bool:
        """Whether group `target` is an ancestor of (or is) group `start`."""
        return reaches(start, target, lambda g: self.reads.get(g, ()))

    def _can_join(self, node: fx.Node, group: FusionGroup, producer_groups: set[int]) -> bool:
        kind = self.kind[node]
        if len(group.nodes) >= MAX_GROUP_OPS:
            return False
        if group.kind is OpKind.OPAQUE:
            return False
        if group.kind is OpKind.ATTENTION:
            if not self._fits_region(node, group):
                return False
        elif kind is OpKind.ATTENTION:
            return False
        elif group.kind is OpKind.MATMUL:
            # An epilogue: elementwise work on the matmul's result, no broadcast to
            # a larger iteration space, and no reduction (it needs whole rows).
            if kind is not OpKind.ELEMENTWISE or group.nodes[0].target not in _EPILOGUE_ANCHORS:
                return False
            size, anchor_size = _numel(node), _numel(group.nodes[0])
            if size is not None and anchor_size is not None and size > anchor_size:
                return False
        elif not self._one_iteration_space(node, group):
            return False
        # Joining must not make the group read from a group that reads from it.
        for other in producer_groups - {group.group_id}:
            if self._reaches(other, group.group_id):
                return False
        return True

    def _one_iteration_space(self, node: fx.Node, group: FusionGroup) -> bool:
        """Whether a stream group and `node` pass over the same elements: `node` reads a
        value of its own size from the group (a chain), or spans the group's elements (a
        softmax's subtraction of its row maxima), or takes a scalar chain's result as
        its operand. Not a tensor scaled by a scalar the group also scales another
        tensor by (clipping's per-parameter multiplies): each tile of one stream would
        run every parameter's step, for parameters of other sizes, so each stays a pass
        of its own over its own memory. Sizes not known (symbolic) do not block."""
        read = [_static_numel(s) for s in self.sources(node) if self.group_of.get(s) is group]
        return one_iteration_space(_touched(node), read,
                                   [_touched(m) for m in group.nodes],
                                   [_static_numel(m) for m in group.nodes])

    def _fits_region(self, node: fx.Node, group: FusionGroup) -> bool:
        """An attention region takes batched work no larger than what it holds, while
        everything it holds fits in SBUF."""
        size = _bytes(node)
        if size is None or not _batched(node):
            return False
        if node.target not in _BATCHED_MATMULS:
            biggest = max((_bytes(n) or 0) for n in group.nodes)
            if size > biggest:
                return False
        held = self.region_bytes.get(group.group_id, 0) + size
        return held <= ATTENTION_SBUF_SHARE * SBUF_BYTES

    def plan(self) -> list[FusionGroup]:
        for node in self.graph.nodes:
            kind = self.kind.get(node)
            if kind is None or kind in (OpKind.VIEW, OpKind.CONSTANT):
                continue
            producers = [self.group_of[s] for s in self.sources(node) if s in self.group_of]
            producer_ids = {g.group_id for g in producers}
            target = None
            if kind in (OpKind.ELEMENTWISE, OpKind.REDUCTION, OpKind.ATTENTION):
                for group in producers:
                    if self._can_join(node, group, producer_ids):
                        target = group
                        break
            if target is None:
                group_kind = OpKind.ELEMENTWISE if kind is OpKind.REDUCTION else kind
                target = FusionGroup(len(self.groups), group_kind)
                self.groups.append(target)
                self.reads[target.group_id] = set()
            target.nodes.append(node)
            if target.kind is OpKind.ATTENTION:
                self.region_bytes[target.group_id] = (self.region_bytes.get(target.group_id, 0)
                                                      + (_bytes(node) or 0))
            self.group_of[node] = target
            self.reads[target.group_id] |= producer_ids - {target.group_id}
        self._side_by_side()
        self._sort_groups()
        self._fill_boundaries()
        return self.groups

    def _side_by_side(self) -> None:
        """Merge the streams that run the same foreach ops' pieces, one a tensor
        (`foreach_ops.expand` marks them), into one stream over all their tensors, as a
        foreach kernel (and Inductor's combo kernels) does: an optimizer's update of each
        parameter is a short stream of its own, and thirty of them, some of a few hundred
        elements, each paid a stream's latency where the foreach kernels spread every
        tensor over the DMA queues at once. Groups where one reads another stay apart."""
        by_chain: dict[tuple, list[FusionGroup]] = {}
        for group in self.groups:
            signature = _pieces_signature(group)
            if signature is not None:
                by_chain.setdefault(signature, []).append(group)
        for siblings in by_chain.values():
            if len(siblings) < 2 or not independent(
                    [g.group_id for g in siblings], lambda g: self.reads.get(g, ())):
                continue
            first, merged = siblings[0], {g.group_id for g in siblings[1:]}
            first.chains = [list(g.nodes) for g in siblings]
            for group in siblings[1:]:
                first.nodes.extend(group.nodes)
                for node in group.nodes:
                    self.group_of[node] = first
                self.reads[first.group_id] |= self.reads.pop(group.group_id)
            self.reads[first.group_id] -= merged | {first.group_id}
            self.groups = [g for g in self.groups if g.group_id not in merged]
            for reads in self.reads.values():  # (the first's own hold none of them now)
                if reads & merged:
                    reads -= merged
                    reads.add(first.group_id)

    def _sort_groups(self) -> None:
        """Order groups so each runs after the groups it reads (a node that joined an
        early group may read a later one), keeping creation order where free."""
        by_id = {g.group_id: g for g in self.groups}
        ordered = [by_id[gid] for gid in dependency_order(
            {g.group_id: self.reads[g.group_id] for g in self.groups})]
        new_id = {g.group_id: i for i, g in enumerate(ordered)}
        self.reads = {new_id[old]: {new_id[r] for r in deps} for old, deps in self.reads.items()}
        for new, group in enumerate(ordered):
            group.group_id = new
        self.groups = ordered

    def _fill_boundaries(self) -> None:
        """Inputs: values a group reads that it does not compute. Outputs: values it
        computes that another group or the graph's output reads."""
        for group in self.groups:
            members = set(group.nodes)
            group.reads = {node: self.sources(node) for node in group.nodes}
            group.inputs = [v for v in group.inputs_of(group.nodes) if v not in members]
        for node in self.graph.nodes:
            if node.op == "call_function" and self.kind.get(node) is OpKind.VIEW:
                continue
            readers = self._readers(node)
            owner = self.group_of.get(node)
            if owner is None:
                continue
            if is_write_back(node) or any(r.op == "output" or self.group_of.get(r) is not owner
                                          for r in readers):
                owner.outputs.append(node)

    def _readers(self, node: fx.Node) -> list[fx.Node]:
        """Nodes that read `node`'s value, looking through views."""
        out: list[fx.Node] = []
        for user in node.users:
            if self.kind.get(user) is OpKind.VIEW:
                out.extend(self._readers(user))
            else:
                out.append(user)
        return out


def plan_fusion(gm: fx.GraphModule | fx.Graph,
                can_fuse: Callable[[fx.Node], bool] | None = None) -> list[FusionGroup]:
    """Split a graph's compute ops into fusion groups, in an order that respects
    their dependencies (each group's inputs are computed by earlier groups).

    `can_fuse` lets the target veto sharing a kernel for elementwise or reduction ops
    it cannot run as part of a stream; they then get a kernel of their own."""
    graph = gm.graph if isinstance(gm, fx.GraphModule) else gm
    return _Planner(graph, can_fuse).plan()
