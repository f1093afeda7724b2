"""What serving requests in batches saves: the run replayed with each `k` consecutive model
calls (steps) as one call over `k` times the rows.

A classifier served one request a call (batch 1) was told to compile (422 us a request) and,
in a clause, to batch; one batch of its 16 queued requests saved 626 us a request, and no
figure said so. The replay keeps the first call of each group, each of its ops lowered
again with its activations' first dim `k` times as large (the batch-major layout a model
called on stacked requests has), and drops the group's other calls: their ops, their
launches and their reads to the host (a batch is read once). Parameters keep their shapes:
an op's input is an activation where the recorded data flow says a kernel of this call (or
of the one before, whose result a step reads) made it, through any views, where it is the
call's upload of its request, or where it has the call's rows (a batch made beforehand).

Only runs that train nothing and whose analysed calls run the same ops (all but two, or
80% of them) are replayed (None otherwise, or where an op cannot be lowered again). Not
modelled: a layout whose batch is not the first dim (sequence-first tensors grow along the
sequence), and the padding that batching inputs of different lengths needs. Steps whose
model call reads the last one's results (a sampler's) are one chain, not requests: not
replayed.

The same replay joins the model's calls within a step that read none of each other's
results (classifier-free guidance's two passes: `joined_calls_saving_ns`), keeping of each
other call an op for each input stacked and one for the split of the result.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer.analyses.phases import model_calls
from neuron_explorer.analyses.steady_state import analysed_steps
from neuron_explorer.common import trace_format as tf
from neuron_explorer.memo import memoised
from neuron_explorer.what_if.counterfactual import op_kernel_rows, removal_saving_ns
from neuron_explorer.what_if.replay import op_keys, replayable

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

OpKey = tuple
# the share of the analysed calls that must run the same ops for them to be requests
ALIKE_SHARE = 0.8


def batched_saving_ns(trace: Trace, k: int) -> float | None:
    """ns the analysed steps would save served `k` calls at a time (None: not replayable)."""
    return memoised(trace, f"batched_calls:{k}", lambda: _saving(trace, k))


def _saving(trace: Trace, k: int) -> float | None:
    from neuron_explorer.rules.finding import trains

    steps = analysed_steps(trace).steps
    if k < 2 or len(steps) < k or trains(trace) or not replayable(trace):
        return None
    ops = trace.ops[trace.ops["step"].isin(steps)].sort_values("ts", kind="stable")
    by_step = dict(tuple(ops.groupby("step", sort=False)))  # one pass, not one per call
    calls = [by_step[s] for s in steps if s in by_step]
    signature = [tuple(c["name"].astype(str)) for c in calls]
    # the calls alike (the first step lacks the read of a result that lands in the next;
    # a request of one row may skip an op or two): calls that differ more (a prompt, then
    # decode steps) are no batch of requests. All but two once had to be alike, and a
    # server of 24 requests, two of them of one row, was told nothing of batching, which
    # made each request 4x faster
    common = max(set(signature), key=signature.count)
    alike = [c for c, sig in zip(calls, signature, strict=True) if sig == common]
    if len(alike) < min(len(calls) - 2, ALIKE_SHARE * len(calls)):
        return None
    # steps that read the step before's results (a sampler's: x from the last update) are
    # one chain, not requests: a guided sampler was told to serve 8 of its steps as one
    from neuron_explorer.analyses.data_flow import model_call_reads_last

    if model_call_reads_last(trace, steps[-1], steps[-2]):
        return None
    # the removed calls' host time inside the model's call goes with them; the Python
    # around it (a request's own preparation) stays, as it would for a batch
    model = model_calls(trace)
    windows: dict[int, list[tuple[int, int]]] = {}
    for step, ts, end in zip(model["step"].tolist(), model["ts"].tolist(),
                             model["end"].tolist(), strict=True):
        windows.setdefault(int(step), []).append((int(ts), int(end)))
    units = _call_units(trace, [s for s in steps if s in by_step], by_step, windows)
    groups = []
    for first in range(0, len(units), k):
        group = units[first:first + k]
        cut = [w for unit in group[1:] for w in windows.get(unit.step, [])]
        groups.append(Joined([u.ops for u in group], int(group[0].ops["op_id"].min()), cut,
                             syncs=tuple(i for u in group[1:] for i in u.syncs)))
    return _joined_saving(trace, groups, f"batched_calls:{k}")


@dataclass(frozen=True)
class CallUnit:
    """One model call and what reads its result: the ops of its step from its request's
    upload on, and the ops and syncs up to the next step's last read before its own call
    (a server that reads each answer as the next request arrives reads it there)."""

    step: int
    ops: pd.DataFrame
    syncs: tuple[int, ...]


def _call_units(trace: Trace, steps: list[int], by_step: dict[int, pd.DataFrame],
                windows: dict[int, list[tuple[int, int]]]) -> list[CallUnit]:
    """Each analysed step's call with its reads: a batch replayed keeps the first call's
    reads (a batch is read once, after its program, from a result `k` times the rows) and
    drops the others'. Cut at the step boundary instead, a compiled server's batch was read
    at the next batch's step, and its reads kept waited for the batch before the read ops
    that ran while its program did (490 us a batch of 8 replayed, 323 recorded)."""
    from neuron_explorer.tables import assign_steps, of_kind

    syncs = of_kind(trace, tf.CAT_SYNC)
    sync_ts = syncs["ts"].to_numpy(np.int64)
    sync_end = sync_ts + syncs["dur"].to_numpy(np.int64)
    sync_step = assign_steps(sync_ts, trace.steps)
    sync_ids = syncs["id"].to_numpy(np.int64)
    of_step = pd.Series(np.arange(len(syncs))).groupby(sync_step).indices  # step -> rows
    parts = []  # per step: (ops and syncs reading the call before, its own ops and syncs)
    for step in steps:
        ops = by_step[step]
        call_at = min((w[0] for w in windows.get(step, [])), default=np.iinfo(np.int64).max)
        mine = of_step.get(step, np.zeros(0, np.int64))
        before = mine[sync_ts[mine] < call_at]
        cut = int(sync_end[before].max()) if len(before) else np.iinfo(np.int64).min
        early = ops["ts"].to_numpy(np.int64) < cut
        parts.append(((ops[early], tuple(sync_ids[before].tolist())),
                      (ops[~early], tuple(sync_ids[np.setdiff1d(mine, before)].tolist()))))
    units = []
    for i, step in enumerate(steps):
        own_ops, own_syncs = parts[i][1]
        read_ops, read_syncs = parts[i + 1][0] if i + 1 < len(parts) else (own_ops[:0], ())
        units.append(CallUnit(step, pd.concat([own_ops, read_ops]), own_syncs + read_syncs))
    return units


@dataclass(frozen=True)
class Joined:
    """Calls replayed as their first over all of their rows: the calls' ops (the first
    kept), the op id from which a kernel's result is an activation, the host windows cut."""

    calls: list[pd.DataFrame]
    since: int
    cut: list[tuple[int, int]]
    # leading ops of each other call kept: stand-ins for the ops that stack their inputs
    kept: int = 0
    syncs: tuple[int, ...] = ()  # the other calls' reads of the device (sync slices)


