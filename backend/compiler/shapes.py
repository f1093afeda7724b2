"""Concrete shapes for a graph traced with symbolic sizes (dynamic shapes).

After a size change (or `mark_dynamic`, `dynamic=True`) Dynamo traces a graph with
symbolic sizes (s0, s1, ...); the cost model times kernels of concrete shapes, so at
run time the symbols are bound from the actual inputs and every node's shape is
evaluated, once per distinct binding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, SupportsInt

import sympy
import torch
from torch import fx


def _expr(value: object) -> sympy.Expr | None:
    """The sympy expression behind a SymInt, or None for a plain int."""
    if isinstance(value, torch.SymInt):
        return value.node.expr
    return None


def is_symbolic(gm: fx.GraphModule) -> bool:
    """Whether any placeholder of `gm` has a symbolic size or is a SymInt."""
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt):
            return True
        if isinstance(val, torch.Tensor) and any(_expr(s) is not None for s in val.shape):
            return True
    return False


def unbacked_sizes(gm: fx.GraphModule) -> list[tuple[str, int | None, sympy.Symbol]]:
    """(node name, dim or None for a SymInt value, symbol) where each of the graph's
    data-dependent sizes first appears (nonzero's count, a boolean mask's selection,
    `.item()` under `capture_scalar_outputs`): Dynamo's unbacked symbols (u0, u1, ...),
    known only once that node has run."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    found: dict[sympy.Symbol, tuple[str, int | None, sympy.Symbol]] = {}
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        sizes = [(None, val)] if isinstance(val, torch.SymInt) else (
            list(enumerate(val.shape)) if isinstance(val, torch.Tensor) else [])
        for dim, size in sizes:
            expr = _expr(size)
            if isinstance(expr, sympy.Symbol) and expr not in found and \
                    free_unbacked_symbols(size):
                found[expr] = (node.name, dim, expr)
    return list(found.values())


class ShapeBinder:
    """Binds a symbolic graph's size symbols from its runtime arguments."""

    def __init__(self, gm: fx.GraphModule) -> None:
        import sympy

        # (placeholder position, dim or None for a SymInt argument, symbol)
        self._slots: list[tuple[int, int | None, object]] = []
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        for pos, node in enumerate(placeholders):
            val = node.meta.get("val")
            if isinstance(val, torch.SymInt):
                expr = _expr(val)
                if isinstance(expr, sympy.Symbol):
                    self._slots.append((pos, None, expr))
            elif isinstance(val, torch.Tensor):
                for dim, size in enumerate(val.shape):
                    expr = _expr(size)
                    if isinstance(expr, sympy.Symbol):
                        self._slots.append((pos, dim, expr))

    def bind(self, args: Sequence[Any]) -> dict:  # tensors and ints
        """Symbol -> int for these runtime arguments."""
        binding = {}
        for pos, dim, symbol in self._slots:
            arg = args[pos]
            binding[symbol] = int(arg) if dim is None else int(arg.shape[dim])
        return binding

    def bind_hints(self, example_inputs: Sequence[Any]) -> dict | None:
        """Symbol -> int from the sizes the graph was traced with (the example inputs'
        hints), or None when one has no hint. Read as hints, not `int()`: that would add
        a guard and specialise the graph to these sizes."""
        binding = {}
        for pos, dim, symbol in self._slots:
            arg = example_inputs[pos]
            size = arg if dim is None else arg.shape[dim]
            hint = size.node.hint if isinstance(size, torch.SymInt) else size
            if not isinstance(hint, int):
                return None
            binding[symbol] = hint
        return binding

    @staticmethod
    def key(binding: dict) -> tuple:
        return tuple(sorted((str(k), v) for k, v in binding.items()))


def concrete_size(size: SupportsInt, binding: dict | None) -> int:
    """An int for a size that may be a SymInt, given the symbols' values."""
    expr = _expr(size)
    if expr is None:
        return int(size)
    if binding is None:
        raise ValueError(f"symbolic size {expr} needs a binding")
    return int(expr.xreplace(binding))


def concrete_shape(shape: Sequence[SupportsInt], binding: dict | None) -> tuple[int, ...]:
    return tuple(concrete_size(s, binding) for s in shape)
