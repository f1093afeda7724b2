"""`torch.compile(model, backend="neuron")`: Dynamo graph -> AOTAutograd -> neuron graphs.

AOTAutograd splits each Dynamo graph into a forward and a backward aten graph (or one
inference graph); each becomes a `CompiledGraph` that launches its fused kernels as
one op. The AOTAutograd span and each graph's "neuron_compile" span are recorded
here; Dynamo's own spans, graph breaks and recompiles by `compile_events.recorder`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from neuron_explorer.backend import fast_path_layers, rnn_cells
from neuron_explorer.backend.compiler import compile_events
from neuron_explorer.backend.compiler.graph_compiler import compile_graph, device_index_of
from neuron_explorer.backend.matmul_numerics import attention_in_input_dtype
from torch import fx


def _hide_device_from_dynamo() -> None:
    from neuron_explorer.backend.registration import hide_from_dynamo

    hide_from_dynamo()


def _compiler(phase: str) -> Callable:
    def compile_phase(gm: fx.GraphModule, example_inputs: Sequence[object]) -> Callable:
        return compile_graph(gm, example_inputs, phase)

    compile_phase.__name__ = f"neuron_{phase}_compiler"
    return compile_phase


def _current_compile_id() -> str:
    compile_id = torch._guards.CompileContext.current_compile_id()
    return str(compile_id) if compile_id is not None else ""


def neuron_backend(gm: fx.GraphModule, example_inputs: Sequence[object], **kwargs: object
                   ) -> Callable:
    """The Dynamo backend registered as "neuron"."""
    from torch._dynamo.backends.common import aot_autograd

    compile_events.recorder.install()
    _hide_device_from_dynamo()  # the backend modules loaded since the last compile
    compile_id = _current_compile_id()
    source = compile_events.source_of_graph(gm) or compile_events.compiling_code_location()
    compile_events.recorder.note_graph_source(compile_id, source)
    device_index_of(example_inputs)  # fail early, with a clear message, on mixed devices
    ops = sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method",
                                                    "call_module"))
    backend = aot_autograd(
        fw_compiler=_compiler("forward"),
        bw_compiler=_compiler("backward"),
        inference_compiler=_compiler("inference"),
        # Input mutations (optimizer updates, running stats) stay inside the graph, so
        # they run in its kernels rather than as extra eager copies.
        keep_inference_input_mutations=True,
        decompositions={**rnn_cells.decompositions(), **fast_path_layers.decompositions()},
    )
    with compile_events.span("aot_autograd", f"aot_autograd {compile_id}",
                             {"compile_id": compile_id, "dynamo_ops": ops, "source": source}), \
            attention_in_input_dtype():  # traced as the chip runs it, as eager is
        return backend(gm, example_inputs)


# Dynamo loads this module when a compile asks for backend="neuron", before tracing the
# first frame: install the callbacks now so that frame's span has its start, and keep
# Dynamo out of the device's Python callbacks (it would break graphs on them).
compile_events.recorder.install()
_hide_device_from_dynamo()


def register() -> None:
    """Make "neuron" a Dynamo backend name (the entry point does this lazily too)."""
    from torch._dynamo.backends.registry import _BACKENDS, register_backend

    # torch types _BACKENDS as entry points, but it stores registered functions too
    registered = _BACKENDS.get("neuron")
    if "neuron" not in _BACKENDS or registered is not neuron_backend:  # type: ignore[comparison-overlap]
        register_backend(neuron_backend, name="neuron")
