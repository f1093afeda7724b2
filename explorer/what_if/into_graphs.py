"""A compiled run's eager launches replayed inside its graphs: what bringing them into
compiled code saves (the loss computed inside the compiled function, gradient clipping
compiled, the optimizer's step `fused=True` or compiled).

Each eager op that launches kernels outside the graphs goes from the host, and its kernels'
device work joins the graph launched just before it in its step (the first graph after
it where none ran before; a loss's backward, run at the `backward()` line, the backward
graph after it): its host launches are what compiling it saves. The ops that
join one graph are built as one program fused along their recorded data flow (a chain of
elementwise and reduction ops loads its inputs once and stores only what is read
outside it), run after the graph, and at most as long as the ops took eagerly. Inside
the graph some of that work overlaps the graph's own, and the compile path may fuse it
otherwise, so this is an estimate either way on the device's side: a compiled MLP's eager
loss, 297 us of device time a step, took 103 us more inside its graphs (171 us saved a
step predicted, 194 measured); a model under autocast whose cast and loss, 205 us, took
5 us more compiled (AOTAutograd's joint graph took the loss's gradient in fp32) was
predicted 136 us; an inference head's cast, softmax, top-k, argmax and max, 1.49 ms,
were predicted 419 us where compiling saved 322 (the compile path took the cast into the
last matmul and stored its float32 result, which the replay's stream never stores).
Where a graph break in the model ends its graphs before the loss, the loss compiled with
it is a graph of its own and its backward another: a launch each is kept. The gradient
`loss.backward()` starts from (a 0-d `fill_`) stays eager in every case. The zero
gradient AOTAutograd fills in eagerly at `backward()` for an output the loss did not use
(logits returned for eager metrics with their gradient tracked) is left out, and the
backward graph that reads it is shortened by as long: the fix returns that output
detached (a trial's metrics beside a compiled loss were claimed 0.25x what computing them
inside the compiled function saved, 0.89x so). An
optimizer step `fused=True` replays is replayed so instead (`fused_optimizer`); a fused one
stays (compiled, it is a launch of its own all the same). Left where they are: copies
between host and device (the copies finding's), the ops before a step's first graph
(they make the model's inputs: a batch drawn on the device), the optimizer's `zero_grad`
(`zeroed_gradients`'), the in-place adds a compiled module's backward makes outside
its graphs (AccumulateGrad adding each micro-batch's gradients into `.grad`), which
compiling the loss or the step does not move, the ops of a Python loop over a batch
(`python_loop`'s: vectorising removes them; compiled, a loop that reads its samples on the
host breaks the graph instead), the hooks' ops inside a compiled module's calls where no
graph break but DDPOptimizer's split it (DDP's reducer scaling the gradients), and the
eager ops inside a compiled module's calls
(`graph_break_cost`'s and `recompilation`'s: a graph break, or Dynamo's recompile limit,
left them eager; a compiled head past its limit was claimed 1.35 ms a step for compiling
its loss, which saved 0.70).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from neuron_explorer import tables
from neuron_explorer.analyses.phases import in_analysed_work
from neuron_explorer.common import trace_format as tf
from neuron_explorer.memo import memoised
from neuron_explorer.trace import Trace
from neuron_explorer.what_if.counterfactual import op_kernel_rows, removal_saving_ns

ACCUMULATE = "aten::add_"
CASTS = frozenset({"aten::_to_copy", "aten::to"})  # copy ops that make a new tensor


@dataclass(frozen=True)
class EagerLaunches:
    """The analysed steps' ops that launch kernels beside a compiled run's graphs, by
    what would move them (rows of `trace.ops`)."""

    # the loss, clipping, other user code: compiling them moves them (not the ops before
    # a step's first graph, which make its inputs)
    movable: pd.DataFrame
    optimizer: pd.DataFrame  # the optimizer's step (its zero_grad left out)
    accumulations: pd.DataFrame  # AccumulateGrad's adds in a compiled module's backward
    graphs: pd.DataFrame  # the graph launches
    # inside a compiled module's calls, left eager by a graph break or the recompile limit
    broken: pd.DataFrame
    # inside a compiled module's calls where nothing of the program's broke its graphs:
    # hooks' work (DDP's reducer scaling the gradients), eager under every fix
    hooks: pd.DataFrame


def eager_launches(trace: Trace) -> EagerLaunches:
    """`EagerLaunches` of the analysed steps (computed once per trace)."""
    return memoised(trace, "eager_launches", lambda: _eager_launches(trace))


def _eager_launches(trace: Trace) -> EagerLaunches:
    from neuron_explorer.rules.graph_break_cost import compiled_call_of
    from neuron_explorer.rules.host_device_copies import COPY_OPS, CROSSING
    from neuron_explorer.rules.python_loop import loop_lines

    ops = in_analysed_work(trace, trace.ops[trace.ops["step"] >= 0])
    ops = ops[ops["kernel_count"] > 0]
    in_graph = ops["graph_id"].to_numpy() >= 0
    looped = ops["id"].isin(loop_lines(trace)[2]["id"]).to_numpy()
    # copies, but for a dtype cast on the device (`.float()` of a compiled model's output,
    # which compiled code takes in): a `_to_copy` none of whose kernels crosses to or from
    # the host (copies into buffers, `copy_`, stay: DDP's reducer fills its buckets so)
    k = trace.kernels
    crossing = k["name"].astype(str).str.contains(CROSSING).to_numpy(bool) | (
        k["kind"].to_numpy() == "memcpy")
    names = ops["name"].astype(str)
    cast = names.isin(CASTS) & ~ops["id"].isin(k["op_slice_id"].to_numpy()[crossing])
    copies = (names.isin(COPY_OPS) & ~cast).to_numpy()
    eager = ops[~in_graph & ~looped & ~copies]
    ids = eager["id"].to_numpy(np.int64)
    optimizer = tables.ancestor_of_kind(trace, ids, (tf.CAT_OPTIMIZER,))
    names = trace.table("slices")["name"].array  # a few rows read: no string per slice
    zero_grad = np.zeros(len(ids), bool)
    inside = optimizer >= 0
    zero_grad[inside] = pd.Series(names[optimizer[inside]]).astype(str).str.endswith(
        "zero_grad").to_numpy()
    accumulation = ~inside & (eager["name"].astype(str).to_numpy() == ACCUMULATE) & (
        tables.ancestor_of_kind(trace, ids, (tf.CAT_BACKWARD,)) >= 0)
    # inside a compiled module's calls (or their backward), eager only where a graph break
    # or Dynamo's recompile limit left them: compiling the loss or the step moves none
    in_call = ~inside & ~accumulation & (compiled_call_of(trace, ids) >= 0)
    # with no graph break but DDPOptimizer's and no recompile, what runs eagerly inside the
    # compiled calls is hooks' work (DDP's reducer scaling each gradient), which no change
    # to the program compiles (a trial's DDP model was promised 1.06 ms of a 1.42 ms step
    # for it, and fused=True saved nothing)
    hooks = in_call if in_call.any() and not _breaks_of_the_users(trace) \
        else np.zeros(len(ids), bool)
    broken = in_call & ~hooks
    inputs = ~inside & _before_the_graphs(eager, ops[in_graph])
    return EagerLaunches(eager[~inside & ~accumulation & ~broken & ~inputs & ~hooks],
                         eager[inside & ~zero_grad], eager[accumulation], ops[in_graph],
                         eager[broken], eager[hooks])


@dataclass(frozen=True)
class IntoGraphs:
    """What the analysed steps save with their eager launches inside their graphs."""

    saving_ns: float
    fused: bool  # the optimizer's step replayed fused=True (else compiled, or left)


def into_graphs_saving(trace: Trace, optimizer: bool = True) -> IntoGraphs | None:
    """What the analysed steps save with their movable eager launches inside the graphs
    and (`optimizer`) the optimizer's step fused (or, where no fused replay applies and it
    is not fused already, inside the graphs too); None where the run has no graphs or
    eager launches, or cannot be replayed."""
    return memoised(trace, f"into_graphs_saving:{optimizer}", lambda: _saving(trace, optimizer))


def _saving(trace: Trace, with_optimizer: bool) -> IntoGraphs | None:
    from neuron_explorer.rules.host_bound import fused_optimizer, left_by_breaks
    from neuron_explorer.what_if.fused_optimizer import fused_optimizer_saving

    launches = eager_launches(trace)
    if not len(launches.graphs):
        return None
    moved = [launches.movable]
    fused = fused_optimizer_saving(trace) if with_optimizer and len(launches.optimizer) \
        else None
    removed: list[np.ndarray] = []
    lengths: dict[int, int] = {}
    if fused is not None and fused.replay is not None:
        removed.append(fused.replay[0])
        lengths.update(fused.replay[1])
    elif with_optimizer and len(launches.optimizer) and not fused_optimizer(trace):
        moved.append(launches.optimizer)  # compiled, where fused=True does not apply
    ops = pd.concat(moved)
    # the zero gradients filled in for outputs returned with their gradient tracked: the
    # fix returns those detached, so neither the fill nor the backward's read of it is left
    tangents = ops[zero_tangents(ops)]
    ops = ops[~backward_seed(ops) & ~zero_tangents(ops)]  # the seed stays eager: see above
    if not len(ops) and not len(tangents) and not removed:
        return None
    rows = op_kernel_rows(trace)
    kernel_dur = trace.kernels["dur"].to_numpy(np.int64)
    if len(launches.broken) and not left_by_breaks(trace):
        # a graph break in the model ends its graphs before the loss: compiled with it, the
        # loss is a graph of its own, and its backward one more (a compiled CNN's eager loss
        # was claimed 325 us a step, where compiling it saved 150). Where the break left
        # most of the model eager, host_bound's saving comes after its fix: the loss joins
        # the model's graphs then.
        launched, ops = _own_graphs(ops)
        for op, added in launched.items():
            first = rows.get(op)
            if first:
                lengths[first[0]] = int(added)
    seeds = launches.movable[backward_seed(launches.movable)]
    for graph_op, joined in _joined(trace, launches.graphs, ops,
                                    frozenset(seeds["source"].astype(str))).items():
        first = rows.get(graph_op)
        if first:
            row = first[0]
            length = lengths.get(row, int(kernel_dur[row]))
            lengths[row] = length + int(joined.added_ns)
    for graph_op, read_ns in _tangents_read(launches.graphs, tangents).items():
        first = rows.get(graph_op)
        if first:
            row = first[0]
            lengths[row] = max(lengths.get(row, int(kernel_dur[row])) - int(read_ns), 0)
    removed += [ops["id"].to_numpy(np.int64), tangents["id"].to_numpy(np.int64)]
    saving = removal_saving_ns(trace, np.concatenate(removed),
                               f"eager ops into graphs:{with_optimizer}", lengths)
    return None if saving is None else IntoGraphs(saving, fused is not None and
                                                  fused.replay is not None)


def _breaks_of_the_users(trace: Trace) -> bool:
    """Whether the run recompiled or broke its graphs other than where DDPOptimizer splits
    them at its buckets (on purpose): only then do eager ops inside a compiled call come
    from the program's code."""
    from neuron_explorer.rules.recompilation import DDP_SPLIT

    cs = trace.compile_summary()
    breaks, recompiles = cs["graph_breaks"], cs["recompiles"]
    ddp = breaks["reason"].astype(str).str.contains(DDP_SPLIT, regex=False)
    return bool(len(recompiles)) or not bool(ddp.all())


