"""An inference graph's program as it would be over `BATCHED_CALLS` times its requests'
rows: what one call of the model serving that many calls' requests runs.

The unbatched-calls finding replays a server with its calls joined in batches; an eager
op is lowered again at the larger shapes from its key, but the trace records a compiled
graph's instructions, not its ops, so only the backend can build its program again. The
requests are the graph's inputs that are not parameters or buffers (Dynamo's static
inputs); every value computed from them grows along its first dim (the batch-major layout
a model called on stacked requests has), and the program is built from the same fusion
groups at those shapes (`what_if_build`). A graph traced with a symbolic batch is built
with the symbol bound larger instead, which also sizes its reshapes. Not modelled: a
sequence-first layout (its first dim is no batch), a reduction over the batch (its result
grows too).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import sympy
import torch
from neuron_explorer.backend.compiler.fusion import FusionGroup
from neuron_explorer.backend.compiler.what_if_build import (
    changed_values,
    fake_like,
    graph_nodes,
    program_ns,
)
from neuron_explorer.common.trace_format import BATCHED_CALLS
from torch import fx

if TYPE_CHECKING:
    from neuron_explorer.backend.devices import NeuronDevice


def request_inputs(example_inputs: Sequence[object]) -> list[int]:
    """Positions of the graph's inputs that are requests: tensors that are not static
    (AOTAutograd's static inputs are the parameters and buffers); none where the compile
    says nothing of them."""
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
    (None where it does no device work, has no request of a batch dim, or cannot be built
    so)."""
    first = requests[0].meta.get("val") if requests else None
    if not isinstance(first, torch.Tensor) or not first.dim():
        return None
    batch = first.shape[0]
    if isinstance(batch, torch.SymInt):
        symbol = batch.node.expr
        if not isinstance(symbol, sympy.Symbol) or binding is None or symbol not in binding:
            return None
        return program_ns(groups, device, name, {**binding, symbol: binding[symbol] * factor},
                          {})
    rows = int(batch)
    return program_ns(groups, device, name, binding,
                      changed_values(_from_requests(groups, requests),
                                     lambda val: _grown(val, rows, factor)))


def _from_requests(groups: Sequence[FusionGroup], requests: Sequence[fx.Node]
                   ) -> list[fx.Node]:
    """The requests and every node of their graph that reads one, however indirectly."""
    reached = set(requests)
    for node in graph_nodes(groups):  # topological order: inputs come first
        if node not in reached and any(i in reached for i in node.all_input_nodes):
            reached.add(node)
    return [n for n in reached if n.op != "output"]


def _grown(val: torch.Tensor, rows: int, factor: int) -> torch.Tensor | None:
    """`val` with a first dim `factor` times as large, where that dim is a multiple of the
    requests' rows (a table of the model's own keeps its size; None: kept)."""
    if not val.dim() or any(isinstance(s, torch.SymInt) for s in (*val.shape, *val.stride())):
        return None  # a size bound at run time: a static batch's build leaves it be
    first = val.shape[0]
    if first % rows:
        return None
    shape = (first * factor, *val.shape[1:])
    return fake_like(val, shape, _strides_in_order(val.stride(), shape), val.dtype)


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
