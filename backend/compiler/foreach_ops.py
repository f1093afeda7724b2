"""`torch._foreach_*` ops in compiled graphs, as one op per tensor.

An optimizer's step and `clip_grad_norm_` run as foreach ops: each passes over every
tensor of its lists once. Kept whole in a graph, each would be a kernel of its own that
loads all of its inputs from HBM and stores all of its results back, so a compiled SGD
step ran slower than its eager foreach kernels (the write-backs of the updated
parameters on top). A compiler for the chip, like Inductor's foreach lowering, sees
through them: rewritten as their per-tensor ops, each parameter's chain (the momentum's
multiply and add, the parameter's add, their write-backs) fuses into one pass over that
parameter's memory. The values are the same: ATen's own slow path for a foreach op
loops over these per-tensor ops (and the host still runs the graph as traced).

The graph is rewritten after AOTAutograd has traced it (`expand`), not through its
decomposition table: traced per tensor, a float learning rate would stay symbolic where
the foreach op specializes it, and Dynamo would stop recompiling the optimizer step for
each value as it does with PyTorch's own compilers.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from functools import cache

import torch
import torch.utils._pytree as pytree
from neuron_explorer.backend.compiler.fusion import FOREACH_PIECE
from torch import fx
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten


def _norm(tensor: torch.Tensor, ord: float = 2, dtype: torch.dtype | None = None) -> torch.Tensor:
    # `_foreach_norm`'s third argument is the dtype, `linalg_vector_norm`'s the dims
    return aten.linalg_vector_norm(tensor, ord, dtype=dtype)


# foreach ops whose per-tensor op has another name, and is called another way
_RENAMED = {"norm": "linalg_vector_norm"}
_PER_TENSOR = {"norm": _norm}
# overloads with a scalar where the per-tensor op takes tensors only
_SCALAR_FORMS = {"_foreach_maximum": aten.clamp_min, "_foreach_minimum": aten.clamp_max}
# overloads whose per-tensor form needs a value read from a tensor (`scalars[i]` as a
# Scalar), or a foreach op with no per-tensor op: kept whole
_KEPT = {"_foreach_addcmul.Tensor", "_foreach_addcdiv.Tensor", "_foreach_powsum"}


def expand(gm: fx.GraphModule) -> int:
    """Rewrite each foreach op of `gm`'s graph (static shapes) as its per-tensor ops, in
    place; returns how many were rewritten."""
    table = decompositions()
    rewritten = 0
    for node in list(gm.graph.nodes):
        decomposed = table.get(node.target) if node.op == "call_function" else None
        if decomposed is None or not _expandable(node):
            continue
        calls = _per_tensor_calls(node, decomposed)
        if calls is None:
            continue
        with gm.graph.inserting_before(node):
            results = []
            for place, (op, args, kwargs, value) in enumerate(calls):
                piece = gm.graph.call_function(op, args, kwargs)
                # its source line and module too; its own value; whose piece it is
                piece.meta = {**{k: v for k, v in node.meta.items() if k != "tensor_meta"},
                              "val": value, FOREACH_PIECE: (node.name, place)}
                results.append(piece)
        for user in list(node.users):
            user.replace_all_uses_with(results[int(user.args[1])])
            gm.graph.erase_node(user)
        gm.graph.erase_node(node)
        rewritten += 1
    if rewritten:
        gm.graph.lint()
        gm.recompile()
    return rewritten


class _TopLevelCalls(TorchDispatchMode):
    """Keeps the ops called on the values it sees, not what they run inside (a fake
    tensor's op may run as its reference decomposition: `lerp` as a `sub`, a `full_like`
    and an `addcmul`, where the chip runs one lerp)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        value = func(*args, **kwargs)
        self.calls.append((func, args, kwargs, value))
        return value


def _per_tensor_calls(node: fx.Node, decomposed: Callable) -> list[tuple] | None:
    """(op, args, kwargs, value) of each per-tensor op of foreach `node`, its arguments
    the graph's nodes; None where a piece reads a value that is not one of them."""
    tensors, rebuild = _tensor_leaves(node)
    node_of = {id(t.meta["val"]): t for t in tensors}
    args, kwargs = rebuild([t.meta["val"] for t in tensors])
    with _TopLevelCalls() as seen:
        decomposed(*args, **kwargs)
    calls = []
    for op, op_args, op_kwargs, value in seen.calls:
        leaves, spec = pytree.tree_flatten((op_args, op_kwargs))
        if any(isinstance(v, torch.Tensor) and id(v) not in node_of for v in leaves):
            return None
        mapped = [node_of[id(v)] if isinstance(v, torch.Tensor) else v for v in leaves]
        new_args, new_kwargs = pytree.tree_unflatten(mapped, spec)
        calls.append((op, new_args, new_kwargs, value))
    return calls


