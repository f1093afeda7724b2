"""`whatif(..., mode="compiled")`: an eager recording re-timed as if its steps were compiled.

The FX graphs torch.compile would trace are not in an eager trace, so the compile path
is approximated from the op stream, in the shape `train(..., compile=True)` runs:
- each step's forward ops inside the model's module ranges become one graph launch, and
  its backward ops inside them another, as torch.compile(model) compiles them; the loss
  and its backward (outside the ranges), host<->device copies, reads of device values,
  the optimizer and zero_grad stay eager, as they do in a compiled run; an optimizer
  call (zero_grad before loss.backward()) ends the forward;
- a graph launch is one program, as the compile path makes it: every op's own lowering
  emitted into one `KernelBuilder`, so one op's loads overlap the compute before it and
  no launch latency or fixed kernel cost is paid between ops; fused along the recorded
  data flow (`fused_program`) as the compile path fuses. A recording without its data
  flow (older ones): an op waits for the last op that made a tensor of one of its input
  shapes and dtypes, and values go through HBM between ops, so the device time errs on
  the slow side;
- the host pays one launch per graph instead of each op's launch and the module's Python
  (from the start of the module range around its first op to the end of the one around
  its last), plus torch.compile's own work per call (`compiled_call_host_ns`: Dynamo's
  guards, AOTAutograd's runtime wrappers, the autograd function around the backward; a
  fixed part and a part per tensor the graph takes in), half before the launch and half
  after; the graph's op slice is its launch only, as in a compiled recording.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer import tables
from neuron_explorer.common import trace_format as tf
from neuron_explorer.common.op_families import base_name
from neuron_explorer.memo import memoised
from neuron_explorer.trace import Trace
from neuron_explorer.what_if.distributed_ops import (
    collective_copies,
    ddp_reducer_ops,
    split_at_ddp_buckets,
)

if TYPE_CHECKING:
    from neuron_explorer.backend.hardware.kernel import Kernel

APPROXIMATIONS = (
    ("compiled mode: each step's forward ops and backward ops inside the model's module "
    "ranges are one graph launch each, the loss stays eager (the FX graphs are not in an "
    "eager trace)"),
    ("compiled mode: a graph's ops run as one program, fused along the recorded data flow "
    "(elementwise chains, GEMM epilogues, attention on chip, values kept in SBUF between "
    "kernels); values AOTAutograd would recompute in the backward are stored"),
    ("compiled mode: the host pays one launch per graph and torch.compile's work per call "
    "(fitted on a reference host: a fixed part and a part per graph input, or the "
    "modelled clock's per-launch cost) instead of the module's Python and launches"),
)
UNFUSED = ("compiled mode: a graph's ops run as one program; an op waits for the last op "
           "that made a tensor of its input shapes (this recording holds no data flow: "
           "record it again to have it); values go through HBM (no fusion of elementwise "
           "chains, no on-chip attention)")
# torch.compile's host work per graph call besides the launch, on a measured clock: Dynamo's
# guard checks, AOTAutograd's runtime wrappers and, for a backward graph, the autograd
# function that calls it; a fixed part and a part per tensor the graph takes in
# (`graph_inputs`), fitted to compiled recordings on the project's reference host
# (docs/whatif.md).
COMPILED_CALL_HOST_NS = 60_000
COMPILED_CALL_HOST_NS_PER_INPUT = 12_000


def compiled_call_host_ns(trace: Trace, inputs: int = 0) -> int:
    """The host time one compiled graph call taking `inputs` tensors costs besides its
    launch, on the clock the recording used: the modelled clock's per-launch Python, or
    the measured cost."""
    host_clock = trace.metadata.get("host_clock") or {}
    if host_clock.get("source") == "modelled":
        return int(host_clock.get("python_per_op_ns") or 0)
    return COMPILED_CALL_HOST_NS + COMPILED_CALL_HOST_NS_PER_INPUT * inputs


_EAGER_ONLY = frozenset({"aten::_local_scalar_dense"})
# a root module range of a torch.nn loss, named by its class (numbered when a script makes
# one each step: "MSELoss", "MSELoss2", ...)
_LOSS_ROOT = re.compile(r"\w*Loss\d*")


@dataclass(frozen=True)
class Section:
    """One op's stretch of a program, labelled as the compile path labels its sections
    (backend/compiler/program.py, which needs torch: a report must not import it)."""

    name: str
    ops: tuple[str, ...]
    source: str = ""
    module: str = ""


@dataclass
class _Graph:
    """The ops (host event indices) of one predicted graph launch."""

    events: list[int]
    name: str  # the program's kernel name
    launch_name: str  # the launch's op name, as the compile path names it


def _phases(trace: Trace, rows: pd.DataFrame, allow_rnn: bool = False,
            data_flow: tuple | None = None, without_reads: bool = False,
            whole_step: bool = False) -> np.ndarray:
    """Per host event: its graph label ("<step>.<call>:forward", "<step>.<call>:backward",
    a step's model calls numbered: micro-batches of gradient accumulation) or "" (eager).
    With the recording's `data_flow` (`recorded_data_flow`), a backward's in-place add
    into a tensor made before that backward began is the gradient accumulating into a
    parameter's `.grad` (AccumulateGrad, which autograd runs eagerly after the compiled
    backward): eager too. `without_reads`: the reads of a device value in a loop
    (`looped_reads`) are gone, as the fix of their graph break removes them (a branch
    made `torch.where`): they are DROPPED, and their modules compile. `whole_step`: the
    training step compiled, not the model alone: the ops outside the model from its first
    op on (the loss, its backward, the clipping) join the graphs too."""
    ids = rows["id"].to_numpy()
    labels = np.full(len(rows), "", dtype=object)
    is_op = rows["key"].map(lambda k: k is not None).to_numpy()
    if not is_op.any():
        return labels
    optimizer = tables.ancestor_of_kind(trace, ids, (tf.CAT_OPTIMIZER,)) >= 0
    backward = tables.ancestor_of_kind(trace, ids, (tf.CAT_BACKWARD,)) >= 0
    # torch.compile(model) compiles the model's forward, and AOTAutograd its backward:
    # ops outside the model's ranges (the loss and its backward) stay eager; a trace
    # without module ranges is compiled whole
    ranges = tables.of_kind(trace, tf.CAT_MODULE, tf.CAT_BACKWARD)
    in_model = (_in_compiled_module(trace, ids, allow_rnn, without_reads) if len(ranges)
                else np.ones(len(rows), bool))
    dropped = _looped_read_rows(trace, rows) if without_reads else np.zeros(len(rows), bool)
    # the loss and the other code beside the model (not the modules Dynamo skips in it)
    beside_model = (_beside_model(trace, ids) if whole_step and len(ranges)
                    else np.zeros(len(rows), bool))
    ts = rows["ts"].to_numpy(np.int64)
    step = tables.assign_steps(ts, trace.steps)
    # optimizer calls (zero_grad, step) begun before each op: one between a step's first
    # forward op in the model and a later op (zero_grad before loss.backward()) ends the
    # forward, and the loss's own backward ops (outside any module's backward range) start
    # the backward (counted from the model's first op: a step that begins with the last
    # one's `loss.item()`, then zero_grad, had its whole forward taken for a backward)
    calls = np.sort(tables.of_kind(trace, tf.CAT_OPTIMIZER)["ts"].to_numpy(np.int64))
    calls_before = np.searchsorted(calls, ts, side="right")
    keys = rows["key"].tolist()
    names = trace.table("slices")["name"]
    names = names.iloc[ids].astype(str).tolist()
    reducer = ddp_reducer_ops(names, keys, backward, data_flow)
    beside_collectives = collective_copies(names, keys, data_flow)
    in_backward: dict[int, bool] = {}
    forward_calls: dict[int, int] = {}  # per step: optimizer calls before its model's
    call: dict[int, int] = {}  # per step: its model calls so far
    began = np.full(len(rows), -1, np.int64)  # per op: where its call's phase began
    phase_start: dict[int, int] = {}
    for i in range(len(rows)):
        key = keys[i]
        if dropped[i]:  # a read the fix removes, and the host's wait inside it
            labels[i] = DROPPED
            continue
        if key is None or optimizer[i] or step[i] < 0:
            continue
        st = step[i]
        if st not in forward_calls and in_model[i] and not backward[i]:
            forward_calls[st] = calls_before[i]
        optimizer_since = calls_before[i] > forward_calls.get(st, calls_before[i])
        if in_backward.get(st) and in_model[i] and not backward[i] and not optimizer_since:
            # the model's forward again after a backward: the next micro-batch
            in_backward[st] = False
            call[st] = call.get(st, 0) + 1
            phase_start[st] = i
        if (backward[i] or optimizer_since) and not in_backward.get(st):
            in_backward[st] = True
            phase_start[st] = i
        began[i] = phase_start.setdefault(st, i)
        compiled = in_model[i] or (whole_step and beside_model[i] and st in forward_calls)
        if not compiled or key[0] in _EAGER_ONLY or i in beside_collectives or any(
                n == "direction" and v != "device_to_device" for n, v in key[3]):
            continue
        if in_backward.get(st) and (i in reducer or
                                    _accumulates_gradient(key, i, began[i], data_flow)):
            labels[i] = ACCUMULATES
            continue
        phase = "backward" if in_backward.get(st) else "forward"
        labels[i] = f"{st}.{call.get(st, 0)}:{phase}"
    if reducer:
        split_at_ddp_buckets(trace, rows, labels, data_flow, optimizer)
    return labels


# The label of an op that takes a gradient once the backward made it (accumulating it into
# `.grad`, DDP's reducer copying it into its bucket): eager, after the compiled backward
# that made the gradient, so it does not split that backward's graph
ACCUMULATES = "accumulates"
# The label of a read the fix removes (`without_reads`): not replayed, and no graph's end
DROPPED = "dropped"


def _looped_read_rows(trace: Trace, rows: pd.DataFrame) -> np.ndarray:
    """Which rows are reads of a device value in a loop (`looped_reads`: at that line, in
    that module)."""
    looped = looped_reads(trace)
    if not looped or not len(rows):
        return np.zeros(len(rows), bool)
    ids = rows["id"].to_numpy(np.int64)
    names = tables.slice_names(trace)[ids]
    source = trace.args.texts(tf.ARG_SOURCE, ids)
    module = trace.args.texts(tf.ARG_MODULE, ids)
    reads = np.array([n in _READS and looped.get(str(m)) == str(src)
                      for n, src, m in zip(names, source, module, strict=True)], bool)
    # and the host's wait that follows each read (a sync point, no op key), which else
    # ended the graph there: a forward of four reads replayed as five graphs, 4.8x the step
    # compiled
    waits = rows["key"].map(lambda k: k is None).to_numpy(bool)
    reads[1:] |= waits[1:] & reads[:-1]
    return reads


def _accumulates_gradient(key: tuple, row: int, phase_began: int,
                          data_flow: tuple | None) -> bool:
    """Whether the op at `row`, in a backward that began at row `phase_began`, adds in
    place into a tensor made before that backward: a gradient accumulating into `.grad`."""
    if data_flow is None or key[0] != "aten::add_":
        return False
    made_by = data_flow[0][row]
    return bool(made_by) and 0 <= made_by[0] < phase_began


def _beside_model(trace: Trace, ids: np.ndarray) -> np.ndarray:
    """Which slices run outside the model's module ranges: in no module's forward or
    backward range, or in a loss module's (`nn.CrossEntropyLoss()`)."""
    outer = tables.ancestor_of_kind(trace, ids, (tf.CAT_MODULE, tf.CAT_BACKWARD),
                                    outermost=True)
    names = trace.table("slices")["name"]
    loss = tables.map_unique(names, lambda n: _LOSS_ROOT.fullmatch(str(n)) is not None, bool)
    return (outer < 0) | loss[np.maximum(outer, 0)]