def _joined_saving(trace: Trace, groups: list[Joined], cause: str) -> float | None:
    """ns the analysed steps save with each group's calls run as its first call over all
    of their rows, the others' ops, launches and host windows gone (None: not replayable)."""
    from neuron_explorer.backend.replay import ReplayOptions, lower_key

    preset = ReplayOptions(trace.hardware or "trn2").preset()
    kernel_rows = op_kernel_rows(trace)
    durations = trace.kernels["dur"].to_numpy(np.int64)
    by_op_id = trace.ops.sort_values("op_id", kind="stable")
    removed: list[int] = []
    lengths: dict[int, int] = {}
    cut = [w for g in groups for w in g.cut]
    for group in groups:
        for other in group.calls[1:]:
            removed += other["id"].iloc[group.kept:].tolist()
        removed += group.syncs
        scaled = _scaled_lengths(trace, by_op_id, group.calls[0], len(group.calls),
                                 group.since, preset, lower_key, kernel_rows, durations)
        if scaled is None:
            return None
        lengths.update(scaled)
    if not removed:
        return None
    return removal_saving_ns(trace, np.array(removed, np.int64), cause, lengths,
                             (np.array([w[0] for w in cut], np.int64),
                              np.array([w[1] for w in cut], np.int64)))


def joined_calls_saving_ns(trace: Trace) -> tuple[float, int] | None:
    """ns the analysed steps save with the model's calls in each step that read none of each
    other's results (classifier-free guidance's two passes) run as one call over their
    rows, and the number of calls a step joined; None where no step has such calls, the
    run trains or cannot be replayed."""
    return memoised(trace, "joined_calls", lambda: _joined_calls(trace))


