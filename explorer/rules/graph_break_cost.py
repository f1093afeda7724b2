"""What a step's graph breaks cost it: the run replayed with each model call's graphs
merged into one, as removing the breaks compiles it.

A break splits a model call's forward into several graphs, with eager ops (and often a
sync: `.item()`, `print`) between them, and its backward into as many. Without the break
the call launches one forward and one backward graph: the other graphs' launches and the
ops between them go (their host time, a graph call's torch.compile work in its slice),
their device work runs in the kept graph's kernel, and a sync between them waits no more.
Valued at its compile time alone, a break in a modelled recording (compiling counts
nothing there) said "no time to save now" where removing it saved 256 us a step. A break
can also leave the rest of the call eager: a printed `.item()` fails its float's guard
every call, and once Dynamo stops recompiling, the code after the break runs uncompiled.
Those eager ops, in the call's forward and in its backward, go into the kept graphs too
(a user's print claimed nothing where removing it saved 60% of the step).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer import tables
from neuron_explorer.analyses.phases import in_analysed_work
from neuron_explorer.common import trace_format as tf

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace


MERGED_BASIS = ("replay: the run replayed with each model call's graphs merged into one "
                "forward and one backward (the other graphs' launches, and the eager ops "
                "and syncs between them, gone; their device work in the kept graphs)")


def merged_graphs_saving_ns(trace: Trace) -> float | None:
    """ns the analysed steps save with each model call's graphs merged (see the module
    doc); None where no call launches more than one forward graph, or the trace cannot
    be replayed."""
    from neuron_explorer.what_if.counterfactual import removal_saving_ns

    ops = in_analysed_work(trace, trace.ops)
    k = trace.kernels
    if not len(ops) or not len(k):
        return None
    graphs = ops[ops["graph_id"].to_numpy() >= 0]
    row_of = pd.Series(np.arange(len(k)), index=k["op_slice_id"].to_numpy(np.int64))
    row_of = row_of[~row_of.index.duplicated()]
    names = k["name"].astype(str).to_numpy()
    rows = row_of.reindex(graphs["id"].to_numpy()).to_numpy()
    known = ~np.isnan(rows)
    graphs, rows = graphs[known], rows[known].astype(np.int64)
    backward = np.array([n.endswith("_backward") for n in names[rows]], bool)
    ids = graphs["id"].to_numpy()
    call = tables.ancestor_of_kind(trace, ids, (tf.CAT_MODULE,), outermost=True)
    # a graph launched by the outermost call itself: that call is the compiled module's
    whole = tables.ancestor_of_kind(trace, ids, (tf.CAT_MODULE,)) == call
    forward = graphs.assign(row=rows, call=call, whole=whole)[~backward & (call >= 0)]
    removed: list[int] = []
    lengths: dict[int, int] = {}
    dur = k["dur"].to_numpy(np.int64)
    merged_per_step: dict[int, int] = {}
    for call_id, launches in forward.groupby("call"):
        launches = launches.sort_values("ts")
        kept = int(launches["row"].iloc[0])
        # the eager ops and syncs between its graphs (the break's), or in the whole call
        # where it is the compiled module's (those the break left eager too)
        between = (_eager_inside(trace, ops, int(call_id)) if launches["whole"].all()
                   else _between(trace, ops, int(call_id), launches))
        if len(launches) < 2 and not between:
            continue
        extra = int(dur[launches["row"].iloc[1:]].sum())
        extra += int(k.loc[k["op_slice_id"].isin(between), "dur"].sum())
        lengths[kept] = int(dur[kept]) + extra
        removed += launches["id"].iloc[1:].tolist() + between
        step = int(launches["step"].iloc[0])
        merged_per_step[step] = merged_per_step.get(step, 0) + len(launches) - 1
    if not removed:  # a compiled function's graphs, in no module call the recorder saw
        removed, lengths, merged_per_step = _merged_at_breaks(
            trace, ops, graphs.assign(row=rows), backward, dur, k)
    if not removed:
        return None
    # as many backward graphs go in the step (the first launched is the last forward's),
    # and the eager ops between them in the backward
    bwd = graphs.assign(row=rows)[backward].sort_values("ts")
    ids = bwd["id"].to_numpy()
    outer = tables.ancestor_of_kind(trace, ids, (tf.CAT_BACKWARD,), outermost=True)
    bwd = bwd.assign(call=outer, whole=tables.ancestor_of_kind(
        trace, ids, (tf.CAT_BACKWARD,)) == outer)
    for step, n in merged_per_step.items():
        mine = bwd[bwd["step"] == step]
        if not len(mine):
            continue
        gone, kept = mine.iloc[:min(n, len(mine) - 1)], int(mine["row"].iloc[-1])
        call_id = int(mine["call"].iloc[-1])
        between = [] if call_id < 0 else (
            _eager_inside(trace, ops, call_id, tf.CAT_BACKWARD) if mine["whole"].iloc[-1]
            else _between(trace, ops, call_id, mine, tf.CAT_BACKWARD))
        if not len(gone) and not between:
            continue
        extra = int(dur[gone["row"]].sum())
        extra += int(k.loc[k["op_slice_id"].isin(between), "dur"].sum())
        lengths[kept] = lengths.get(kept, int(dur[kept])) + extra
        removed += gone["id"].tolist() + between
    return removal_saving_ns(trace, np.array(removed, np.int64), "graph breaks merged",
                             lengths)


def _merged_at_breaks(trace: Trace, ops: pd.DataFrame, graphs: pd.DataFrame,
                      backward: np.ndarray, dur: np.ndarray, k: pd.DataFrame
                      ) -> tuple[list[int], dict[int, int], dict[int, int]]:
    """For forward graphs outside any module call (a compiled function holding the model's
    call hides the module hooks): each run of a step's graphs split only by eager ops at a
    graph break's line, or by nothing (the caller's graph resumed after the callee's),
    merged into its first, as removing the break does. A print in a
    forward compiled through a loss function claimed nothing where removing it saved 45%
    of the step."""
    breaks = trace.compile_summary()["graph_breaks"]
    lines = {str(s).split(" in ")[0] for s in breaks["source"] if s}
    removed: list[int] = []
    lengths: dict[int, int] = {}
    per_step: dict[int, int] = {}
    eager = ops[ops["graph_id"].to_numpy() < 0]
    syncs = tables.of_kind(trace, tf.CAT_SYNC)
    launched = np.sort(graphs["ts"].to_numpy(np.int64))  # every graph, the backward's too
    forward = graphs[~backward]
    for step, mine in forward.groupby("step"):
        mine = mine.sort_values("ts")
        kept = int(mine["row"].iloc[0])
        for a, b in zip(mine.iloc[:-1].itertuples(), mine.iloc[1:].itertuples(), strict=True):
            # split by the break's eager ops, or by nothing (the resumed caller's graph
            # after the callee's): one graph without the break
            between = eager[(eager["ts"] > a.ts) & (eager["ts"] < b.ts)]
            # another graph between them (a backward before an optimizer's graph): no break
            # of one forward
            other = np.searchsorted(launched, b.ts) - np.searchsorted(launched, a.ts, "right")
            if not lines or other > 0 or not between["source"].astype(str).isin(lines).all():
                kept = int(b.row)  # not split by a break: a graph of its own
                continue
            ids = between["id"].tolist()
            extra = int(dur[b.row]) + int(k.loc[k["op_slice_id"].isin(ids), "dur"].sum())
            lengths[kept] = lengths.get(kept, int(dur[kept])) + extra
            # the break's read waits no more (a sync ends as the next graph launches)
            waited = syncs[(syncs["ts"] > a.ts) & (syncs["ts"] <= b.ts)]["id"].tolist()
            removed += [int(b.id), *ids, *waited]
            per_step[int(step)] = per_step.get(int(step), 0) + 1
    return removed, lengths, per_step


def _between(trace: Trace, ops: pd.DataFrame, call_id: int, launches: pd.DataFrame,
             kind: str = tf.CAT_MODULE) -> list[int]:
    """The eager ops and syncs inside module call `call_id` (a range of `kind`: the
    forward's, or its backward's) between its first and last graph launch."""
    start = int(launches["ts"].iloc[0])
    end = int(launches["ts"].iloc[-1])
    eager = ops[(ops["graph_id"].to_numpy() < 0) & (ops["ts"].to_numpy() > start)
                & (ops["ts"].to_numpy() < end)]
    syncs = tables.of_kind(trace, tf.CAT_SYNC)
    # a sync ends as the next graph launches (its wait over, 0 ns where the device had
    # finished): at that graph's time
    syncs = syncs[(syncs["ts"].to_numpy() > start) & (syncs["ts"].to_numpy() <= end)]
    return _inside(trace, eager, syncs, call_id, kind)


def _inside(trace: Trace, eager: pd.DataFrame, syncs: pd.DataFrame, call_id: int,
            kind: str) -> list[int]:
    found = pd.concat([eager[["id"]], syncs[["id"]]], ignore_index=True)["id"].to_numpy()
    inside = tables.ancestor_of_kind(trace, found, (kind,), outermost=True) == call_id
    return [int(i) for i in found[inside]]


def _eager_inside(trace: Trace, ops: pd.DataFrame, call_id: int,
                  kind: str = tf.CAT_MODULE) -> list[int]:
    """The eager ops and syncs inside the call `call_id` (an outermost slice of `kind`: a
    compiled module's forward, or its backward, which launches graphs itself): each is
    there because a break split its graph or left the code after it uncompiled."""
    s = trace.table("slices")
    start = int(s["ts"].to_numpy()[call_id])
    end = start + int(s["dur"].to_numpy()[call_id])
    eager = ops[(ops["graph_id"].to_numpy() < 0) & (ops["ts"].to_numpy() >= start)
                & (ops["ts"].to_numpy() < end)]
    syncs = tables.of_kind(trace, tf.CAT_SYNC)
    syncs = syncs[(syncs["ts"].to_numpy() >= start) & (syncs["ts"].to_numpy() <= end)]
    return _inside(trace, eager, syncs, call_id, kind)


READS_GONE_BASIS = ("replay: the run replayed compiled with the reads of a device value in "
                    "the loop gone (their branch on the device: torch.where), the forward one "
                    "graph")


def reads_gone_saving_ns(trace: Trace) -> float | None:
    """ns the analysed steps save with the graph break of a read in a loop removed: Dynamo
    runs a frame whose loop breaks wholly eager, so no graph of it ran, and the fix (the
    branch made `torch.where`, the read gone) compiles it whole. A user's `if
    h.abs().max() > 50` in a layer loop was claimed nothing where torch.where saved 84% of
    the step. None where no such read is found, a graph of that module ran, or no replay
    applies."""
    from neuron_explorer.what_if.compiled import looped_reads

    return _compiled_whole_saving_ns(trace, "compiled_without_reads") \
        if looped_reads(trace) else None


RNN_TRACED_BASIS = ("replay: the run replayed compiled with its RNN, GRU and LSTM modules "
                    "traced, as `torch._dynamo.config.allow_rnn = True` has them")


def rnn_traced_saving_ns(trace: Trace) -> float | None:
    """ns the analysed steps save with `torch._dynamo.config.allow_rnn = True` set before
    compiling: Dynamo breaks its graph at an nn.RNN, nn.GRU or nn.LSTM and runs the frame
    eager, and the setting compiles it whole. A compiled LSTM language model's break was
    "no time to save now" where the setting saved 215 ms of its 218 ms step. None where no
    such module was skipped, a graph of the model ran, or no replay applies."""
    from neuron_explorer.what_if.compiled import compile_skipped_modules

    return _compiled_whole_saving_ns(trace, "compiled_allow_rnn") \
        if "rnn" in compile_skipped_modules(trace).values() else None


def _compiled_whole_saving_ns(trace: Trace, mode: str) -> float | None:
    """The run's analysed steps, where no graph ran, replayed eager against replayed in
    the compiled what-if `mode`: their medians' difference, times the steps."""
    from neuron_explorer.analyses.step_breakdown import counted_steps
    from neuron_explorer.what_if.replay import predicted_step_ns

    ops = in_analysed_work(trace, trace.ops)
    if not len(ops) or (ops["graph_id"].to_numpy() >= 0).any():
        return None
    predicted = predicted_step_ns(trace, mode)
    recorded = predicted_step_ns(trace, "eager")
    steps = counted_steps(trace)
    if predicted is None or recorded is None or not steps:
        return None
    return max(recorded - predicted, 0.0) * steps


UNCOMPILED_BASIS = ("replay: the calls of the compiled module that ran uncompiled replayed "
                    "as one launch each (their ops' host launches gone, their device work "
                    "kept, unfused)")


def uncompiled_calls_saving_ns(trace: Trace, steps: list[int]) -> float | None:
    """ns the analysed steps among `steps` save with each call of a compiled module that ran
    no graph (Dynamo gave up compiling it: its recompile limit) replayed as one launch: its
    first kernel runs all of the call's device work, its other ops go. A decoder past the
    limit ran 3.89 ms steps that compiled took 0.20 ms; this replay gives 3.44 of the 3.69
    saved (the compiled graphs' fusion is left out). None where no such call is found."""
    ops, k = trace.ops, trace.kernels
    if not len(ops) or not len(k) or "graph_id" not in ops:
        return None
    eager = in_analysed_work(trace, ops)
    eager = eager[eager["step"].isin(steps) & (eager["graph_id"].to_numpy() < 0)]
    call = compiled_call_of(trace, eager["id"].to_numpy())
    mine = call >= 0
    if not mine.any():
        return None
    eager = eager[mine].assign(call=call[mine])
    return calls_as_one_launch_ns(trace, eager, "uncompiled calls as one launch")


def calls_as_one_launch_ns(trace: Trace, ops: pd.DataFrame, cause: str,
                           also_removed: np.ndarray | None = None) -> float | None:
    """ns the analysed steps save with the ops of each call (`ops`' `call` column) issued as
    one launch: the first op's first kernel runs all of the call's device work, the other
    ops go; `also_removed` (op slices) go too. None where nothing goes, or no replay."""
    from neuron_explorer.what_if.counterfactual import removal_saving_ns

    k = trace.kernels
    kernel_op = k["op_slice_id"].to_numpy(np.int64)
    dur = k["dur"].to_numpy(np.int64)
    gone_too = set() if also_removed is None else {int(i) for i in also_removed}
    removed: list[int] = sorted(gone_too)
    lengths: dict[int, int] = {}
    for _, ops_of_call in ops.sort_values("ts", kind="stable").groupby("call"):
        ids = ops_of_call["id"].to_numpy(np.int64)
        ids = ids[~np.isin(ids, list(gone_too))] if gone_too else ids
        rows = np.flatnonzero(np.isin(kernel_op, ids))
        if not len(rows):
            continue
        kept = int(rows[0])  # the first op's first kernel runs the ops gone's work too
        gone = ids[ids != kernel_op[kept]]
        lengths[kept] = int(dur[kept] + dur[rows[np.isin(kernel_op[rows], gone)]].sum())
        removed += gone.tolist()
    if not removed:
        return None
    return removal_saving_ns(trace, np.array(removed, np.int64), cause, lengths)


def _compile_wrappers(trace: Trace) -> set[str]:
    """The module calls that are torch.compile's wrappers (`OptimizedModule`, whose
    submodules are named `<it>._orig_mod.<...>`), whether or not any graph of theirs ran:
    a wrapper past Dynamo's recompile limit runs none."""
    mods = trace.modules
    if not len(mods):
        return set()
    names = pd.Series(mods["module"].astype(str).unique())
    return set(names[names.str.contains("._orig_mod", regex=False)]
               .str.split("._orig_mod", regex=False).str[0])


def compiled_call_of(trace: Trace, op_ids: np.ndarray) -> np.ndarray:
    """For each op slice, the outermost module call holding it where that module is one
    whose calls launch compiled graphs, or else the outermost backward slice of such a
    module (-1 elsewhere): an eager op there is one a graph break or Dynamo's recompile
    limit left uncompiled (a model run uncompiled past the limit runs its backward eagerly
    too)."""
    ops = trace.ops
    if not len(op_ids) or not len(ops) or "graph_id" not in ops:
        return np.full(len(op_ids), -1, np.int64)
    names = tables.slice_names(trace)
    graphs = ops[ops["graph_id"].to_numpy() >= 0]
    launched = tables.ancestor_of_kind(trace, graphs["id"].to_numpy(), (tf.CAT_MODULE,),
                                       outermost=True)
    compiled = list({str(names[c]) for c in launched[launched >= 0]} | _compile_wrappers(trace))
    op_ids = np.asarray(op_ids, np.int64)
    call = tables.ancestor_of_kind(trace, op_ids, (tf.CAT_MODULE,), outermost=True)
    inside = (call >= 0) & np.isin(names[np.maximum(call, 0)].astype(str), compiled)
    backward = tables.ancestor_of_kind(trace, op_ids, (tf.CAT_BACKWARD,), outermost=True)
    in_backward = ~inside & (backward >= 0) & np.isin(
        names[np.maximum(backward, 0)].astype(str), compiled)
    return np.where(inside, call, np.where(in_backward, backward, -1))
