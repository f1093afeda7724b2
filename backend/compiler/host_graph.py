"""Run an aten graph's numbers on the host, over the memory of its neuron tensors.

A `neuron` tensor's memory is a host buffer, so a compiled graph computes its exact
numbers by running the same CPU kernels eager ops use, on zero-copy host views of
its inputs, without the per-op dispatch an eager op pays. Results are relabelled as
neuron tensors (no copy); results that share memory with an input or with each other
become views of the same neuron storage, as the graph's aliasing says they are.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch
from neuron_explorer.backend import matmul_numerics
from torch import fx

_NEURON = "neuron"


def _on_neuron(value: object) -> bool:
    return isinstance(value, torch.device) and value.type == _NEURON


def host_graph_module(gm: fx.GraphModule,
                      sizes_of: Sequence[tuple[str, int | None]] = ()) -> fx.GraphModule:
    """A copy of `gm` whose factory ops allocate on the host instead of the device; with
    `sizes_of` ((node name, dim or None for a SymInt node)), it also returns those sizes,
    after the graph's own outputs."""
    graph = copy.deepcopy(gm.graph)
    if sizes_of:
        _return_sizes(graph, sizes_of)
    cpu = torch.device("cpu")
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        if any(_on_neuron(v) for v in node.kwargs.values()):
            node.kwargs = {k: (cpu if _on_neuron(v) else v) for k, v in node.kwargs.items()}
        if any(_on_neuron(v) for v in node.args):
            node.args = tuple(cpu if _on_neuron(v) else v for v in node.args)
    matmul_numerics.rewrite_graph(graph)  # bf16/fp16/fp8 products as the chip computes them
    graph.lint()
    return fx.GraphModule(gm, graph)


def _return_sizes(graph: fx.Graph, sizes_of: Sequence[tuple[str, int | None]]) -> None:
    nodes = {n.name: n for n in graph.nodes}
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    extra = []
    with graph.inserting_before(output):
        for name, dim in sizes_of:
            node = nodes[name]
            extra.append(node if dim is None else
                         graph.call_function(torch.ops.aten.sym_size.int, (node, dim)))
    values = output.args[0]
    values = list(values) if isinstance(values, (list, tuple)) else [values]
    output.args = (values + extra,)


def output_devices(gm: fx.GraphModule) -> list[bool]:
    """For each graph output: whether it is a tensor that lives on a neuron device."""
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    values = output.args[0]
    values = values if isinstance(values, (list, tuple)) else [values]
    flags = []
    for v in values:
        val = v.meta.get("val") if isinstance(v, fx.Node) else None
        flags.append(isinstance(val, torch.Tensor) and val.device.type == _NEURON)
    return flags


class HostRunner:
    """Calls a host graph on neuron inputs and hands back neuron outputs."""

    def __init__(self, gm: fx.GraphModule, device_index: int,
                 sizes_of: Sequence[tuple[str, int | None]] = ()) -> None:
        from neuron_explorer.backend import devices, dispatch

        self._fn: Callable = host_graph_module(gm, sizes_of)
        self._sizes = len(sizes_of)
        self.sizes: list[int] = []  # the last call's `sizes_of`
        self._neuron_outputs = output_devices(gm)
        self._device = devices.get(device_index)
        self._host_view = dispatch.host_view
        self._to_device = dispatch.to_device

    def __call__(self, args: Sequence[object]) -> list[object]:
        host_args: list[object] = []
        owners: dict[int, torch.Tensor] = {}  # host storage address -> a neuron tensor on it
        for a in args:
            if isinstance(a, torch.Tensor) and a.device.type == _NEURON:
                h = self._host_view(a)
                owners.setdefault(h.untyped_storage().data_ptr(), a)
                host_args.append(h)
            else:
                host_args.append(a)
        results = self._fn(*host_args)
        results = list(results) if isinstance(results, (list, tuple)) else [results]
        if self._sizes:
            self.sizes = [int(v) for v in results[-self._sizes:]]
            results = results[:-self._sizes]
        return [self._to_neuron(r, owners) if on else r
                for r, on in zip(results, self._neuron_outputs, strict=True)]

    def _to_neuron(self, host: object, owners: dict[int, torch.Tensor]) -> object:
        if not isinstance(host, torch.Tensor):
            return host
        address = host.untyped_storage().data_ptr()
        owner = owners.get(address)
        if owner is None or owner.dtype != host.dtype or address == 0:
            # Fresh memory (or an empty tensor): adopt the whole host storage.
            neuron = self._to_device(host, self._device)
            if address != 0:
                owners[address] = neuron
            return neuron
        # Memory an input or an earlier output already holds: a view of it.
        return torch.as_strided(owner, host.size(), host.stride(), host.storage_offset())