def _expandable(node: fx.Node) -> bool:
    """Read only through `getitem`, every value static in shape."""
    if any(u.target is not operator.getitem for u in node.users):
        return False
    values = [a.meta.get("val") for a in node.all_input_nodes]
    return all(isinstance(v, torch.Tensor) and all(type(d) is int for d in v.shape)
               for v in values)


def _tensor_leaves(node: fx.Node) -> tuple[list[fx.Node], Callable]:
    """The nodes among a node's arguments (lists flattened), and a function that puts
    values for them back in the arguments' places: (args, kwargs)."""
    leaves, spec = pytree.tree_flatten((node.args, node.kwargs))
    where = [i for i, leaf in enumerate(leaves) if isinstance(leaf, fx.Node)]

    def rebuild(values: Sequence[object]) -> tuple:
        filled = list(leaves)
        for i, value in zip(where, values, strict=True):
            filled[i] = value
        return pytree.tree_unflatten(filled, spec)

    return [leaves[i] for i in where], rebuild


@cache
def decompositions() -> dict[object, Callable]:
    """Every functional foreach overload with a per-tensor op, as that op per tensor."""
    out: dict[object, Callable] = {}
    for name in sorted(_foreach_names()):
        base = name[len("_foreach_"):]
        per_tensor = _PER_TENSOR.get(base) or getattr(aten, base, None)
        if per_tensor is None or name in _KEPT:
            continue
        packet = getattr(aten, name)
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if op._schema.is_mutable or f"{name}.{overload}" in _KEPT:
                continue
            scalar_form = _SCALAR_FORMS.get(name) if overload.startswith("Scalar") else None
            out[op] = _per_tensor(scalar_form or per_tensor)
    return out


def per_tensor_name(name: str, shared: Sequence[object] = ()) -> str | None:
    """The op a recorded foreach op ("aten::_foreach_mul_") runs as per tensor in a
    compiled graph ("aten::mul_"); None for an op this module keeps whole or no foreach
    op. `shared`: the inputs it takes besides its lists (`_foreach_mul_`'s scalar
    tensor; `_foreach_addcmul_`'s tensor of a value per tensor, its `.Tensor` overload,
    kept whole). The what-if replay fuses a recorded foreach op's work as the compile
    path does."""
    prefix, _, op = name.rpartition("::")
    functional = op.rstrip("_")
    if (not op.startswith("_foreach_") or functional in _KEPT
            or (shared and f"{functional}.Tensor" in _KEPT)):
        return None
    base = op[len("_foreach_"):]
    per_tensor = base.rstrip("_")
    if per_tensor in _RENAMED:
        base = _RENAMED[per_tensor]
    elif not hasattr(aten, per_tensor):
        return None
    return f"{prefix}::{base}" if prefix else base


def _foreach_names() -> set[str]:
    """The functional foreach ops this build of PyTorch has ("_foreach_add", ...)."""
    return {s.name.split("::", 1)[1] for s in torch._C._jit_get_all_schemas()
            if s.name.startswith("aten::_foreach_") and not s.name.endswith("_")}


def _per_tensor(op: Callable) -> Callable:
    """A foreach op as `op` once per tensor: every argument that is a list as long as
    the first list (tensors, or a scalar per tensor) is indexed, the others shared; an
    argument the foreach op takes by position and `op` by keyword only (`addcmul`'s
    value) passed by its name."""
    positional, keyword_only = _parameters(op)

    def decomposed(*args: object, **kwargs: object) -> list:
        n = next(len(a) for a in args if isinstance(a, (list, tuple)))
        out = []
        for i in range(n):
            mine = [a[i] if isinstance(a, (list, tuple)) and len(a) == n else a for a in args]
            named = dict(zip(keyword_only, mine[positional:], strict=False))
            out.append(op(*mine[:positional], **named, **kwargs))
        return out

    return decomposed


def _parameters(op: Callable) -> tuple[int, list[str]]:
    """How many arguments `op` takes by position (the most of any overload), and the
    names of those it takes by keyword only (but `out`)."""
    overloads = [getattr(op, o) for o in getattr(op, "overloads", list)()]
    if not overloads:  # a function of this module
        return 3, []
    positional = max(sum(not a.kwarg_only for a in o._schema.arguments) for o in overloads)
    keyword_only = [a.name for a in overloads[0]._schema.arguments
                    if a.kwarg_only and a.name != "out"]
    return positional, keyword_only