def _in_compiled_module(trace: Trace, ids: np.ndarray, allow_rnn: bool = False,
                        without_reads: bool = False) -> np.ndarray:
    """Which slices run inside a module torch.compile(model) compiles: the forward or
    backward range of a root module other than a loss (`nn.CrossEntropyLoss()` and the
    other torch.nn losses, named by their class, which a script calls beside its model),
    outside the modules Dynamo does not trace (an nn.GRU: the recorder marks them; traced
    with `allow_rnn`, as `torch._dynamo.config.allow_rnn = True` has it)."""
    ranges = (tf.CAT_MODULE, tf.CAT_BACKWARD)
    outer = tables.ancestor_of_kind(trace, ids, ranges, outermost=True)
    names = trace.table("slices")["name"]
    loss = tables.map_unique(names, lambda n: _LOSS_ROOT.fullmatch(str(n)) is not None, bool)
    inside = (outer >= 0) & ~loss[np.maximum(outer, 0)]
    skipped = {path: why for path, why in compile_skipped_modules(trace).items()
               if not (allow_rnn and why == "rnn")
               and not (without_reads and why == LOOPED_READ)}
    if skipped:
        under = tables.map_unique(names, lambda n: _within(str(n), skipped), bool)
        inside &= tables.ancestor_in(trace, ids, tables.kind_mask(trace, ranges) & under) < 0
    return inside


