"""A compiled graph's program built as it would be with other values: the program builder
reads each node's shape and dtype from `node.meta["val"]`, so a what-if build (the model
cast whole to bfloat16, a batch of requests) puts other values there for the build and
the recorded ones back after it. The trace records a graph's instructions, not its ops,
so only the backend can build its program again; the findings state the lengths."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import torch
from neuron_explorer.backend.compiler.fusion import FusionGroup
from neuron_explorer.backend.compiler.program import build_program
from torch import fx

if TYPE_CHECKING:
    from neuron_explorer.backend.devices import NeuronDevice


def program_ns(groups: Sequence[FusionGroup], device: NeuronDevice, name: str,
               binding: dict | None, values: Mapping[fx.Node, object]) -> int | None:
    """The length of the graph's program built with `values` as those nodes' values and
    the symbols bound as `binding` says; None where it does no device work, or the build
    raises."""
    recorded = {node: node.meta.get("val") for node in values}
    try:
        for node, val in values.items():
            node.meta["val"] = val
        program = build_program(groups, device, name, binding)
    except Exception:  # noqa: BLE001 - a user's NKI kernel in the graph, run at shapes or
        # in a dtype it was not written for, may raise anything (an empty slice of its row
        # loop): the recording goes on without this length, the finding without its replay
        return None
    finally:
        for node, val in recorded.items():
            node.meta["val"] = val
    return None if program is None else program.duration_ns


def graph_nodes(groups: Sequence[FusionGroup]) -> list[fx.Node]:
    """Every node of the graph the groups come from (what they run, and what it reads
    through views: weights, activations, constants)."""
    graphs = {n.graph: None for g in groups for n in g.nodes}
    return [n for graph in graphs for n in graph.nodes]


def changed_values(nodes: Iterable[fx.Node],
                   change: Callable[[torch.Tensor], torch.Tensor | None]
                   ) -> dict[fx.Node, object]:
    """The nodes whose value `change` gives another (a tensor, or a list or tuple holding
    one), with that value; `change` returns None for a tensor it keeps."""
    out: dict[fx.Node, object] = {}
    for node in nodes:
        val = node.meta.get("val")
        new = _changed(val, change)
        if new is not val:
            out[node] = new
    return out


def _changed(val: object, change: Callable[[torch.Tensor], torch.Tensor | None]) -> object:
    if isinstance(val, (list, tuple)):
        new = [_changed(v, change) for v in val]
        return val if all(a is b for a, b in zip(new, val, strict=True)) else type(val)(new)
    if not isinstance(val, torch.Tensor):
        return val
    out = change(val)
    return val if out is None else out


def fake_like(val: torch.Tensor, shape: Sequence, stride: Sequence,
              dtype: torch.dtype) -> torch.Tensor:
    """An empty tensor of `shape`, `stride` and `dtype` where `val` lives: its fake mode,
    or the meta device for a meta or real tensor (only shapes matter to the build)."""
    mode = getattr(val, "fake_mode", None)
    if mode is None:
        return torch.empty_strided(shape, stride, dtype=dtype, device="meta")
    with mode:
        return torch.empty_strided(shape, stride, dtype=dtype, device=val.device)
