"""A compiled graph as one program: every fusion group's instructions in one kernel,
scheduled as one stream across the engines.

Each group becomes a section of the program, labelled with the op(s) it runs, their
source line and module; an attention region gets a section per op. A section's
first instructions wait only for the sections that compute what it reads, so one
op's loads overlap the compute of the ops before it and independent ops run side by
side. A value one op hands to the next is read from SBUF as soon as it is computed
(its store to HBM proceeds meanwhile). Constant ops are folded by the fusion plan and
emit nothing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from neuron_explorer.backend.compiler.fusion import FusionGroup, OpKind
from neuron_explorer.backend.compiler.graph_kernels import GroupKernels
from neuron_explorer.backend.compiler.op_keys import op_name
from neuron_explorer.backend.compiler.shapes import concrete_shape
from neuron_explorer.backend.hardware import Kernel, KernelBuilder
from neuron_explorer.common.op_families import base_name, is_matmul_like, runs_matmuls
from torch import fx

if TYPE_CHECKING:
    from neuron_explorer.backend.devices import NeuronDevice

# Values handed from op to op stay in SBUF when, all alive at once, they fit in this
# share of it (the rest: each op's own working set); otherwise they go through HBM.
ON_CHIP_SHARE = 0.5
# Graph inputs (weights, saved activations, constants) are loaded this many ops ahead
# of the op that reads them and kept in SBUF, within this share of it.
PREFETCH_AHEAD = 4
PREFETCH_SHARE = 0.25
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')
_MODULE_PATH = re.compile(r"\['([^']*)'\]|\.(\w+)|\[(\d+)\]")


@dataclass(frozen=True)
class Section:
    """The ops one stretch of a program's instructions runs, and where they come from."""

    name: str  # the group's name ("fused_addmm_gelu", "mm"; "flash_attention.bmm" in a region)
    ops: tuple[str, ...]  # aten op names, in graph order
    source: str  # "file:line" of the first op's user code ("" when unknown)
    module: str  # nn.Module path of that code ("" when unknown)
    written: str = ""  # what the user called: "LayerNorm", "F.layer_norm" (", "-joined; "" unknown)
    matmul_dtype: str = ""  # the dtype its first matmul runs in ("float32"; "" without a matmul)
    # its matmuls' operand shapes, as an op's shapes are written ("[[64, 96], [96, 160]]"):
    # the dims the Tensor Engine tiles (a graph's own inputs may be tables it only reads)
    matmul_shapes: str = ""


def source_of(node: fx.Node) -> str:
    """The innermost user frame of the code that made `node`, as "file:line"."""
    trace = node.meta.get("stack_trace") or ""
    frames = _FRAME.findall(trace)
    return f"{frames[-1][0]}:{frames[-1][1]}" if frames else ""


def module_of(node: fx.Node) -> str:
    """The nn.Module path of the code that made `node` ("blocks.0.attn"), read from the
    module stack Dynamo records (the forward's, for backward ops)."""
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack")
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    if not isinstance(path, str):
        return ""
    parts = []
    for name, attr, index in _MODULE_PATH.findall(path):
        parts.append(name or attr or index)
    return ".".join(p for p in parts[1:] if p)  # the first is the root ("self", "fn")


_OPERATORS = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "floordiv": "//",
              "matmul": "@", "pow": "**", "neg": "-", "getitem": "[]", "iadd": "+=", "imul": "*="}
_FUNCTION_PREFIXES = {"torch.nn.functional": "F.", "torch._C._nn": "F.", "torch": "torch.",
                      "torch.functional": "torch.", "torch._C._VariableFunctions": "torch.",
                      "torch._tensor": "Tensor.", "torch._C._linalg": "torch.linalg.",
                      "torch.linalg": "torch.linalg.", "torch.fft": "torch.fft."}


def written_as(node: fx.Node) -> str:
    """What the user's code called to make `node`, from the call Dynamo recorded: a module's
    type (`LayerNorm`), a torch function (`F.layer_norm`, `torch.softmax`), a tensor method
    (`Tensor.transpose`) or an operator (`+`); backward ops say whose backward they are."""
    stack = node.meta.get("source_fn_stack")
    backward = False
    if not stack:
        stack, backward = node.meta.get("fwd_source_fn_stack"), True
    if not stack:
        return ""
    name = _call_name(stack[-1][1])
    return f"{name} (backward)" if name and backward else name


