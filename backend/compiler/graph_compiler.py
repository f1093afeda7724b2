"""One aten graph (forward, backward or inference) -> a callable that launches it once.

Compiling plans the fusion groups and builds the graph's program (one kernel whose
sections are the groups, `program.build_program`); calling computes the graph's
numbers on the host (`HostRunner`) and launches the program as one op named
"graph:<id>" on the device timeline. A graph traced with symbolic sizes (dynamic
shapes) compiles once, at the sizes it was traced with: its program takes the sizes
at run time, so a call with new sizes is timed at them without compiling again.
"""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from neuron_explorer.backend.clock import clock
from neuron_explorer.backend.compiler import compile_events, foreach_ops
from neuron_explorer.backend.compiler.batched_program import batched_ns, request_inputs
from neuron_explorer.backend.compiler.fusion import FusionGroup, plan_fusion
from neuron_explorer.backend.compiler.graph_kernels import can_fuse
from neuron_explorer.backend.compiler.host_graph import HostRunner
from neuron_explorer.backend.compiler.program import build_program
from neuron_explorer.backend.compiler.shapes import (
    ShapeBinder,
    concrete_shape,
    is_symbolic,
    unbacked_sizes,
)
from neuron_explorer.backend.compiler.whole_model_dtype import whole_model_ns
from neuron_explorer.common.errors import NeuronExplorerError
from torch import fx

_graph_ids = itertools.count(1)


class NeuronCompileError(NeuronExplorerError):
    """A graph cannot be compiled for the neuron device as it stands."""


@dataclass(frozen=True)
class GraphLaunch:
    """Everything one launch of a graph needs, for one set of input sizes."""

    kernels: tuple
    input_shapes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    flops: int
    hbm_bytes: int


def device_index_of(example_inputs: Sequence[object]) -> int | None:
    """The neuron device a graph's tensors live on (None: no neuron tensor at all)."""
    found = {a.device.index or 0 for a in example_inputs
             if isinstance(a, torch.Tensor) and a.device.type == "neuron"}
    if len(found) > 1:
        raise NeuronCompileError(
            f"one compiled graph reads tensors on several neuron devices ({sorted(found)}); "
            "keep a model's parameters and inputs on one device, or compile one model per device"
        )
    return found.pop() if found else None


def op_count(gm: fx.GraphModule) -> int:
    return sum(1 for n in gm.graph.nodes if n.op == "call_function")


