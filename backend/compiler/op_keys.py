"""The eager op key of an FX node: the same signature the eager path would lower.

A compiled graph's kernels must cost exactly what the eager path's would for the
same work, so each node is described as the runtime's `OpKey`
(name, input (shape, dtype)s, output (shape, dtype)s, attrs), built the way eager
dispatch builds it, from the shapes FakeTensor propagation left in `node.meta`.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from neuron_explorer.backend.compiler.shapes import concrete_shape
from torch import fx

# Non-tensor arguments that do not change an op's device cost (as in eager dispatch).
_NOT_ATTRS = frozenset({"generator", "device", "pin_memory", "layout", "non_blocking"})

TensorSig = tuple[tuple[int, ...], torch.dtype]


def tensor_sig(value: object, binding: dict | None) -> TensorSig | None:
    """(shape, dtype) of a FakeTensor, with symbolic sizes made concrete."""
    if isinstance(value, torch.Tensor):
        return concrete_shape(value.shape, binding), value.dtype
    return None


def node_value(node: fx.Node) -> object:
    return node.meta.get("val")


def _tensor_args(values: object) -> Iterator[fx.Node]:
    if isinstance(values, fx.Node):
        yield values
    elif isinstance(values, (list, tuple)):
        for v in values:
            yield from _tensor_args(v)


def input_sigs(node: fx.Node, binding: dict | None) -> tuple[TensorSig, ...]:
    sigs = []
    for arg in [*node.args, *node.kwargs.values()]:
        for src in _tensor_args(arg):
            sig = tensor_sig(node_value(src), binding)
            if sig is not None:
                sigs.append(sig)
    return tuple(sigs)


def output_sigs(node: fx.Node, binding: dict | None) -> tuple[TensorSig, ...]:
    val = node_value(node)
    values = val if isinstance(val, (list, tuple)) else [val]
    return tuple(s for s in (tensor_sig(v, binding) for v in values) if s is not None)


def _attr_value(value: object) -> object | None:
    if isinstance(value, torch.SymInt):
        return None
    if isinstance(value, (bool, int, str)):
        return value
    # ints (sizes, strides) or bools (a backward's output_mask: which grads it computes)
    if isinstance(value, (list, tuple)) and value and (
            all(type(v) is int for v in value) or all(type(v) is bool for v in value)):
        return tuple(value)
    return None


def node_attrs(node: fx.Node) -> tuple:
    """The cost-relevant non-tensor arguments, keyed by schema argument name."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return ()
    names = [a.name for a in target._schema.arguments]
    out = []
    for i, v in enumerate(node.args):
        value = _attr_value(v)
        if value is not None and i < len(names):
            out.append((names[i], value))
    for k, v in node.kwargs.items():
        if k in _NOT_ATTRS or v is None or isinstance(v, (fx.Node, float)):
            continue
        value = _attr_value(v)
        out.append((k, value if value is not None else str(v)))
    return tuple(out)


# Functionalized ops AOTAutograd emits, named as the eager op that does the same work.
_EAGER_NAMES = {
    "aten::_native_batch_norm_legit_functional": "aten::_native_batch_norm_legit",
}


def op_name(node: fx.Node) -> str:
    """The aten name eager dispatch would record for this node's op."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        name = target._schema.name
        return _EAGER_NAMES.get(name, name)
    return getattr(target, "__name__", str(target))


def node_key(node: fx.Node, binding: dict | None = None) -> tuple:
    """The runtime OpKey the eager path would build for this node."""
    target = node.target
    outputs = output_sigs(node, binding)
    if isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable and not outputs:
        # what it writes, as eager dispatch keys it: self, or a whole first list
        first = node.args[0] if node.args else None
        written = input_sigs(node, binding)
        outputs = written[:len(first)] if isinstance(first, (list, tuple)) else written[:1]
    return (op_name(node), input_sigs(node, binding), outputs, node_attrs(node))