def _before_the_graphs(ops: pd.DataFrame, graphs: pd.DataFrame) -> np.ndarray:
    """Per op: whether it runs before its step's first graph launch: it makes the model's
    inputs (a batch drawn on the device, a mask), which compiling the loss, the clipping or
    the optimizer's step leaves where it is (a trial's torch.randn and torch.randint were
    claimed as moved, and the claim was 1.43x what compiling the loss saved)."""
    if not len(graphs):
        return np.zeros(len(ops), bool)
    first = graphs.groupby("step")["ts"].min()
    starts = first.reindex(ops["step"].to_numpy()).to_numpy(np.float64)
    return ~np.isnan(starts) & (ops["ts"].to_numpy() < starts)


def backward_seed(ops: pd.DataFrame) -> np.ndarray:
    """Per op: whether it is the gradient `loss.backward()` starts from, a 0-d tensor
    filled with ones (`aten::fill_`): autograd makes it eagerly, whatever is compiled."""
    return ((ops["name"].astype(str) == "aten::fill_")
            & (ops["shapes"].astype(str) == "[[]]")).to_numpy()


def accumulating_adds(ops: pd.DataFrame) -> np.ndarray:
    """Per op: whether it is autograd's AccumulateGrad adding a gradient into the `.grad`
    already there at `backward()` (gradient accumulation over micro-batches, or gradients
    zeroed in place): an `aten::add_` at the line of the gradient `backward()` starts
    from. Where the compiled function is no module (the model and its loss compiled
    together), no backward range holds them."""
    return at_backward_line(ops) & (ops["name"].astype(str) == ACCUMULATE).to_numpy()


