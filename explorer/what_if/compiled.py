"""`whatif(..., mode="compiled")`: an eager recording re-timed as if its steps were compiled.

The FX graphs torch.compile would trace are not in an eager trace, so the compile path
is approximated from the op stream, in the shape `train(..., compile=True)` runs:
- each step's forward and loss ops (those before its first backward slice) become one
  graph launch, and its backward ops another; host<->device copies, reads of device
  values, the optimizer and zero_grad stay eager, as they do in a compiled run;
- a graph launch is one program, as the compile path makes it: every op's own lowering
  emitted into one `KernelBuilder`, so one op's loads overlap the compute before it and
  no launch latency or fixed kernel cost is paid between ops. The trace holds no data
  flow: an op waits for the last op that made a tensor of one of its input shapes and
  dtypes. Values go through HBM between ops (the compile path's fusion keeps some in
  SBUF and streams elementwise chains), so the device time errs on the slow side;
- the host pays one launch per graph instead of each op's launch and Python time, plus
  torch.compile's own work per call (`compiled_call_host_ns`: Dynamo's guards,
  AOTAutograd's runtime wrappers, the autograd function around the backward), half
  before the launch and half after; host slices inside a graph's span (module ranges)
  shrink onto its call.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from neuron_explorer import tables
from neuron_explorer.common import trace_format as tf
from neuron_explorer.common.op_families import base_name
from neuron_explorer.trace import Trace

APPROXIMATIONS = (
    ("compiled mode: each step's forward+loss ops and its backward ops are one graph launch "
    "each (the FX graphs are not in an eager trace)"),
    ("compiled mode: a graph's ops run as one program; an op waits for the last op that made "
    "a tensor of its input shapes (no data flow is recorded); values go through HBM (no "
    "fusion of elementwise chains, no on-chip attention)"),
    ("compiled mode: the host pays one launch per graph and torch.compile's work per call "
    "(a constant measured on a reference host, or the modelled clock's per-launch cost); "
    "host slices inside a graph shrink onto its call"),
)
# torch.compile's host work per graph call besides the launch, on the project's reference
# host (2 cores): Dynamo's guard checks, AOTAutograd's runtime wrappers and, for a
# backward graph, the autograd function that calls it. Measured as what each workload of
# benchmarks/bench_whatif_compiled.py needs per call for its compiled step, load-free
# clock: 570 (MLP), 740 (transformer), 950 (transformer, bf16 autocast), 800 (conv net)
# and 600 us (inference loop); docs/whatif.md.
COMPILED_CALL_HOST_NS = 650_000


def compiled_call_host_ns(trace: Trace) -> int:
    """The host time one compiled graph call costs besides its launch, on the clock the
    recording used: the modelled clock's per-launch Python, or the measured constant."""
    host_clock = trace.metadata.get("host_clock") or {}
    if host_clock.get("source") == "modelled":
        return int(host_clock.get("python_per_op_ns") or 0)
    return COMPILED_CALL_HOST_NS
_EAGER_ONLY = frozenset({"aten::_local_scalar_dense"})


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


def _phases(trace: Trace, rows: pd.DataFrame) -> np.ndarray:
    """Per host event: its graph label ("<step>:forward", "<step>:backward") or "" (eager)."""
    ids = rows["id"].to_numpy()
    labels = np.full(len(rows), "", dtype=object)
    is_op = rows["key"].map(lambda k: k is not None).to_numpy()
    if not is_op.any():
        return labels
    optimizer = tables.ancestor_of_kind(trace, ids, (tf.CAT_OPTIMIZER,)) >= 0
    backward = tables.ancestor_of_kind(trace, ids, (tf.CAT_BACKWARD,)) >= 0
    step = tables.assign_steps(rows["ts"].to_numpy(np.int64), trace.steps)
    keys = rows["key"].tolist()
    in_backward: dict[int, bool] = {}
    for i in range(len(rows)):
        key = keys[i]
        if key is None or optimizer[i] or step[i] < 0:
            continue
        if key[0] in _EAGER_ONLY or any(n == "direction" and v != "device_to_device"
                                        for n, v in key[3]):
            continue
        if backward[i]:
            in_backward[step[i]] = True
        phase = "backward" if in_backward.get(step[i]) else "forward"
        labels[i] = f"{step[i]}:{phase}"
    return labels