class CompiledGraph:
    """A compiled aten graph: boxed callable (AOTAutograd's calling convention)."""

    _boxed_call = True

    def __init__(self, gm: fx.GraphModule, example_inputs: Sequence[object], phase: str,
                 graph_id: int, device_index: int) -> None:
        from neuron_explorer.backend import devices, runtime

        # An instance attribute, so wrappers made with functools.wraps (AOTAutograd's
        # backward `disable`) copy it and keep calling us boxed.
        self._boxed_call = True
        self.graph_id = graph_id
        self.phase = phase
        self.name = f"graph:{graph_id}"
        self.device_index = device_index
        self.device = devices.get(device_index)
        # data-dependent sizes (a mask's selection): bound from the run, planned after it
        self._unbacked = unbacked_sizes(gm)
        # the numbers come from the graph as traced (a copy: its foreach ops kept whole,
        # one host kernel each); the program from its foreach ops as per-tensor ops
        self.runner = HostRunner(gm, device_index, [(n, d) for n, d, _ in self._unbacked])
        foreach_ops.expand(gm)
        self.groups: list[FusionGroup] = plan_fusion(gm, can_fuse=can_fuse)
        self.op_count = op_count(gm)
        self._tensor_inputs = [i for i, a in enumerate(example_inputs)
                               if isinstance(a, torch.Tensor)]
        self._binder = ShapeBinder(gm) if is_symbolic(gm) or self._unbacked else None
        self._launches: dict[tuple, GraphLaunch] = {}
        self._placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        # an inference graph's requests: what the unbatched-calls finding batches
        self._requests = [self._placeholders[i] for i in request_inputs(example_inputs)] \
            if phase == "inference" else []
        self._launch = runtime.launch_kernels
        self._suspended = runtime.device_accounting_suspended
        self.static_launch: GraphLaunch | None = None
        if self._binder is None:
            self.static_launch = self._plan_launch(None)
        else:
            # Compiled once, here, at the sizes it was traced with; other sizes reuse it
            hints = self._binder.bind_hints(example_inputs)
            if hints is not None and not self._unbacked:
                self._launches[ShapeBinder.key(hints)] = self._plan_launch(hints)

    @property
    def kernel_names(self) -> list[str]:
        launch = self.static_launch or next(iter(self._launches.values()), None)
        return [k.name for k in launch.kernels] if launch else []

    @property
    def fallback_ops(self) -> list[str]:
        """The graph's ops with no device lowering (they run on the host), each as often as
        the graph runs it (a router's `nonzero` once per expert)."""
        launch = self.static_launch or next(iter(self._launches.values()), None)
        return [name for k in (launch.kernels if launch else ())
                for name in getattr(k, "host_fallbacks", ())]

    @property
    def section_names(self) -> list[str]:
        """The program's sections (fusion groups, or one op of an attention region)."""
        launch = self.static_launch or next(iter(self._launches.values()), None)
        return [s.name for k in launch.kernels for s in k.sections] if launch else []

    def _plan_launch(self, binding: dict | None) -> GraphLaunch:
        name = f"graph_{self.graph_id}_{self.phase}"
        program = build_program(self.groups, self.device, name, binding)
        if program is not None and any(s.matmul_dtype == "float32" for s in program.sections):
            # what the FP32-matmul finding claims, built when a recording asks for it
            program.whole_bf16_later(
                functools.partial(whole_model_ns, self.groups, self.device, name, binding))
        if program is not None and self._requests:
            program.batched_later(functools.partial(batched_ns, self.groups, self.device,
                                                    name, binding, self._requests))
        kernels = (program,) if program is not None else ()
        shapes, dtypes = [], []
        for i in self._tensor_inputs:
            val = self._placeholders[i].meta.get("val")
            if isinstance(val, torch.Tensor):
                shapes.append(concrete_shape(val.shape, binding))
                dtypes.append(str(val.dtype).removeprefix("torch."))
        return GraphLaunch(kernels, tuple(shapes), tuple(dtypes),
                           sum(k.model_flops for k in kernels),
                           sum(k.hbm_bytes for k in kernels))

    def _launch_for(self, args: Sequence[object]) -> GraphLaunch:
        if self.static_launch is not None:
            return self.static_launch
        assert self._binder is not None  # a graph without one has a static launch
        binding = self._binder.bind(args)
        binding.update((symbol, size) for (_, _, symbol), size in
                       zip(self._unbacked, self.runner.sizes, strict=True))
        key = ShapeBinder.key(binding)
        launch = self._launches.get(key)
        if launch is not None:
            return launch
        if not self._launches:
            # no sizes to compile at before the first call: it compiles now, in a span
            sizes = ", ".join(f"{k}={v}" for k, v in key)
            with compile_events.span("neuron_compile", f"{self.name} {self.phase} ({sizes})",
                                     {"graph_id": self.graph_id, "phase": self.phase,
                                      "sizes": sizes, "dynamic_shapes": True}) as span_args:
                launch = self._launches[key] = self._plan_launch(binding)
                span_args.update(op_count=self.op_count, group_count=len(self.groups),
                                 kernel_count=len(launch.kernels),
                                 kernels=[k.name for k in launch.kernels],
                                 fallback_ops=json.dumps(self.fallback_ops))
            return launch
        # The compiled program takes its sizes at run time (loop bounds, DMA lengths), so
        # a new size compiles nothing: its instructions are planned here only for the
        # cost model to time them, which is the simulator's work, not the program's.
        real_start = clock.real_ns()
        launch = self._launches[key] = self._plan_launch(binding)
        clock.exclude(clock.real_ns() - real_start)
        return launch

    def __call__(self, *call_args: object) -> list:
        # Boxed (one list, which we empty so inputs die early) or, where a wrapper hid
        # the boxed marker (AOTAutograd's backward), plain positional arguments.
        boxed = len(call_args) == 1 and type(call_args[0]) is list
        args = cast(list, call_args[0]) if boxed else list(call_args)
        launch = None if self._unbacked else self._launch_for(args)
        inputs = [_block(args[i]) for i in self._tensor_inputs]
        with self._suspended():
            outputs = self.runner(args)
        if launch is None:
            launch = self._launch_for(args)
        if boxed:
            args.clear()
        # The runtime launches eager work a policy still holds before the graph.
        op_id = self._launch(self.device_index, launch.kernels, self.name, launch.input_shapes,
                             launch.input_dtypes, launch.flops, launch.hbm_bytes,
                             self.graph_id, [b.made_by if b is not None else 0 for b in inputs])
        # its fresh results name the launch as the op that made them, as an eager op's do:
        # the data flow runs through compiled calls (a compiled generation's next call
        # reads its last one's token, which tells it from a server's requests)
        held = {id(b) for b in inputs if b is not None}
        for out in outputs:
            block = _block(out)
            if block is not None and id(block) not in held:
                block.made_by = op_id
        return outputs


def _block(value: object) -> Any:
    """The allocator's record of a neuron tensor's memory (None: not a neuron tensor)."""
    return getattr(value.untyped_storage(), "_neuron_block", None) \
        if isinstance(value, torch.Tensor) else None


class EagerGraph:
    """A graph with no neuron tensors: runs as traced, with no device launch."""

    _boxed_call = True

    def __init__(self, gm: fx.GraphModule) -> None:
        self._boxed_call = True
        self.gm = gm

    def __call__(self, *call_args: object) -> list:
        boxed = len(call_args) == 1 and type(call_args[0]) is list
        args = cast(list, call_args[0]) if boxed else list(call_args)
        outputs = self.gm(*args)
        if boxed:
            args.clear()
        return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]


def compile_graph(gm: fx.GraphModule, example_inputs: Sequence[object], phase: str
                  ) -> CompiledGraph | EagerGraph:
    """Compile one AOTAutograd graph; emits a "neuron_compile" span for it."""
    device_index = device_index_of(example_inputs)
    if device_index is None:
        return EagerGraph(gm)
    graph_id = next(_graph_ids)
    with compile_events.span("neuron_compile", f"graph:{graph_id} {phase}",
                             {"graph_id": graph_id, "phase": phase}) as args:
        compiled = CompiledGraph(gm, example_inputs, phase, graph_id, device_index)
        args.update(op_count=compiled.op_count, group_count=len(compiled.groups),
                    kernel_count=len(compiled.kernel_names), kernels=compiled.kernel_names,
                    sections=compiled.section_names,
                    fallback_ops=json.dumps(compiled.fallback_ops),
                    dynamic_shapes=compiled.static_launch is None)
    return compiled