def _joined_calls(trace: Trace) -> tuple[float, int] | None:
    from neuron_explorer.analyses.data_flow import reads_results_of
    from neuron_explorer.rules.finding import trains

    steps = analysed_steps(trace).steps
    if not steps or trains(trace) or not replayable(trace):
        return None
    calls = model_calls(trace)
    calls = calls[calls["step"].isin(steps)]
    ops = trace.ops.sort_values("ts", kind="stable")
    ts = ops["ts"].to_numpy(np.int64)
    groups: list[Joined] = []
    for _, in_step in calls.groupby("step", sort=True):
        # each call's ops and host window
        found = [(ops.iloc[np.searchsorted(ts, r.ts):np.searchsorted(ts, r.end)],
                  (int(r.ts), int(r.end))) for r in in_step.itertuples()]
        found = [(frame, window) for frame, window in found if len(frame)]
        if len(found) < 2:
            continue
        # the calls running the first's ops that read no result of the calls joined before
        # them (a corrector's second pass reads the first's: it stays)
        first_ops = tuple(found[0][0]["name"].astype(str))
        joined = [found[0]]
        for frame, window in found[1:]:
            if tuple(frame["name"].astype(str)) != first_ops:
                continue
            before = np.concatenate([f["op_id"].to_numpy(np.int64) for f, _ in joined])
            if reads_results_of(trace, before, frame["op_id"].to_numpy(np.int64)) is False:
                joined.append((frame, window))
        if len(joined) > 1:
            # torch.cat of each input the calls differ in and the split of the result: an
            # op each a call, on its rows, as the call's first ops are (the embedding of a
            # label, the add of it to x)
            stacked = _row_inputs(trace, found[0][0])
            if stacked is None:
                return None
            stacked += 1  # and the split of its result (.chunk)
            # the host time of the ops kept stays: cut from the first op removed on
            cut = [(int(f["ts"].iloc[stacked]) if stacked < len(f) else end, end)
                   for f, (_, end) in joined[1:]]
            groups.append(Joined([f for f, _ in joined], int(found[0][0]["op_id"].min()),
                                 cut, kept=stacked))
    if not groups:
        return None
    saving = _joined_saving(trace, groups, "joined_calls")
    return (saving, max(len(g.calls) for g in groups)) if saving else None


def _row_inputs(trace: Trace, call: pd.DataFrame) -> int | None:
    """How many tensors made outside the call (by another op) of the call's rows it reads:
    what joining it with another call stacks (its parameters are not of its rows)."""
    ids = call["id"].to_numpy(np.int64)
    keys = op_keys(trace, ids)
    if keys is None:
        return None
    rows = _rows(call, keys)
    inside = set(call["op_id"].astype(int).tolist())
    made = trace.slice_args.column(tf.ARG_PRODUCERS, ids)
    outside: set[int] = set()
    for op_id, key, backs in zip(call["op_id"].astype(int).tolist(), keys, made, strict=True):
        offsets = json.loads(backs) if isinstance(backs, str) else (backs or [])
        for back, (shape, _) in zip(offsets, key[1], strict=False):
            if back > 0 and op_id - back not in inside and shape and shape[0] == rows:
                outside.add(op_id - back)
    return len(outside)


def _scaled_lengths(trace: Trace, by_op_id, call, k: int, since: int, preset, lower_key,
                    kernel_rows, durations) -> dict[int, int] | None:
    """Kernel row -> length for one call's ops run over `k` times its rows: each op's
    recorded kernels stretched by how much longer its lowering is at the larger shapes, a
    compiled program's as long as the backend's build of it over that many rows (a graph
    op has no key to lower)."""
    programs = _batched_programs(trace, k)
    lengths: dict[int, int] = {}
    built = np.zeros(len(call), bool)
    for i, op_id in enumerate(call["id"].astype(int).tolist()):
        rows = kernel_rows.get(op_id, [])
        if rows and all(row in programs for row in rows):
            lengths.update((row, programs[row]) for row in rows)
            built[i] = True
    call = call[~built]
    if not len(call):
        return lengths
    ids = call["id"].to_numpy(np.int64)
    keys = op_keys(trace, ids)
    if keys is None:
        return None
    made_here = _activation_inputs(trace, by_op_id, call, since)
    # an input of the call's rows is the call's data too, made before the call (a batch
    # prepared on the device)
    rows_of_call = _rows(call, keys)
    for op_id, key, inputs_made in zip(ids.tolist(), keys, made_here, strict=True):
        rows = kernel_rows.get(op_id, [])
        if not rows:
            continue
        inputs_made = [made or bool(shape and shape[0] == rows_of_call)
                       for made, (shape, _) in zip(inputs_made, key[1], strict=False)]
        bigger = _with_rows(key, k, inputs_made)
        old, _ = lower_key(key, preset)
        new, _ = lower_key(bigger, preset)
        if old is None or new is None or old.duration_ns <= 0:
            return None
        ratio = new.duration_ns / old.duration_ns
        for row in rows:
            lengths[row] = round(float(durations[row]) * ratio)
    return lengths