def _graphs(labels: np.ndarray) -> dict[int, _Graph]:
    """Consecutive ops with one label are one graph; keyed by its first event. An eager op
    between them (a read of a device value, a host copy) ends the graph, as it breaks
    torch.compile's: a graph launched before a sync and holding the ops after it made the
    sync wait for the whole step (a decode step's `token.tolist()` before its model call)."""
    graphs: dict[int, _Graph] = {}
    first = -1
    for i, label in enumerate(labels.tolist()):
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


def build_program(keys: list, preset, name: str, max_dependencies: int | None = None):
    """One kernel running `keys` in order (see the module doc), or None with no device work;
    raises ProgramTooLarge past `max_dependencies` before scheduling it."""
    from neuron_explorer.backend.hardware import KernelBuilder
    from neuron_explorer.backend.hardware.lowering import emit_host_fallback
    from neuron_explorer.backend.hardware.optable import NO_DEVICE_WORK, lowering_for
    from neuron_explorer.backend.replay import spec_of

    b = KernelBuilder(preset, name)
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
    if not len(b):
        return None
    if max_dependencies is not None and b.dependency_count() > max_dependencies:
        raise ProgramTooLarge(name)
    b.sections = tuple(sections)
    return b.build()


def replay_compiled(trace: Trace, rows: pd.DataFrame, events: list, options,
                    max_dependencies: int | None = None):
    """Like `backend.replay.replay`, with each step's graphs launched as one program each;
    returns (replayed events, host shift, approximations). `max_dependencies`: see
    build_program."""
    from neuron_explorer.backend.hardware import DeviceTimeline
    from neuron_explorer.backend.replay import HostShift, ReplayedKernel, ReplayedOp, replay_one

    preset = options.preset()
    overhead = preset.host_launch_overhead_ns
    call = compiled_call_host_ns(trace)
    graphs = _graphs(_phases(trace, rows))
    member = {i: g for g in graphs.values() for i in g.events[1:]}
    timelines: dict[int, DeviceTimeline] = {}
    out: list = [None] * len(events)
    ends, deltas, collapsed = [], [], []
    shift = 0
    for i, ev in enumerate(events):
        if i in member:  # inside a graph launched at its first op
            continue
        timeline = timelines.setdefault(ev.device, DeviceTimeline(preset))
        ts = ev.ts + shift
        graph = graphs.get(i)
        if graph is None:
            new = replay_one(ev, ts, timeline, options, preset)
            out[i] = new
            if new.dur != ev.dur:
                ends.append(ev.ts + ev.dur)
                deltas.append(new.dur - ev.dur)
                shift += new.dur - ev.dur
            continue
        last = events[graph.events[-1]]
        span = last.ts + last.dur - ev.ts
        kernel = build_program([events[j].key for j in graph.events], preset, graph.name,
                               max_dependencies)
        new = ReplayedOp(ts, call, name=graph.launch_name)
        if kernel is not None:
            launch = ts + call // 2 + overhead
            start, end = timeline.schedule(kernel, launch)
            new = ReplayedOp(ts, call + overhead, [ReplayedKernel(kernel, ev.device, launch,
                                                                  start, end, False)],
                             kernel.model_flops, kernel.hbm_bytes, name=graph.launch_name)
        out[i] = new  # the graph's other ops are not launched: they stay None
        collapsed.append((ev.ts, last.ts + last.dur))
        ends.append(last.ts + last.dur)
        deltas.append(new.dur - span)
        shift += new.dur - span
    host_shift = HostShift(np.array(ends, np.int64), np.array(deltas, np.int64),
                           collapsed=collapsed)
    return out, host_shift, list(APPROXIMATIONS)