def at_backward_line(ops: pd.DataFrame) -> np.ndarray:
    """Per op: whether it runs at a line where `backward()` starts (the seed's line)."""
    lines = set(ops["source"].astype(str)[backward_seed(ops)])
    return ops["source"].astype(str).isin(lines).to_numpy()


def zero_tangents(ops: pd.DataFrame) -> np.ndarray:
    """Per op: whether it is a zero gradient AOTAutograd fills in at `backward()` for an
    output of a compiled function the loss did not use (logits returned for metrics with
    their gradient tracked): an `aten::zero_` of a tensor, not a scalar, at the line of
    the gradient `backward()` starts from. The backward graph reads it in."""
    return at_backward_line(ops) & ((ops["name"].astype(str) == "aten::zero_")
                                    & (ops["shapes"].astype(str) != "[[]]")).to_numpy()


def _tangents_read(graphs: pd.DataFrame, tangents: pd.DataFrame) -> dict[int, float]:
    """graph launch op id -> the device time of the zero gradients it reads: each is read
    by the first graph launched after it in its step (the backward's), in about the time
    its fill took to write the same bytes (a 1024-class MLP's backward graph ran 25 us
    shorter with the logits returned detached; their fill had taken 27 us)."""
    read: dict[int, float] = {}
    for step, mine in tangents.groupby("step"):
        g = graphs[graphs["step"] == step].sort_values("ts")
        at = np.searchsorted(g["ts"].to_numpy(), mine["ts"].to_numpy(), side="right")
        for i, dur in zip(at, mine["device_dur"].fillna(0), strict=True):
            if i < len(g):
                graph = int(g["id"].iloc[i])
                read[graph] = read.get(graph, 0.0) + float(dur)
    return read