def advised_compile_mode(trace: Trace) -> str:
    """The compiled what-if mode the compile advice stands for: "compiled", or
    "compiled_allow_rnn" where RNN modules would stay eager unless the advice's
    `torch._dynamo.config.allow_rnn = True` is set too."""
    rnn = "rnn" in compile_skipped_modules(trace).values()
    return "compiled_allow_rnn" if rnn else "compiled"


def compile_skipped_modules(trace: Trace) -> dict[str, str]:
    """The module paths torch.compile runs eager, with why: "rnn" (`ARG_COMPILE_SKIPS`:
    Dynamo does not trace nn.RNN, nn.GRU or nn.LSTM) or LOOPED_READ (`looped_reads`); read
    once per trace (the rules and the replay ask)."""
    def read() -> dict[str, str]:
        modules = tables.of_kind(trace, tf.CAT_MODULE)
        if not len(modules):
            return {}
        why = trace.slice_args.column(tf.ARG_COMPILE_SKIPS, modules["id"].to_numpy(np.int64))
        skipped = {str(name): str(w) for name, w in zip(modules["name"], why, strict=True)
                   if w}
        return skipped | dict.fromkeys(looped_reads(trace), LOOPED_READ)

    return dict(memoised(trace, "compile_skipped_modules", read))


