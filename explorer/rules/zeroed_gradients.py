"""Gradients zeroed in place: `optimizer.zero_grad(set_to_none=False)` writes zeros into
every gradient each step, and the backward then adds each parameter's first gradient into
those zeros. With `set_to_none=True` (PyTorch's default) the gradients are dropped instead
and the first backward stores its gradients as they are: both sets of ops go.

The zeroing ops are the ops inside the optimizer's `zero_grad` slice; the first
accumulations are, per zeroed gradient, the first in-place add of its shape that follows
in the same step outside the optimizer (AccumulateGrad's, in the backward). What setting
them to None saves is the run replayed without both. Gradient accumulation over 4
micro-batches lost 8.9% of its steps to them, and no finding said so.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer import tables
from neuron_explorer.analyses.phases import in_analysed_work
from neuron_explorer.common import trace_format as tf
from neuron_explorer.common.op_key_codec import parse_shapes
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make, step_time, top, us
from neuron_explorer.what_if.counterfactual import removal_saving_ns

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "zeroed_gradients"
ACCUMULATE = "aten::add_"  # how AccumulateGrad adds a gradient into an existing one


def _shapes(text: str) -> list[tuple[int, ...]]:
    try:
        return [tuple(s) for s in parse_shapes(text) if isinstance(s, list)]
    except ValueError:
        return []


def zeroing(trace: Trace) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the analysed steps' `zero_grad` slices that ran ops; the ops they ran, each with
    the slice id of its `call`)."""
    s = trace.table("slices")
    ops = in_analysed_work(trace, trace.ops)
    calls = tables.of_kind(trace, tf.CAT_OPTIMIZER)
    calls = calls[calls["name"].astype(str).str.endswith("zero_grad")]
    if not len(calls) or not len(ops):
        return s.iloc[:0], ops.iloc[:0]
    is_call = np.zeros(len(s), bool)
    is_call[calls["id"].to_numpy(np.int64)] = True
    owner = tables.ancestor_in(trace, ops["id"].to_numpy(np.int64), is_call)
    zeroes = ops[owner >= 0].assign(call=owner[owner >= 0])
    return calls[calls["id"].isin(owner[owner >= 0])], zeroes


def first_accumulations(trace: Trace, zeroes: pd.DataFrame) -> pd.DataFrame:
    """For each gradient `zeroes` zeroed, the first in-place add of its shape after the
    zeroing and before the next, outside the optimizer (AccumulateGrad's, in the backward):
    in the same step where zero_grad comes first in it, in the next where it comes last
    (after the optimizer's step), and then in the first analysed step also before its own
    zeroing (after the step before's, not analysed). Looked for in the same step alone, a
    loop zeroing at the end of its steps was claimed 0.43x what set_to_none=True saved."""
    ops = in_analysed_work(trace, trace.ops)
    adds = ops[ops["name"].astype(str) == ACCUMULATE]
    if not len(adds) or not len(zeroes):
        return adds.iloc[:0]
    # not the optimizer's own; a compiled backward's are under no module's backward slice
    adds = adds[tables.ancestor_of_kind(trace, adds["id"].to_numpy(np.int64),
                                        (tf.CAT_OPTIMIZER,)) < 0].sort_values("ts")
    groups = [zs for _, zs in zeroes.groupby("step")]
    ends = [int(zs["ts"].max()) for zs in groups]
    starts = [int(zs["ts"].min()) for zs in groups]
    # (the shapes zeroed, the window their first adds fall in)
    windows: list[tuple[pd.DataFrame, int | None, int | None]] = [
        (zs, ends[i], starts[i + 1] if i + 1 < len(groups) else None)
        for i, zs in enumerate(groups)]
    first = groups[0]
    windows.insert(0, (first, None, starts[0]))  # the first step's adds before its zeroing
    ts = adds["ts"].to_numpy(np.int64)
    chosen: list[int] = []
    for zs, after, before in windows:
        wanted = Counter(shape for text in zs["shapes"].astype(str) for shape in _shapes(text))
        inside = np.ones(len(adds), bool)
        if after is not None:
            inside &= ts > after
        if before is not None:
            inside &= ts < before
        if after is None:  # before the first zeroing: within its step alone
            inside &= adds["step"].to_numpy() == zs["step"].iloc[0]
        mine = adds[inside]
        for op_id, text in zip(mine["id"], mine["shapes"].astype(str), strict=True):
            shapes = _shapes(text)
            if len(shapes) == 2 and shapes[0] == shapes[1] and wanted[shapes[0]] > 0:
                wanted[shapes[0]] -= 1
                chosen.append(int(op_id))
    return adds[adds["id"].isin(chosen)]


def _ops(n: int) -> str:
    return f"{n} op" if n == 1 else f"{n} ops"


def check(trace: Trace) -> list[Finding]:
    calls, zeroes = zeroing(trace)
    if not len(zeroes):
        return []
    # the gradients zeroed: the shapes of the ops that write zeros (a detach_ writes none)
    writing = zeroes[zeroes["kernel_count"] > 0]
    firsts = first_accumulations(trace, writing)
    removed = np.concatenate([zeroes["id"].to_numpy(np.int64), firsts["id"].to_numpy(np.int64)])
    saving = removal_saving_ns(trace, removed, RULE_ID)
    if saving is None or saving < th.ZEROED_GRADIENTS_MIN_SHARE * step_time(trace):
        return []
    steps = max(int(zeroes["step"].nunique()), 1)
    grads = sum(len(_shapes(t)) for t in writing["shapes"].astype(str)) // steps
    where = str(zeroes["source"].astype(str).mode().iloc[0]) if "source" in zeroes else ""
    host = float(zeroes["dur"].sum() + firsts["dur"].sum())
    device = float(zeroes["device_dur"].sum() + firsts["device_dur"].sum())
    items = [evidence(r.ts, r.dur, [r.id], f"{r.name} zeroing {len(_shapes(str(r.shapes)))} "
                      f"gradients: {us(r.dur)}") for r in top(zeroes, "dur").itertuples()]
    return [make(
        trace, RULE_ID, f"zero_grad writes zeros into {grads} gradients a step", saving, items,
        f"{calls['name'].astype(str).iloc[0]}"
        + (f" at {where}" if where else "")
        + f" zeroes {grads} gradients in place each step ({_ops(len(writing) // steps)}), and "
        f"the backward then adds each one's first gradient into those zeros ({len(firsts)} "
        f"in-place adds in the analysed steps): {us(host)} of the host's op time and "
        f"{us(device)} of device time in all. Set to None instead, the gradients are "
        "dropped and the first backward stores its gradients as they are.",
        "Call zero_grad() with set_to_none=True, PyTorch's default"
        + (f" (at {where})" if where else "")
        + ", unless code reads .grad between zero_grad and the backward and needs zeros "
        "there (it then finds None).",
        symptom_ns=host,
        saving_basis="replay: the run replayed without the zeroing ops and the first "
                     "accumulation into each zeroed gradient")]