def _call_name(target: object) -> str:
    if isinstance(target, str):
        return f"Tensor.{target}"
    if isinstance(target, type):
        return target.__name__
    name = getattr(target, "__name__", "")
    if not name:
        return ""
    module = getattr(target, "__module__", None) or ""
    if module in ("_operator", "operator"):
        return _OPERATORS.get(name, f"operator.{name}")
    if not module and type(getattr(target, "__self__", None)).__name__ == "type":
        module = "torch"  # torch.softmax and friends: built-in methods of torch's C class
    prefix = _FUNCTION_PREFIXES.get(module)
    return f"{prefix}{name}" if prefix else name


def matmul_dtype(nodes: Sequence[fx.Node]) -> str:
    """The dtype the first matmul among `nodes` computes in (its output's: a matmul's inputs
    share it), "" when there is none. Matmuls: the matmul, convolution and attention
    families (common/op_families.py)."""
    for node in nodes:
        if is_matmul_like(op_name(node)):
            val = node.meta.get("val")
            val = val[0] if isinstance(val, (list, tuple)) and val else val
            if isinstance(val, torch.Tensor):
                return str(val.dtype).removeprefix("torch.")
    return ""


def matmul_shapes(nodes: Sequence[fx.Node]) -> str:
    """The operand shapes of the matmuls among `nodes` (the matmul, convolution and attention
    families, and the layers run as one op with their matmuls inside), each operand once, as
    "[[m, k], [k, n]]"; dims not known at compile time are left out; "" without a matmul."""
    shapes: list[list[int]] = []
    for node in nodes:
        name = op_name(node)
        if not runs_matmuls(name):
            continue
        for operand in node.all_input_nodes:
            val = operand.meta.get("val")
            if isinstance(val, torch.Tensor):
                dims = [d for d in val.shape if type(d) is int]
                if dims not in shapes:
                    shapes.append(dims)
    return str(shapes) if shapes else ""


def section_of(name: str, nodes: Sequence[fx.Node]) -> Section:
    first = nodes[0]
    written = dict.fromkeys(w for w in map(written_as, nodes) if w)
    return Section(name, tuple(op_name(n) for n in nodes), source_of(first), module_of(first),
                   ", ".join(written), matmul_dtype(nodes), matmul_shapes(nodes))


def live_bytes(groups: Sequence[FusionGroup], binding: dict | None = None) -> int:
    """The most bytes of values computed by one group and read by a later one that are
    alive at once (in program order)."""
    index = {n: i for i, g in enumerate(groups) for n in g.nodes}
    last_read: dict[fx.Node, int] = {}
    for i, group in enumerate(groups):
        for v in group.inputs:
            if v in index:
                last_read[v] = i
    peak = 0
    for i in range(len(groups)):
        alive = sum(_bytes(v, binding) for v, last in last_read.items() if index[v] < i <= last)
        peak = max(peak, alive)
    return peak


def _bytes(node: fx.Node, binding: dict | None = None) -> int:
    """Bytes of the tensor(s) a node makes, symbolic sizes made concrete (a size still
    unknown counts as 0: such a value is never kept on chip)."""
    val = node.meta.get("val")
    values = val if isinstance(val, (list, tuple)) else [val]
    total = 0
    for v in values:
        if not isinstance(v, torch.Tensor):
            continue
        try:
            shape = concrete_shape(v.shape, binding)
        except (KeyError, TypeError):
            return 0
        if not all(type(d) is int for d in shape):
            return 0
        total += math.prod(shape) * v.element_size()
    return total