LOOPED_READ = "read in a loop"
_READS = ("aten::_local_scalar_dense",)  # .item(), bool(), float() of a device value


def looped_reads(trace: Trace) -> dict[str, str]:
    """Module path -> the source line where its forward reads a device value on the host
    inside a loop (the same line read twice or more in one call: an early exit's
    `.item()`). A graph break inside a loop makes Dynamo run the whole frame eagerly,
    and torch.nn's own modules called from it are not compiled as frames of their own: a
    prediction that compiled the blocks between the reads claimed 2.9x where compiling
    changed nothing."""
    ops = trace.ops
    reads = ops[ops["name"].astype(str).isin(_READS)]
    if not len(reads):
        return {}
    calls = tables.ancestor_of_kind(trace, reads["id"].to_numpy(np.int64), (tf.CAT_MODULE,))
    found = pd.DataFrame({"call": calls, "source": reads["source"].astype(str).to_numpy(),
                          "module": reads["module"].astype(str).to_numpy()})
    found = found[(found["call"] >= 0) & (found["source"] != "")]
    counts = found.groupby(["call", "source", "module"]).size()
    return {module: source for (_, source, module), n in counts.items() if n >= 2}


def _within(path: str, modules: dict[str, str]) -> bool:
    """Whether module `path` is one of `modules` or inside one."""
    return any(path == m or path.startswith(m + ".") for m in modules)