def _own_graphs(ops: pd.DataFrame) -> tuple[dict[int, float], pd.DataFrame]:
    """The movable ops compiled as graphs of their own: per step, those before the first
    op whose name says backward (the loss) one graph, the rest (its backward, and any code
    after it) another. Returns, per graph, the op standing for its launch (its first,
    kept where it was) with the device time of all the graph's ops; and the ops that go."""
    launched: dict[int, float] = {}
    gone = []
    for _, mine in ops.sort_values("ts").groupby("step"):
        names = mine["name"].astype(str)
        backward = names.str.contains("_backward").to_numpy()
        first_back = int(np.argmax(backward)) if backward.any() else len(mine)
        for part in (mine.iloc[:first_back], mine.iloc[first_back:]):
            if len(part):
                launched[int(part["id"].iloc[0])] = float(part["device_dur"].fillna(0).sum())
                gone.append(part.iloc[1:])
    return launched, pd.concat(gone) if gone else ops.iloc[:0]


@dataclass(frozen=True)
class Joined:
    """The eager ops that join one graph: their recorded device time, and their length as
    one program fused along their recorded data flow (None where it cannot be built)."""

    eager_ns: float
    fused_ns: float | None

    @property
    def added_ns(self) -> float:
        """What they add to the graph they join: run after its work, as the fused program,
        at most as long as they took eagerly."""
        return self.eager_ns if self.fused_ns is None else min(self.fused_ns, self.eager_ns)


