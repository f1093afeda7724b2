"""A compiled graph's program as it would be with the model cast whole to a lower
precision (`model.to(torch.bfloat16)` and its inputs): every float32 tensor of the graph
in that dtype, so its matmuls run at that rate and every load, store and elementwise op
moves and computes half the bytes.

The FP32-matmul finding states this program's saving for compiled graphs: the trace
records a graph's instructions, not its ops, so only the backend can build it again.
The program is built from the same fusion groups, their values' dtypes swapped for the
build and restored after it."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
from neuron_explorer.backend.compiler.fusion import FusionGroup
from neuron_explorer.backend.compiler.program import build_program
from torch import fx

if TYPE_CHECKING:
    from neuron_explorer.backend.devices import NeuronDevice


def whole_model_ns(groups: Sequence[FusionGroup], device: NeuronDevice, name: str,
                   binding: dict | None, dtype: torch.dtype = torch.bfloat16) -> int | None:
    """The length of the graph's program with its float32 tensors in `dtype` (None when
    the graph does no device work)."""
    try:
        with _float32_as(groups, dtype):
            program = build_program(groups, device, name, binding)
    except Exception:  # noqa: BLE001 - a user's NKI kernel in the graph, run in a dtype
        # it was not written for, may raise anything: the recording goes on without it
        return None
    return None if program is None else program.duration_ns


def _graph_nodes(groups: Sequence[FusionGroup]) -> list[fx.Node]:
    """Every node of the graph the groups come from (what they run, and what it reads
    through views: weights, activations, constants)."""
    graphs = {n.graph: None for g in groups for n in g.nodes}
    return [n for graph in graphs for n in graph.nodes]


@contextmanager
def _float32_as(groups: Sequence[FusionGroup], dtype: torch.dtype) -> Iterator[None]:
    """Within the block, each float32 value of the graph (`node.meta["val"]`, where the
    build reads shapes and dtypes) is a tensor of the same shape in `dtype`."""
    saved = {}
    try:
        for node in _graph_nodes(groups):
            val = node.meta.get("val")
            cast = _cast(val, dtype)
            if cast is not val:
                saved[node] = val
                node.meta["val"] = cast
        yield
    finally:
        for node, val in saved.items():
            node.meta["val"] = val


def _cast(val: object, dtype: torch.dtype) -> object:
    if isinstance(val, (list, tuple)):
        cast = [_cast(v, dtype) for v in val]
        return val if all(c is v for c, v in zip(cast, val, strict=True)) else type(val)(cast)
    if not isinstance(val, torch.Tensor) or val.dtype != torch.float32:
        return val
    mode = getattr(val, "fake_mode", None)
    if mode is None:  # a meta or real tensor: shapes only matter
        return torch.empty_strided(val.shape, val.stride(), dtype=dtype, device="meta")
    with mode:
        return torch.empty_strided(val.shape, val.stride(), dtype=dtype, device=val.device)