def _batched_programs(trace: Trace, k: int) -> dict[int, int]:
    """Row of `trace.kernels` -> its length over `k` calls' rows, for the compiled inference
    programs the backend also built over `tf.BATCHED_CALLS` calls' rows (`batched_ns`):
    between the two sizes a program's length grows in step with its rows, as its tiles
    do."""
    def compute() -> dict[int, int]:  # once per trace and k: every group asks
        from neuron_explorer.tables import number

        batched = number(trace, tf.ARG_BATCHED_NS, trace.kernels["id"].to_numpy(np.int64),
                         default=-1)
        rows = np.flatnonzero(batched >= 0)
        recorded = trace.kernels["dur"].to_numpy(np.float64)[rows]
        share = (k - 1) / (tf.BATCHED_CALLS - 1)
        grown = recorded + (batched[rows].astype(np.float64) - recorded) * share
        return dict(zip(rows.tolist(), np.round(grown).astype(np.int64).tolist(), strict=True))

    return memoised(trace, f"batched_calls:programs:{k}", compute)


def _rows(call, keys: list) -> int | None:
    """The call's rows: the first dim of the first result a kernel of it computes."""
    launched = call["kernel_count"].to_numpy() > 0
    return next((key[2][0][0][0] for key, runs in zip(keys, launched, strict=True)
                 if runs and key[2] and key[2][0][0]), None)


def call_rows(trace: Trace) -> int | None:
    """The rows the first analysed call computes on (None where unknown)."""
    steps = analysed_steps(trace).steps
    if not steps:
        return None
    call = trace.ops[trace.ops["step"] == steps[-1]].sort_values("ts", kind="stable")
    if "graph_id" in call:
        call = call[call["graph_id"].to_numpy() < 0]  # a compiled graph's op has no key
    keys = op_keys(trace, call["id"].to_numpy(np.int64)) if len(call) else None
    return _rows(call, keys) if keys is not None else None


def _activation_inputs(trace: Trace, by_op_id, call, since: int) -> list[list[bool]]:
    """Per op of the call, per tensor input: whether it is an activation: made by a
    kernel from op `since` on (this call, or the analysed call before it: a result read in
    the next step), through any views (`w.t()` is an op that launches nothing, and reads
    the parameter), or the call's upload of its request. Parameters were made before, at
    the model's upload. `by_op_id`: the trace's ops sorted by op id."""
    op_ids = by_op_id["op_id"].to_numpy(np.int64)
    lo, hi = np.searchsorted(op_ids, [since, int(call["op_id"].max())], side="left")
    window = by_op_id.iloc[lo:hi + 1]
    made = trace.slice_args.column(tf.ARG_PRODUCERS, window["id"].to_numpy(np.int64))
    backs_of = {int(o): (json.loads(m) if isinstance(m, str) else (m or []))
                for o, m in zip(window["op_id"].tolist(), made, strict=True)}
    launches = dict(zip(window["op_id"].astype(int).tolist(),
                        (window["kernel_count"].to_numpy() > 0).tolist(), strict=True))
    uploads = set(window.loc[window["name"].astype(str) == "aten::_to_copy", "op_id"]
                  .astype(int).tolist())

    def activation(op_id: int, back: int, depth: int = 0) -> bool:
        source = op_id - back
        if back <= 0 or source not in launches or depth > 8:
            return False
        if launches[source]:
            return True
        views = backs_of.get(source, [])  # a view: what it views
        return bool(views) and activation(source, views[0], depth + 1)

    out = []
    for op_id in call["op_id"].astype(int).tolist():
        backs = backs_of.get(op_id, [])
        upload = op_id in uploads and not any(b > 0 for b in backs)
        out.append([upload or activation(op_id, b) for b in backs])
    return out


def _with_rows(key: OpKey, k: int, inputs_made: list[bool]) -> OpKey:
    """The op key with the first dim of its activations (the inputs the call made, and
    every output) `k` times as large."""
    name, inputs, outputs, attrs = key

    def grown(shape: tuple) -> tuple:
        return (shape[0] * k, *shape[1:]) if len(shape) else shape

    ins = tuple((grown(s), d) if i < len(inputs_made) and inputs_made[i] else (s, d)
                for i, (s, d) in enumerate(inputs))
    outs = tuple((grown(s), d) for s, d in outputs)
    return name, ins, outs, attrs
