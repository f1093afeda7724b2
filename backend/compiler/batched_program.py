"""An inference graph's program as it would be over `BATCHED_CALLS` times its requests'
rows: what one call of the model serving that many calls' requests runs.

The unbatched-calls finding replays a server with its calls joined in batches; an eager
op is lowered again at the larger shapes from its key, but the trace records a compiled
graph's instructions, not its ops, so only the backend can build its program again. The
requests are the graph's inputs that are not parameters or buffers (Dynamo's static
inputs); every value computed from them grows along its first dim (the batch-major layout
a model called on stacked requests has), and the program is built from the same fusion
groups at those shapes. A graph traced with a symbolic batch is built with the symbol
bound larger instead, which also sizes its reshapes. Not modelled: a sequence-first
layout (its first dim is no batch), a reduction over the batch (its result grows too).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import sympy
import torch
from neuron_explorer.backend.compiler.fusion import FusionGroup
from neuron_explorer.backend.compiler.program import build_program
from neuron_explorer.common.trace_format import BATCHED_CALLS
from torch import fx

if TYPE_CHECKING:
    from neuron_explorer.backend.devices import NeuronDevice



def request_inputs(example_inputs: Sequence[object]) -> list[int]:
    """Positions of the graph's inputs that are requests: tensors that are not static
    (AOTAutograd's static inputs are the parameters and buffers); all tensors where the
    compile says nothing of them."""
    context = torch._guards.TracingContext.try_get()
    static = getattr(getattr(context, "fw_metadata", None), "static_input_indices", None)
    if static is None:
        return []
    return [i for i, a in enumerate(example_inputs)
            if isinstance(a, torch.Tensor) and i not in set(static)]


def batched_ns(groups: Sequence[FusionGroup], device: NeuronDevice, name: str,
               binding: dict | None, requests: Sequence[fx.Node],
               factor: int = BATCHED_CALLS) -> int | None:
    """The length of the graph's program with its requests' rows `factor` times as many
    (None where it does no device work or has no request of a batch dim)."""
    first = requests[0].meta.get("val") if requests else None
    if not isinstance(first, torch.Tensor) or not first.dim():
        return None
    batch = first.shape[0]
    try:
        if isinstance(batch, torch.SymInt):
            symbol = batch.node.expr
            if not isinstance(symbol, sympy.Symbol) or binding is None or symbol not in binding:
                return None
            program = build_program(groups, device, name, {**binding, symbol: binding[symbol]
                                                           * factor})
        else:
            with _grown(groups, requests, int(batch), factor):
                program = build_program(groups, device, name, binding)
    except Exception:  # noqa: BLE001 - a user's NKI kernel in the graph, run at shapes it
        # was not written for, may raise anything (an empty slice of a row loop): the
        # recording goes on without the batched length, and the finding without a replay
        return None
    return None if program is None else program.duration_ns


@contextmanager
def _grown(groups: Sequence[FusionGroup], requests: Sequence[fx.Node], rows: int,
           factor: int) -> Iterator[None]:
    """Within the block, each value computed from the requests (`node.meta["val"]`, where
    the build reads shapes) has a first dim `factor` times as large, where that dim is a
    multiple of the requests' rows (a table of the model's own keeps its size)."""
    saved = {}
    try:
        for node in _from_requests(groups, requests):
            val = node.meta.get("val")
            grown = _grow(val, rows, factor)
            if grown is not val:
                saved[node] = val
                node.meta["val"] = grown
        yield
    finally:
        for node, val in saved.items():
            node.meta["val"] = val


def _from_requests(groups: Sequence[FusionGroup], requests: Sequence[fx.Node]
                   ) -> list[fx.Node]:
    """The requests and every node of their graph that reads one, however indirectly."""
    graphs = {n.graph: None for g in groups for n in g.nodes}
    reached = set(requests)
    for graph in graphs:
        for node in graph.nodes:  # topological order: inputs come first
            if node not in reached and any(i in reached for i in node.all_input_nodes):
                reached.add(node)
    return [n for n in reached if n.op != "output"]


def _grow(val: object, rows: int, factor: int) -> object:
    if isinstance(val, (list, tuple)):
        grown = [_grow(v, rows, factor) for v in val]
        return val if all(g is v for g, v in zip(grown, val, strict=True)) else type(val)(grown)
    if not isinstance(val, torch.Tensor) or not val.dim():
        return val
    if any(isinstance(s, torch.SymInt) for s in (*val.shape, *val.stride())):
        return val  # a size bound at run time: a static batch's build leaves it be
    first = val.shape[0]
    if first % rows:
        return val
    shape = (first * factor, *val.shape[1:])
    stride = _strides_in_order(val.stride(), shape)
    mode = getattr(val, "fake_mode", None)
    if mode is None:  # a meta or real tensor: shapes only matter
        return torch.empty_strided(shape, stride, dtype=val.dtype, device="meta")
    with mode:
        return torch.empty_strided(shape, stride, dtype=val.dtype, device=val.device)


def _strides_in_order(stride: Sequence[int], shape: Sequence[int]) -> tuple[int, ...]:
    """Dense strides for `shape` with the dims in the memory order `stride` gives them (a
    transposed value stays transposed); a broadcast dim (stride 0) keeps stride 0."""
    out = [0] * len(shape)
    step = 1
    for d in sorted(range(len(shape)), key=lambda d: (stride[d], -d)):
        if stride[d]:
            out[d] = step
            step *= shape[d]
    return tuple(out)