def _graphs(labels: np.ndarray) -> dict[int, _Graph]:
    """Consecutive ops with one label are one graph; keyed by its first event. An eager op
    between them (a read of a device value, a host copy) ends the graph, as it breaks
    torch.compile's (not a gradient's accumulation, which runs after the backward): a
    graph launched before a sync and holding the ops after it made the
    sync wait for the whole step (a decode step's `token.tolist()` before its model call)."""
    graphs: dict[int, _Graph] = {}
    first = -1
    for i, label in enumerate(labels.tolist()):
        if label in (ACCUMULATES, DROPPED):
            continue
        if not label:
            first = -1
            continue
        if first >= 0 and labels[first] == label:
            graphs[first].events.append(i)
            continue
        n = len(graphs) + 1
        graphs[i] = _Graph([i], f"graph_{n}_{label.split(':')[1]}", f"graph:{n}")
        first = i
    return graphs


class ProgramTooLarge(Exception):
    """A program over the dependency budget a caller set (a rule's prediction, which must
    not make a report wait; the `whatif` command sets none)."""


def build_program(keys: list, preset, name: str, max_dependencies: int | None = None,
                  flow=None):
    """One kernel running `keys` in order (see the module doc), fused along `flow` (a
    `fused_program.DataFlow`) where the recording gives one; None with no device work;
    raises ProgramTooLarge past `max_dependencies` before scheduling it."""
    from neuron_explorer.backend.hardware import KernelBuilder
    from neuron_explorer.backend.hardware.builder import DependencyBudgetExceeded

    def new_builder() -> KernelBuilder:
        b = KernelBuilder(preset, name)
        if max_dependencies is not None:
            b.dependency_budget = max_dependencies
        return b

    try:
        if flow is None:
            b = new_builder()
            _emit_ops(b, keys)
        else:
            from neuron_explorer.what_if.fused_program import emit_fused

            b, sections = emit_fused(new_builder, keys, flow)
            b.sections = tuple(sections)
    except DependencyBudgetExceeded:  # stopped at the instruction past the budget
        raise ProgramTooLarge(name) from None
    if not len(b):
        return None
    b.dependency_budget = math.inf  # what scheduling adds (spills) is not the program's
    return b.build()


def _emit_ops(b, keys: list) -> None:
    """Emit the ops `keys` into builder `b`, one section each (see the module doc)."""
    from neuron_explorer.backend.hardware.lowering import emit_host_fallback
    from neuron_explorer.backend.hardware.optable import NO_DEVICE_WORK, lowering_for
    from neuron_explorer.backend.replay import spec_of

    sections: list[Section] = []
    made: dict[tuple, tuple[int, ...]] = {}  # (shape, dtype) -> the last op that made one
    for key in keys:
        spec = spec_of(key)
        base = base_name(spec.name)
        if base in NO_DEVICE_WORK or (spec.outputs and all(t.numel == 0 for t in spec.outputs)):
            continue
        start = len(b)
        b.section = len(sections)
        sections.append(Section(base, (spec.name,)))
        # an op waits for the last op that made a tensor of its inputs' shapes and dtypes
        b.after = tuple(dict.fromkeys(i for t in spec.inputs for i in made.get(t, ())))
        fn = lowering_for(base)
        if fn is None:
            emit_host_fallback(b, spec)
        else:
            fn(b, spec)
        if len(b) > start:
            done = b.finished(start, through_stores=True)
            for t in spec.outputs:
                made[t] = done
    b.after = ()
    b.sections = tuple(sections)


