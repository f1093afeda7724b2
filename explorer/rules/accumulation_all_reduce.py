"""DDP with gradient accumulation, all-reducing every micro-batch: DistributedDataParallel
reduces the gradients in each backward, so a step of k micro-batches runs k all-reduces
of every bucket, and the first k-1 are thrown away into the next micro-batch's sum. Run
under `ddp.no_sync()`, those backwards only accumulate locally, and the last one reduces
the sum once.

What a micro-batch's backward runs for the reducer: its collectives, the copies of each
gradient into the bucket before each (`ddp_reducer_ops`, by the recorded data flow), and
after the backward the copies of the reduced buckets back into the gradients (alike ops
of the backward's line, right after it). The saving is the run replayed without them in
each step's backwards but the last. A two-rank MLP over four micro-batches lost 23% of
its steps so, under the exposed-communication finding's threshold, and nothing said so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from neuron_explorer import tables
from neuron_explorer.analyses.phases import in_analysed_work
from neuron_explorer.common import trace_format as tf
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make, step_time, top, us
from neuron_explorer.what_if.counterfactual import removal_saving_ns

if TYPE_CHECKING:
    import pandas as pd
    from neuron_explorer.trace import Trace

RULE_ID = "accumulation_all_reduce"
_COPY_BACK = frozenset({"aten::_copy_from", "aten::copy_", "aten::as_strided", "aten::view"})


def early_reductions(trace: Trace) -> pd.DataFrame:
    """The ops DDP's reducer runs in each analysed step's backwards of a module but its
    last (rows of `trace.ops`); none where a step runs a module's backward once, or no
    collective in a backward."""
    from neuron_explorer.what_if.compiled import recorded_data_flow
    from neuron_explorer.what_if.distributed_ops import ddp_reducer_ops

    ops = in_analysed_work(trace, trace.ops[trace.ops["step"] >= 0])
    names = ops["name"].astype(str)
    if not names.str.startswith("c10d::").any():
        return ops.iloc[:0]
    ops = ops.sort_values("ts", kind="stable", ignore_index=True)
    names = ops["name"].astype(str).tolist()
    ids = ops["id"].to_numpy(np.int64)
    # each backward pass: its outermost backward range
    passes = tables.ancestor_of_kind(trace, ids, (tf.CAT_BACKWARD,), outermost=True)
    keys = [None if n.startswith("c10d::") else (n,) for n in names]
    reducer = ddp_reducer_ops(names, keys, passes >= 0, recorded_data_flow(trace, ops))
    collective = np.array([n.startswith("c10d::") for n in names]) & (passes >= 0)
    names_of = trace.table("slices")["name"].array  # a few rows read: no string per slice
    chosen: list[int] = []
    for index in ops.groupby("step").groups.values():
        rows = np.asarray(index)
        reducing = [p for p in dict.fromkeys(passes[rows].tolist())
                    if p >= 0 and collective[rows[passes[rows] == p]].any()]
        for i, p in enumerate(reducing):
            # a backward of the module a later one in the step runs again: its gradients
            # are summed into that one's (two models' backwards, a GAN's, each reduce)
            if names_of[p] not in {names_of[q] for q in reducing[i + 1:]}:
                continue
            mine = rows[passes[rows] == p]
            chosen += [int(r) for r in mine if collective[r] or r in reducer]
            chosen += _copies_back(ops, names, int(mine[-1]))
    return ops.iloc[sorted(set(chosen))]


def _copies_back(ops: pd.DataFrame, names: list[str], last: int) -> list[int]:
    """The ops right after a backward's last op that copy its reduced buckets back into
    the gradients: alike ops of the backward's line, outside any module."""
    source, module = ops["source"].astype(str).to_numpy(), ops["module"].astype(str).to_numpy()
    out, row = [], last + 1
    while (row < len(ops) and names[row] in _COPY_BACK and source[row] == source[last]
           and module[row] in ("", "nan")):
        out.append(row)
        row += 1
    return out


def check(trace: Trace) -> list[Finding]:
    early = early_reductions(trace)
    if not len(early):
        return []
    saving = removal_saving_ns(trace, early["id"].to_numpy(np.int64), RULE_ID)
    if saving is None or saving < th.ACCUMULATION_ALL_REDUCE_MIN_SHARE * step_time(trace):
        return []
    names = early["name"].astype(str)
    reduces = early[names.str.startswith("c10d::")]
    steps = max(int(early["step"].nunique()), 1)
    where = str(reduces["source"].astype(str).mode().iloc[0])
    items = [evidence(r.ts, r.dur, [r.id], f"{r.name} in a backward whose gradients the next "
                      f"micro-batch adds to: {us(r.dur)}")
             for r in top(reduces, "dur").itertuples()]
    per_step = round(len(reduces) / steps)
    return [make(
        trace, RULE_ID, f"Gradients all-reduced in every micro-batch ({per_step} "
        "collectives a step before the last backward)", saving, items,
        f"Each step runs several backwards (gradient accumulation), and DDP reduces the "
        f"gradients in every one (at {where}): {per_step} collectives a step, "
        "with the reducer's copies into and out of its buckets, run in backwards whose sums "
        "the next micro-batch adds to. Only the last backward's reduction is needed.",
        "Run every micro-batch but the last under `with model.no_sync():` (the DDP "
        "module): the backward then accumulates locally, and the last one reduces the sum "
        "once. (FSDP: `model.set_requires_gradient_sync(False)` for those micro-batches.)",
        symptom_ns=float(reduces["dur"].sum()),
        saving_basis="replay: the run replayed without the reducer's collectives and "
                     "bucket copies in each step's backwards but the last")]
