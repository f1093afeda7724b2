"""Short-kernel sequences worth fusing: kernels that each run shorter than their launch,
back to back, in the same order every step."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer import tables
from neuron_explorer.analyses.kernel_sequences import WINDOW_COLUMNS, sequence_windows
from neuron_explorer.analyses.launch_stats import launch_outliers
from neuron_explorer.analyses.path_share import time_on_path
from neuron_explorer.analyses.phases import without_eval
from neuron_explorer.analyses.step_breakdown import step_windows
from neuron_explorer.common import trace_format as tf
from neuron_explorer.common.intervals import Union
from neuron_explorer.device_terms import device_terms
from neuron_explorer.rules import host_bound
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make, step_time, trains, us
from neuron_explorer.rules.python_loop import backward_call_lines
from neuron_explorer.rules.queued_idle import held_up
from neuron_explorer.tables import map_unique
from neuron_explorer.what_if.compiled import advised_compile_mode
from neuron_explorer.what_if.distributed_ops import hook_copy_op_ids
from neuron_explorer.what_if.into_graphs import backward_seed

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "short_kernel_sequence"
OPTIMIZER_KERNELS = ("_foreach_", "multi_tensor_apply")


def short_windows(trace: Trace) -> pd.DataFrame:
    """The windows of `FUSION_SEQUENCE_KERNELS` linked kernels, each shorter than its
    launch (HTA's short kernels), in the analysed steps, whose sequence recurs in every
    analysed step and at least `FUSION_MIN_REPEATS` times: one row per
    kernel, `sequence_windows`' columns with its launch's and the kernel's times."""
    n = th.FUSION_SEQUENCE_KERNELS
    short = launch_outliers(trace.launch_stats())["short"].set_index("id")
    if len(short) < n:
        return pd.DataFrame(columns=WINDOW_COLUMNS)
    w = sequence_windows(trace, n)
    w = w[w["id"].isin(short.index)]
    w = w[w.groupby("window")["id"].transform("size") == n]
    if not len(w):
        return w
    s = trace.table("slices")
    k = trace.kernels.set_index("id")
    # the optimizer's step is its own program (fused=True, or its own compiled graph): a
    # window that runs from the backward into it fuses nothing a fix would fuse
    optimizer = map_unique(k["name"].reindex(w["id"]).to_numpy(object),  # per distinct name
                           lambda name: any(o in str(name) for o in OPTIMIZER_KERNELS), bool)
    # ... or launched inside the optimizer's step (foreach=False: one kernel per parameter
    # and formula term, named for its op)
    launched_by = k["op_slice_id"].reindex(w["id"]).fillna(-1).to_numpy(np.int64)
    in_step = np.zeros(len(w), bool)
    known = launched_by >= 0
    in_step[known] = tables.ancestor_of_kind(trace, launched_by[known],
                                             (tf.CAT_OPTIMIZER,)) >= 0
    w = w.assign(optimizer=optimizer | in_step,
                 outside=_outside_the_model(trace, launched_by) & ~(optimizer | in_step))
    mixed = w.groupby("window")["optimizer"].transform("nunique") > 1
    # a sharded model's hooks copy its shards around each collective eagerly, whatever is
    # compiled: a window holding one of their kernels fuses under no fix (FSDP2's copies
    # beside its blocks' matmuls were 20 of a run's sequences, all claimed)
    hooks = np.isin(launched_by, hook_copy_op_ids(trace))
    # ... and so does autograd's seed of the backward, eager whatever is compiled (a DDP
    # run's windows of it beside its eager loss: 1.25x what compiling the loss saved)
    ops = trace.ops
    hooks |= np.isin(launched_by, ops.loc[backward_seed(ops), "id"].to_numpy())
    # ... and so do a compiled module's gradient accumulation adds (AccumulateGrad, after
    # its compiled backward): a run over four micro-batches claimed 48.9 ms for windows of
    # them, beside a compiled loss and fused optimizer that saved 24.6
    if host_bound.is_compiled(trace):
        from neuron_explorer.what_if.into_graphs import eager_launches

        launches = eager_launches(trace)
        hooks |= np.isin(launched_by, launches.accumulations["id"].to_numpy())
        # ... and DDP's reducer scaling each gradient inside the compiled calls (a two-rank
        # run's windows of them were claimed 2.7x what compiling its loss saved)
        hooks |= np.isin(launched_by, launches.hooks["id"].to_numpy())
    mixed |= pd.Series(hooks, index=w.index).groupby(w["window"]).transform("any")
    w = w[~mixed.to_numpy()]
    if not len(w):
        return w
    ids = w["id"].to_numpy(np.int64)
    graph_of = trace.ops.set_index("id")["graph_id"]
    op_ids = k["op_slice_id"].reindex(ids).to_numpy(np.int64)
    w = w.assign(graph=graph_of.reindex(op_ids).fillna(-1).to_numpy(np.int64) >= 0)
    # two compiled graphs with eager work between: a forward and its backward, with
    # autograd's seed of the backward between them (eager whatever is compiled: a whole
    # step compiled left `graph_1_forward | fill | graph_2_backward` as it was, claimed
    # 1.18 ms), or the graphs a break splits (the graph-break finding's replay merges them)
    w = w[w.groupby("window")["graph"].transform("sum").to_numpy() < 2]
    if not len(w):
        return w
    ids = w["id"].to_numpy(np.int64)
    launch = short["launch"].reindex(ids).to_numpy(np.int64)
    w = w.assign(ts=s["ts"].to_numpy(np.int64)[ids], dur=s["dur"].to_numpy(np.int64)[ids],
                 track=s["track_id"].to_numpy()[ids], launch=launch,
                 launch_ts=s["ts"].to_numpy(np.int64)[launch],
                 cpu_ns=short["cpu_ns"].reindex(ids).to_numpy(np.int64),
                 step=k["step"].reindex(ids).to_numpy())
    # a window belongs to the step of its first kernel
    w = w.assign(step=w.groupby("window")["step"].transform("first"))
    steps = 0
    if len(trace.steps):
        # the analysed steps the per-step figures count (a sampling step after training
        # runs sequences of its own)
        wanted = tuple(int(x) for x in step_windows(trace)["step"].tolist())
        w = w[w["step"].isin(wanted)]
        steps = len(wanted)
        # the first recorded step lacks what a loop runs after its optimizer step (an EMA
        # of the weights): that work lands in the next step, which begins there. A user's
        # per-parameter EMA, 31% of the step, was named by no finding.
        first = int(trace.steps["step"].min())
        if steps > 2 and first in wanted:
            steps -= 1
            w = w.assign(required=(w["step"] != first).to_numpy())
        # not the eval passes recorded in a training step: whole windows of its own part
        w = without_eval(trace, w)
        w = w[w.groupby("window")["id"].transform("size") == n]
    if "required" not in w:
        w = w.assign(required=True)
    per_seq = w.groupby("sequence").agg(times=("window", "nunique")).assign(
        steps=w[w["required"]].groupby("sequence")["step"].nunique()).fillna({"steps": 0})
    w = w.drop(columns="required")
    recurring = per_seq[(per_seq["steps"] >= steps)
                        & (per_seq["times"] >= th.FUSION_MIN_REPEATS)].index
    return w[w["sequence"].isin(recurring)]


def removed(w: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """What fusing each window into one kernel removes: the launches after its first
    (host: ts, end) and the device's gaps between its kernels (track, ts, end). A compiled
    graph's launch stays: it is the kernel the eager ops around it would join."""
    later = w[(w["position"] > 0) & ~w["graph"]] if "graph" in w else w[w["position"] > 0]
    launches = pd.DataFrame({"ts": later["launch_ts"],
                             "end": later["launch_ts"] + later["cpu_ns"]})
    w = w.sort_values(["window", "position"])
    previous_end = (w["ts"] + w["dur"]).groupby(w["window"]).shift(1)
    inside = w["position"] > 0
    gaps = pd.DataFrame({"track": w.loc[inside, "track"], "ts": previous_end[inside],
                         "end": w.loc[inside, "ts"]})
    gaps = gaps[gaps["end"] > gaps["ts"]].astype(np.int64)
    return launches, gaps


def saving(trace: Trace, w: pd.DataFrame) -> tuple[float, float, bool]:
    """(what fusing saves, the symptom, whether by replay): the run replayed with each run
    of linked short kernels fused (`fused_replay_saving`) where it can be replayed, else
    the launches' time on the steps' critical path plus what the device's gaps held the
    steps up (`queued_idle.held_up`); the time the launches and gaps cover on the wall
    clock (the host launches while the device waits: their sum said 769 ms of a run
    analysed over 487)."""
    launches, gaps = removed(w)
    ts, end = launches["ts"].to_numpy(np.int64), launches["end"].to_numpy(np.int64)
    symptom = Union(np.r_[ts, gaps["ts"].to_numpy(np.int64)],
                    np.r_[end, gaps["end"].to_numpy(np.int64)]).total
    replayed = fused_replay_saving(trace, w)
    if replayed is not None:
        return replayed, float(symptom), True
    on_path = time_on_path(trace, ts, end, "host")
    on_path += held_up(trace, gaps["ts"].to_numpy(np.int64), gaps["end"].to_numpy(np.int64),
                       gaps["track"].to_numpy(np.int64))
    return float(on_path), float(symptom), False


def fused_replay_saving(trace: Trace, w: pd.DataFrame) -> float | None:
    """What the analysed steps save, replayed with each run of linked short kernels (the
    windows, overlapping ones joined) fused into its first kernel: the ops that launched
    the later ones gone (host time and launch), the first kernel running all of their
    device work back to back; a compiled graph's launch stays. None where the trace
    cannot be replayed. The critical path alone counted the launches it runs through,
    though with them gone a device nearly as busy as its host sets the step: 350 us a
    step claimed where compiling the loss saved 24."""
    from neuron_explorer.what_if.counterfactual import op_kernel_rows, removal_saving_ns

    k = trace.kernels
    rows = pd.Series(np.arange(len(k)), index=k["id"].to_numpy(np.int64))
    op_of = k["op_slice_id"].to_numpy(np.int64)
    kernels_of = op_kernel_rows(trace)
    dur = k["dur"].to_numpy(np.int64)
    w = w.assign(row=rows.reindex(w["id"]).to_numpy(), run=_runs(w))
    removed_ops: dict[int, None] = {}  # in order, once each
    lengths: dict[int, int] = {}
    runs = list(w.sort_values(["run", "ts"]).drop_duplicates("id").groupby("run"))
    after_graph = _graph_read_first(trace, [op for op in (int(op_of[run["row"].iloc[0]])
                                                          for _, run in runs) if op >= 0])
    no_kernel = {track: (frame["ts"].to_numpy(np.int64), frame["id"].to_numpy(np.int64))
                 for track, frame in trace.ops.loc[trace.ops["kernel_count"].to_numpy() == 0,
                                                   ["id", "ts", "track_id"]]
                 .sort_values("ts").groupby("track_id")}
    slices = trace.table("slices")
    for _, run in runs:
        first, *later = run[["row", "graph"]].itertuples(index=False)
        first_op = op_of[first.row]
        total = int(dur[first.row])
        joins = after_graph.get(int(first_op))
        graph_op = int(first_op) if first.graph else joins
        before = len(removed_ops)
        if joins is not None and not first.graph:
            # eager work on a compiled graph's result, brought into the graph as advised:
            # it joins the graph's program, its own launches all gone (a compiled
            # decoder's argmax | eq | all kept one, claimed 124 us a step of 168 saved)
            removed_ops[int(first_op)] = None
            target = kernels_of[joins][-1]
            total = int(lengths.get(target, dur[target])) + int(dur[kernels_of[first_op]].sum())
            first = first._replace(row=target)
        for row, graph in later:
            op = op_of[row]
            if graph:  # the graph's own kernel, which the eager ops around it join
                continue
            if joins is not None and op == first_op:  # counted with it, and gone
                continue
            if op < 0 or op == first_op:  # a launch alone, or the first op's own kernel
                total += int(dur[row])
                lengths[int(row)] = 0
            elif op not in removed_ops:
                removed_ops[op] = None
                total += int(dur[kernels_of[op]].sum())
        lengths[int(first.row)] = total
        if graph_op is not None and len(removed_ops) > before:
            # joined to the graph, the ops that launch nothing between them go too (the
            # view the first reads, an out= op's allocation): 24 us a step of a compiled
            # decoder's sampling
            gone = np.fromiter(list(removed_ops)[before:], np.int64)
            start = int(slices["ts"].iat[graph_op] + slices["dur"].iat[graph_op])
            end = int(slices["ts"].to_numpy(np.int64)[gone].max())
            ts, ids = no_kernel.get(slices["track_id"].iat[graph_op], (np.zeros(0, np.int64),) * 2)
            inside = ids[np.searchsorted(ts, start, "right"):np.searchsorted(ts, end, "left")]
            removed_ops.update(dict.fromkeys(inside.tolist()))
    if not removed_ops:
        return None
    return removal_saving_ns(trace, np.array(list(removed_ops), np.int64), RULE_ID, lengths)


def _graph_read_first(trace: Trace, first_ops: list[int]) -> dict[int, int]:
    """Of the given op slices, those that read a compiled graph's result directly (the
    recorded data flow: the graph's launch names its results), each with that graph
    op's slice."""
    import json

    ops = trace.ops
    if not first_ops or "graph_id" not in ops or not (ops["graph_id"] >= 0).any():
        return {}
    by_op_id = ops.drop_duplicates("op_id").set_index("op_id")
    slice_of = by_op_id["id"]
    graph_of = by_op_id["graph_id"]
    op_ids = ops.set_index("id")["op_id"].reindex(first_ops).to_numpy()
    made = trace.slice_args.column(tf.ARG_PRODUCERS, np.asarray(first_ops, np.int64))
    out: dict[int, int] = {}
    for first, op_id, backs in zip(first_ops, op_ids, made, strict=True):
        offsets = json.loads(backs) if isinstance(backs, str) else (backs or [])
        for back in offsets:
            source = int(op_id) - int(back) if back and pd.notna(op_id) else -1
            if source in graph_of.index and graph_of[source] >= 0:
                out[first] = int(slice_of[source])
                break
    return out


def _runs(w: pd.DataFrame) -> np.ndarray:
    """Per window row: its run, the windows that share a kernel joined (sliding windows
    over one run of kernels overlap), named by one of its windows."""
    parent: dict[int, int] = {}

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    holder: dict[int, int] = {}  # kernel -> a window holding it
    for window, kernel in zip(w["window"].tolist(), w["id"].tolist(), strict=True):
        parent.setdefault(window, window)
        if kernel in holder:
            parent[root(window)] = root(holder[kernel])
        else:
            holder[kernel] = window
    return np.array([root(x) for x in w["window"].tolist()], np.int64)


# the share of the launches fusing removes that must be the optimizer's for its own fix
OPTIMIZER_PART_MIN = 0.02


def check(trace: Trace) -> list[Finding]:
    w = short_windows(trace)
    if not len(w):
        return []
    lost, symptom, replayed = saving(trace, w)
    optimizer_share = float(w.groupby("window")["optimizer"].all().mean())
    part_of_host_bound = host_bound.is_host_bound(trace) and (
        optimizer_share < 0.5 or _host_bound_fuses_the_optimizer(trace))
    # compiling, the fix advised, fuses these with the rest: it saves what its own replay
    # does, which may be less than these fused alone (a graph's call costs more than an op)
    compiled = host_bound.compiled_saving_ns(trace) if part_of_host_bound else None
    capped = compiled is not None and compiled < lost
    if compiled is not None and capped:
        lost = compiled
    # every occurrence the optimizer's foreach passes: fused=True, the fix named first,
    # keeps a launch and the state steps' increments, which these sequences fused alone
    # do not (a recommender's Adam: 372 us a step claimed, fused=True saved 310)
    fused_step = _fused_optimizer_step_ns(trace) if optimizer_share == 1.0 else None
    by_fused_step = fused_step is not None and fused_step < lost and not capped
    fused_alone = lost
    if fused_step is not None and by_fused_step:
        lost = fused_step
    if lost < th.FUSION_MIN_SHARE * step_time(trace):
        return []
    per_seq = w.groupby("sequence").agg(windows=("window", "nunique"), gpu=("dur", "sum"),
                                        cpu=("cpu_ns", "sum"))
    per_seq = per_seq.sort_values(["windows", "cpu"], ascending=False)
    first = w.groupby("sequence")["window"].min()
    # the model's sequences and the optimizer's fuse by different fixes: the evidence
    # shows both, where the optimizer's many foreach passes filled it alone
    of_optimizer = w.groupby("sequence")["optimizer"].all().reindex(per_seq.index)
    shown = list(per_seq.index[:th.MAX_EVIDENCE])
    model_seqs = list(per_seq.index[~of_optimizer.to_numpy(bool)])
    if model_seqs and model_seqs[0] not in shown:
        shown[-1] = model_seqs[0]
    items = []
    for seq, r in per_seq.loc[shown].iterrows():
        one = w[w["window"] == first[seq]]
        end = int((one["ts"] + one["dur"]).max())
        items.append(evidence(
            int(one["ts"].min()), end - int(one["ts"].min()), one["id"].tolist(),
            f"{seq}: {r.windows} times; its kernels run {us(r.gpu / r.windows)} per "
            f"occurrence, their launches take {us(r.cpu / r.windows)}"))
    every = "in every step" if len(trace.steps) else "over the trace"
    launches = w[w["position"] > 0]
    optimizer_launches = float(launches.loc[launches["optimizer"], "cpu_ns"].sum()) / max(
        float(launches["cpu_ns"].sum()), 1.0)
    # fused=True advised where its part is worth it: an LSTM's sequences, 0.3% of them the
    # optimizer's, were told to fuse it too, and it saved 0.3% of the step
    optimizer_sequence = optimizer_launches > OPTIMIZER_PART_MIN
    named = "; ".join(f"{seq} ({r.windows} times{_where(trace, w[w['window'] == first[seq]])})"
                      for seq, r in per_seq.head(3).iterrows())
    explanation = (
        f"{len(per_seq)} sequence{'s' if len(per_seq) > 1 else ''} of "
        f"{th.FUSION_SEQUENCE_KERNELS} kernels recur{'' if len(per_seq) > 1 else 's'} {every}, "
        "back to back on one queue, each "
        f"kernel running shorter than the host takes to launch it: {named}; "
        f"{w['window'].nunique()} occurrences in all. Fused, each occurrence is one "
        f"launch instead of {th.FUSION_SEQUENCE_KERNELS}, without the device's gaps between "
        f"them. The launches and gaps fusing removes total {us(symptom)}; "
        + (f"compiled, as advised, the run saves {us(lost)} (the host-bound finding's "
           "replay: a graph's call costs the host more than one op)" if capped
           else f"every occurrence is the optimizer's step, and fused=True saves {us(lost)} "
           "(replayed: it keeps a launch, its kernel and the state steps' increments; "
           f"compiling the optimizer's step may save up to the {us(fused_alone)} these "
           "sequences fused alone would)" if by_fused_step
           else f"the run replayed with each occurrence fused is {us(lost)} shorter"
           if replayed else f"{us(lost)} of them lie on the critical path, and only that "
           "is counted"))
    if not device_terms(trace.metadata).recorded_here:  # launches are runtime calls there
        explanation += (" (the ops' own dispatch around the launch calls would go too, so "
                        "fusing may save more)")
    explanation += "."
    explanation += _parts(trace, launches, optimizer_launches)
    if part_of_host_bound and host_bound.left_by_breaks(trace):
        # the compiled model's own ops, eager past a break or the recompile limit: the
        # recompilation finding's fix compiles them (a print in the forward: 794 us a step
        # here beside its 852, read as two savings)
        explanation += (" Most of these launches are the compiled model's own ops, left "
                        "eager by a graph break or Dynamo's recompile limit: the "
                        "recompilation finding's fix compiles them, so the two savings "
                        "overlap rather than add.")
    elif part_of_host_bound and compiled is not None:
        explanation += " This is part of the host-bound finding's saving, not beside it."
    elif part_of_host_bound:
        # no compiled replay to cap it (a compiled model's eager launches): it may be the
        # larger, and called "part of" a host-bound claim of 4.62 ms it read as wrong
        explanation += (" The host-bound finding's fix brings these launches into graphs "
                        "too: the two savings overlap rather than add.")
    elif host_bound.is_host_bound(trace):  # the optimizer's fused step: another fix
        explanation += (" Most occurrences are the optimizer's step, whose fix (fused=True) "
                        "the compiled replay behind the host-bound finding's saving leaves "
                        "out: this saving is beside that one, and can be the larger.")
    return [make(
        trace, RULE_ID,
        f"Short kernels launched one by one in a repeating sequence ({len(per_seq)} "
        f"sequence{'s' if len(per_seq) > 1 else ''})", lost, items, explanation,
        _recommendation(trace, optimizer_sequence),
        symptom_ns=symptom, saving_basis=FUSED_STEP_BASIS if by_fused_step
        else _basis(replayed, capped))]


FUSED_STEP_BASIS = ("replay: the run replayed with each optimizer step fused=True (one "
                    "launch of the fused kernel, the state steps' increments kept)")


def _fused_optimizer_step_ns(trace: Trace) -> float | None:
    """What fused=True saves the analysed steps, replayed; None where not replayed."""
    from neuron_explorer.what_if.fused_optimizer import fused_optimizer_saving

    fused = fused_optimizer_saving(trace)
    return fused.step_ns if fused is not None and fused.step_ns else None


def _host_bound_fuses_the_optimizer(trace: Trace) -> bool:
    """Whether the host-bound finding's fix on a compiled run makes the optimizer's step
    fused=True too (its replay of the eager launches brought into the graphs)."""
    if not host_bound.is_compiled(trace):
        return False
    from neuron_explorer.what_if.into_graphs import into_graphs_saving

    into = into_graphs_saving(trace)
    return into is not None and into.fused


def _outside_the_model(trace: Trace, launched_by: np.ndarray) -> np.ndarray:
    """Which launches' ops ran outside the model: in no module's call or backward, and not
    at the line that runs a loss's backward (an EMA update, metric math between steps)."""
    ops = trace.ops.set_index("id")
    known = launched_by >= 0
    out = np.zeros(len(launched_by), bool)
    if not known.any():
        return out
    mine = ops.reindex(launched_by[known])
    backward_lines = backward_call_lines(ops)
    in_backward = tables.ancestor_of_kind(trace, launched_by[known], (tf.CAT_BACKWARD,)) >= 0
    out[known] = ((mine["module"].fillna("").astype(str) == "").to_numpy()
                  & ~mine["source"].astype(str).isin(backward_lines).to_numpy()
                  & ~in_backward)
    return out


def _parts(trace: Trace, launches: pd.DataFrame, optimizer: float) -> str:
    """Which fix fuses which part of the launches: the optimizer's step, code outside the
    model (named by its lines), the model's forward and backward; "" for one part alone. A
    compiled model's EMA update, a Python loop over its parameters, was called "the model's
    forward and backward (compiling fuses those)"."""
    total = max(float(launches["cpu_ns"].sum()), 1.0)
    outside = float(launches.loc[launches["outside"], "cpu_ns"].sum()) / total
    model = max(1.0 - optimizer - outside, 0.0)
    said = []
    if optimizer > OPTIMIZER_PART_MIN:
        said.append(f"{optimizer:.0%} the optimizer's step (fused=True fuses those)")
    if outside > OPTIMIZER_PART_MIN:
        ops = trace.ops.set_index("id")
        k = trace.kernels.set_index("id")
        op_ids = k["op_slice_id"].reindex(launches.loc[launches["outside"], "id"]).dropna()
        lines = ops["source"].reindex(op_ids.astype("int64")).dropna().astype(str)
        where = " and ".join(lines[lines != ""].value_counts().index[:LINES_NAMED])
        said.append(f"{outside:.0%} code outside the model{f' at {where}' if where else ''}"
                    " (torch._foreach_* ops over all its tensors at once, or a compiled "
                    "function, fuse those)")
    if model > OPTIMIZER_PART_MIN:
        passes = "forward and backward" if trains(trace) else "forward"  # a served model's
        said.append(f"{model:.0%} the model's {passes} (compiling fuses those)")
    if len(said) < 2:
        return ""
    return " Of the launches fusing removes, " + ", ".join(said[:-1]) + " and " + said[-1] + "."


LINES_NAMED = 2


def _where(trace: Trace, one: pd.DataFrame) -> str:
    """Where the ops that launch one occurrence `one` (rows of `short_windows`) were
    called: ", at model.py:12 and model.py:14 in model.blocks.0" ("" where unknown), so
    that a sequence of kernel names reads as the user's code (a Python-written activation's
    line was never named)."""
    k = trace.kernels.set_index("id")
    op_ids = k["op_slice_id"].reindex(one["id"].to_numpy()).dropna().astype("int64")
    ops = trace.ops.set_index("id").reindex(op_ids[op_ids >= 0])
    lines = list(dict.fromkeys(s for s in ops["source"].dropna().astype(str) if s))
    modules = list(dict.fromkeys(m for m in ops["module"].dropna().astype(str) if m))
    at = (f", at {' and '.join(lines[:LINES_NAMED])}"
          + (f" and {len(lines) - LINES_NAMED} more" if len(lines) > LINES_NAMED else "")
          if lines else "")
    return at + (f" in {modules[0]}" if len(modules) == 1 else "")


def _basis(replayed: bool, capped: bool) -> str:
    """`Finding.saving_basis` for how the saving was obtained."""
    if capped:
        return ("replay: the run replayed compiled (the fix advised), which saves less than "
                "these sequences fused alone")
    if replayed:
        return ("replay: the run replayed with each occurrence fused (the ops that launch "
                "its later kernels gone, its first kernel running all of their work)")
    return ("critical path: the launches after each occurrence's first where the critical "
            "path runs through them, and the device's gaps between its kernels where they "
            "held the steps up (at most the host's waits on the device)")


def _recommendation(trace: Trace, optimizer_sequence: bool) -> str:
    """The fused form: compiling, and the optimizer's fused step where its foreach kernels
    run as a sequence (`optimizer_sequence`; an optimizer already one kernel per step
    gains nothing from it)."""
    compile_call = device_terms(trace.metadata).compile_call
    compiled = host_bound.is_compiled(trace)
    ways = (["remove the graph break that leaves them eager"]
            if len(trace.compile_summary()["graph_breaks"]) else [])
    ways += ["compile the loss and optimizer step too"] if trains(trace) else \
        ["compile the work on the model's outputs too"]
    where = ("bring the ops that launch it into the compiled graph (" + ", or ".join(ways)
             + ")" if compiled else
             # a user who compiled the one module named beside the top sequences saved 72%
             # of the claim: it counts every module's
             f"wrap the model in {compile_call} (the saving counts the sequences of every "
             "module: compiling one module saves its part)")
    # no "call a fused op": this device runs F.scaled_dot_product_attention eagerly as its
    # parts, and a user's attention rewritten to it ran 9% slower
    advice = (f"Fuse each sequence into one kernel: {where}, so its elementwise chain becomes "
              "one kernel.")
    if advised_compile_mode(trace) == "compiled_allow_rnn":
        # compiled as told without it, a user's LSTM language model ran as before
        advice += (" Set `torch._dynamo.config.allow_rnn = True` before compiling: by default "
                   "Dynamo does not trace nn.RNN, nn.GRU or nn.LSTM, and the sequences they "
                   "launch stay eager.")
    if optimizer_sequence:
        advice += (" The optimizer's step runs these kernels (foreach passes, or with "
                   "foreach=False one per parameter): construct the optimizer with fused=True "
                   "(one kernel per parameter group) or compile its step "
                   + host_bound.MARK_STEPS + ".")
    return advice