def replay_compiled(trace: Trace, rows: pd.DataFrame, events: list, options,
                    max_dependencies: int | None = None, allow_rnn: bool = False,
                    without_reads: bool = False, whole_step: bool = False):
    """Like `backend.replay.replay`, with each step's graphs launched as one program each;
    returns (replayed events, host shift, approximations). `max_dependencies`: see
    build_program; `allow_rnn`: RNN, GRU and LSTM modules compiled too (see
    `_in_compiled_module`); `without_reads`: the reads in a loop gone, `whole_step`: the
    training step compiled, the loss with the model (`_phases`)."""
    from neuron_explorer.backend.hardware import DeviceTimeline
    from neuron_explorer.backend.replay import HostShift, ReplayedKernel, ReplayedOp, replay_one

    preset = options.preset()
    overhead = preset.host_launch_overhead_ns
    makers = recorded_makers(trace, rows)
    data_flow = recorded_data_flow(trace, rows, makers)
    labels = _phases(trace, rows, allow_rnn, data_flow, without_reads, whole_step)
    graphs = _graphs(labels)
    member = {i: g for g in graphs.values() for i in g.events[1:]}
    spans = _call_spans(trace, rows, events, graphs)
    timelines: dict[int, DeviceTimeline] = {}
    programs: dict[tuple, Kernel | None] = {}  # by its ops: each step's graphs are alike
    out: list = [None] * len(events)
    ends, deltas, collapsed = [], [], []
    shift = forward_inputs = 0
    # the last graph's recorded end, and where its call ends in the replay: the gradients'
    # accumulation recorded inside its span runs after it
    graph_finish, after_graph = -1, 0
    for i, ev in enumerate(events):
        if i in member or labels[i] == DROPPED:  # inside a graph launched at its first op
            continue
        timeline = timelines.setdefault(ev.device, DeviceTimeline(preset))
        graph = graphs.get(i)
        if graph is None and ev.ts < graph_finish:
            # after the graph, each keeps the host time it recorded before it (autograd's
            # and the hooks' Python, the op's dispatch)
            before = events[i - 1] if i else ev
            lead = max(0, ev.ts - before.ts - before.dur)
            new = replay_one(ev, after_graph + lead, timeline, preset)
            out[i] = new
            after_graph = new.ts + new.dur
            ends.append(graph_finish)  # the host's time after the graph grows by it
            deltas.append(lead + new.dur)
            shift += lead + new.dur
            continue
        if graph is None:
            new = replay_one(ev, ev.ts + shift, timeline, preset)
            out[i] = new
            if new.dur != ev.dur:
                ends.append(ev.ts + ev.dur)
                deltas.append(new.dur - ev.dur)
                shift += new.dur - ev.dur
            continue
        begin, finish = spans[i]
        keys = [events[j].key for j in graph.events]
        inputs = graph_inputs(keys)
        if graph.name.endswith("_forward"):
            forward_inputs = inputs
        else:  # the forward's saved tensors and parameters (shapes alias too much to count)
            inputs = max(inputs, forward_inputs)
        call = compiled_call_host_ns(trace, inputs)
        before = call // 2
        flow = None
        if data_flow is not None:
            from neuron_explorer.what_if.fused_program import program_flow

            flow = program_flow(graph.events, *data_flow, makers)
        ops = (tuple(keys), flow)
        if ops not in programs:
            programs[ops] = build_program(keys, preset, graph.name, max_dependencies, flow)
        kernel = _named(programs[ops], graph.name)
        ts = begin + shift + before  # the launch, after the call's work before it
        new = ReplayedOp(ts, 0, name=graph.launch_name)
        if kernel is not None:
            start, end = timeline.schedule(kernel, ts + overhead)
            new = ReplayedOp(ts, overhead, [ReplayedKernel(kernel, ev.device, ts + overhead,
                                                           start, end, False)],
                             kernel.model_flops, kernel.hbm_bytes, name=graph.launch_name)
        out[i] = new  # the graph's other ops are not launched: they stay None
        # the host's time for the call: its launch and torch.compile's work around it,
        # in place of the recorded span (the ops' launches and the Python between them)
        collapsed.append((begin, finish))
        ends.append(finish)
        deltas.append(call + new.dur - (finish - begin))
        graph_finish, after_graph = finish, begin + shift + call + new.dur
        shift += call + new.dur - (finish - begin)
    host_shift = HostShift(np.array(ends, np.int64), np.array(deltas, np.int64),
                           collapsed=collapsed)
    approximations = list(APPROXIMATIONS)
    if data_flow is None:
        approximations[1] = UNFUSED
    return out, host_shift, approximations