def build_program(groups: Sequence[FusionGroup], device: NeuronDevice, name: str,
                  binding: dict | None = None) -> Kernel | None:
    """The program of a graph's fusion groups (None: the graph does no device work).

    Values stay in SBUF between ops when they fit beside each op's own working set;
    a graph where they would not is built again with every value going through HBM."""
    live = live_bytes(groups, binding)
    sbuf = device.preset.sbuf_bytes
    if live <= ON_CHIP_SHARE * sbuf:
        program = _Program(groups, device, name, binding, live)
        b = program.emit()
        if b.sbuf_peak + live + program.most_held <= sbuf:
            # SBUF also holds the values kept between ops and those loaded ahead
            b.note_sbuf(b.sbuf_peak + live + program.most_held)
            return b.build() if len(b) else None
    b = _Program(groups, device, name, binding, None).emit()
    return b.build() if len(b) else None


class _Program:
    """Emits the groups of one graph, in order, into one builder."""

    def __init__(self, groups: Sequence[FusionGroup], device: NeuronDevice, name: str,
                 binding: dict | None, live: int | None) -> None:
        self.groups = groups
        self.binding = binding
        self.keep_on_chip = live is not None  # None: every value goes through HBM
        self.b = KernelBuilder(device.preset, name)
        self.emitter = GroupKernels(device, binding)
        self.sections: list[Section] = []
        self.node_section: dict[fx.Node, int] = {}
        self.group_of = {n: g.group_id for g in groups for n in g.nodes}
        self.ready: dict[int, tuple[int, ...]] = {}  # group id -> its last instructions
        self.budget = PREFETCH_SHARE * device.preset.sbuf_bytes if self.keep_on_chip else 0
        self.last_reader = {v: i for i, g in enumerate(groups) for v in g.inputs}
        self.loaded: dict[fx.Node, tuple[int, ...]] = {}  # graph inputs hoisted into SBUF
        self.most_held = 0
        self.region = ""  # the name of the group being emitted

    def enter(self, node: fx.Node) -> None:
        """Label what follows with `node`'s own section (attention regions)."""
        if node not in self.node_section:
            self.node_section[node] = len(self.sections)
            name = f"{self.region}.{base_name(op_name(node))}"  # "flash_attention.bmm"
            self.sections.append(section_of(name, [node]))
        self.b.section = self.node_section[node]

    def emit(self) -> KernelBuilder:
        b = self.b
        for index, group in enumerate(self.groups):
            producers = {self.group_of[v] for v in group.inputs if v in self.group_of}
            after = [i for g in sorted(producers) for i in self.ready.get(g, ())]
            start = len(b)
            self.region = group.name
            if group.kind is not OpKind.ATTENTION:
                self.sections.append(section_of(group.name, group.nodes))
                b.section = len(self.sections) - 1
            after += self._load_ahead(index, group)
            b.after = tuple(dict.fromkeys(after))
            self.emitter.emit(b, group, self.enter)
            self.ready[group.group_id] = b.finished(start, through_stores=True) or b.after
            if self.keep_on_chip:
                self.emitter.on_chip.update(group.outputs)
        b.after = ()
        b.sections = tuple(self.sections)
        return b

    def _load_ahead(self, index: int, group: FusionGroup) -> list[int]:
        """Load the weights, saved values and constants `group` reads as soon as the op
        PREFETCH_AHEAD groups earlier is done (its SBUF is free by then), so their DMA
        runs while the ops before compute; returns the loads the group waits for."""
        b, binding = self.b, self.binding
        earlier = self.groups[index - PREFETCH_AHEAD] if index >= PREFETCH_AHEAD else None
        b.after = self.ready.get(earlier.group_id, ()) if earlier is not None else ()
        held = sum(_bytes(v, binding) for v in self.loaded
                   if self.last_reader[v] >= index - PREFETCH_AHEAD)
        waits: list[int] = []
        for v in group.inputs:
            if v in self.group_of:
                continue
            size = _bytes(v, binding)
            if (v not in self.loaded and size > 0 and held + size <= self.budget
                    and self.emitter.reads_on_chip(group)
                    and not self.emitter.loads_itself(group, v)):
                if group.kind is OpKind.ATTENTION:
                    self.enter(next(n for n in group.nodes if v in group.reads.get(n, ())))
                self.loaded[v] = b.dma_load(size)
                held += size
                self.most_held = max(self.most_held, held)
                self.emitter.on_chip.add(v)
            waits.extend(self.loaded.get(v, ()))
        return waits