def _joined(trace: Trace, graphs: pd.DataFrame, ops: pd.DataFrame,
            backward_lines: frozenset[str]) -> dict[int, Joined]:
    """graph launch op id -> the ops that join it: each op joins the graph launched last
    before it in its step (else the first after it), but for a loss's backward (the ops at
    a line of `backward_lines`, where `backward()` is called), which joins the graph
    launched next, the model's backward, as a program of its own: compiled, AOTAutograd
    splits the loss between the forward and backward graphs, and what the backward reads
    of the forward goes through HBM (one program fusing both kept it on chip: trial 5's
    autocast loss was claimed 1.31x what compiling it saved; 1.04x so)."""
    joined: dict[int, Joined] = {}
    programs: dict[tuple, float | None] = {}  # each step's ops alike: built once
    for step, mine in ops.groupby("step"):
        g = graphs[graphs["step"] == step].sort_values("ts")
        if not len(g):
            continue
        mine = mine.sort_values("ts")
        at = np.searchsorted(g["ts"].to_numpy(), mine["ts"].to_numpy(), side="right") - 1
        # the loss's backward joins the model's backward: the next graph
        back = mine["source"].astype(str).isin(backward_lines).to_numpy()
        at = np.where(back & (at + 1 < len(g)), at + 1, at)
        target = g["id"].to_numpy(np.int64)[np.clip(at, 0, len(g) - 1)]
        for graph in dict.fromkeys(target.tolist()):
            members = mine[target == graph]
            joined[int(graph)] = Joined(float(members["device_dur"].fillna(0).sum()),
                                        fused_ns(trace, members, programs))
    return joined


def fused_ns(trace: Trace, ops: pd.DataFrame, programs: dict[tuple, float | None]
              ) -> float | None:
    """The length of `ops` as one program fused along their recorded data flow (what an op
    outside them made, or reads, goes through HBM); None where the trace holds no op keys
    or data flow for them, or the program is too large to build while a report waits."""
    from neuron_explorer.backend.hardware import DeviceTimeline
    from neuron_explorer.backend.replay import ReplayOptions
    from neuron_explorer.what_if.compiled import (
        ProgramTooLarge,
        build_program,
        recorded_data_flow,
        recorded_makers,
    )
    from neuron_explorer.what_if.fused_program import program_flow
    from neuron_explorer.what_if.replay import PREDICTION_MAX_DEPENDENCIES, op_keys

    keys = op_keys(trace, ops["id"].to_numpy(np.int64))
    makers = recorded_makers(trace, ops)
    data_flow = recorded_data_flow(trace, ops, makers)
    if keys is None or data_flow is None:
        return None
    flow = program_flow(range(len(ops)), *data_flow, makers)
    key = (tuple(keys), flow)
    if key not in programs:
        preset = ReplayOptions(trace.hardware or "trn2").preset()
        try:
            program = build_program(keys, preset, "joined", PREDICTION_MAX_DEPENDENCIES, flow)
        except ProgramTooLarge:
            programs[key] = None
        else:
            span = DeviceTimeline(preset).schedule(program, 0) if program is not None else (0, 0)
            programs[key] = float(span[1] - span[0])
    return programs[key]