def recorded_data_flow(trace: Trace, rows: pd.DataFrame,
                       makers: list[tuple[int, ...]] | None = None
                       ) -> tuple[list[tuple[int, ...]], dict[int, set[int]]] | None:
    """Per row of the op stream `rows`: the rows that made its tensor inputs (-1: none
    recorded), and per row the rows that read its results; None for a recording without
    its data flow (`producers`, recorded since it was added). `makers`: the rows'
    `recorded_makers`, where the caller has them already."""
    makers = recorded_makers(trace, rows) if makers is None else makers
    if makers is None:
        return None
    op_ids = tables.number(trace, tf.ARG_OP_ID, rows["id"].to_numpy(np.int64), default=-1)
    row_of = {int(o): i for i, o in enumerate(op_ids.tolist()) if o >= 0}
    producers: list[tuple[int, ...]] = []
    readers: dict[int, set[int]] = {}
    for i, made_by in enumerate(makers):
        made = tuple(row_of.get(m, -1) if m >= 0 else -1 for m in made_by)
        producers.append(made)
        for p in made:
            if p >= 0:
                readers.setdefault(p, set()).add(i)
    return producers, readers


def recorded_makers(trace: Trace, rows: pd.DataFrame) -> list[tuple[int, ...]] | None:
    """Per row of the op stream `rows`, per tensor input, the op id of the op that made it
    (-1: none recorded), in `rows` or not: two ops' inputs made by one op outside them,
    of one shape, are one tensor; None for a recording without its data flow."""
    import json

    ids = rows["id"].to_numpy(np.int64)
    texts = trace.slice_args.column(tf.ARG_PRODUCERS, ids)
    if all(t is None for t in texts):
        return None
    op_ids = tables.number(trace, tf.ARG_OP_ID, ids, default=-1)
    return [tuple(op_id - d if d and op_id >= 0 else -1
                  for d in (json.loads(text) if text else ()))
            for op_id, text in zip(op_ids.tolist(), texts, strict=True)]


def _named(kernel: Kernel | None, name: str) -> Kernel | None:
    """`kernel` under another graph's name (its arrays are read-only: shared, not copied)."""
    if kernel is None or kernel.name == name:
        return kernel
    renamed = copy.copy(kernel)
    renamed.name = name
    return renamed


def graph_inputs(keys: list) -> int:
    """The tensors a graph of the ops `keys` takes from outside it (parameters, buffers,
    its inputs; for a backward graph also the forward's saved tensors): each op input of
    a shape and dtype no earlier op of the graph made. torch.compile's work per call
    (guards, runtime wrappers) grows with them."""
    made: set[tuple] = set()
    count = 0
    for _, inputs, outputs, _ in keys:
        for tensor in inputs:
            if tuple(tensor) not in made:
                count += 1
        made.update(tuple(t) for t in outputs)
    return count


def _call_spans(trace: Trace, rows: pd.DataFrame, events: list,
                graphs: dict[int, _Graph]) -> dict[int, tuple[int, int]]:
    """Per graph (keyed by its first event): the recorded host span its call replaces,
    from its first op to its last op's end, widened to the module ranges (forward or
    backward) that overlap it: the module's Python around its first and last op is what
    the compiled call runs instead. Not widened over an event that is not the graph's."""
    s = trace.table("slices")
    ranges = s[s["kind"].isin([tf.CAT_MODULE, tf.CAT_BACKWARD])]
    starts = ranges["ts"].to_numpy(np.int64)
    stops = starts + ranges["dur"].to_numpy(np.int64)
    recorded = rows["ts"].to_numpy(np.int64)
    spans = {}
    for first, graph in graphs.items():
        last = events[graph.events[-1]]
        begin, finish = events[first].ts, last.ts + last.dur
        near = (starts < finish) & (stops > begin)
        if near.any():
            wide = min(begin, int(starts[near].min())), max(finish, int(stops[near].max()))
            inside = np.flatnonzero((recorded >= wide[0]) & (recorded < wide[1]))
            if inside.min(initial=first) >= first and \
                    inside.max(initial=graph.events[-1]) <= graph.events[-1]:
                begin, finish = wide
        spans[first] = (begin, finish)
    return spans
