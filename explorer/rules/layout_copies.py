"""Layout copies: a strided view (`x.permute(...)`, `.transpose`, a slice) made contiguous on
the device every step, by `.contiguous()`, `reshape` or an op that needs contiguous input
(`torch.matmul` on a permuted tensor). Each is an allocation and a copy the host issues
and the device runs; computed in the layout the tensor has, neither happens.

The copies are the device-to-device copies our recordings mark as reading a strided view
(`layout_copy`), with the allocation made for each just before it. What keeping the layout
saves is the run replayed without both. A trial's attention block made five such copies a
step, 6% of it, and no finding named them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer.analyses.phases import in_analysed_work
from neuron_explorer.common import trace_format as tf
from neuron_explorer.rules import host_bound
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make, step_time, top, us
from neuron_explorer.tables import flag
from neuron_explorer.what_if.counterfactual import removal_saving_ns

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "layout_copies"
# the allocation a copy into a new tensor makes just before it (`x.contiguous()`)
ALLOCATIONS = frozenset({"aten::empty", "aten::empty_strided", "aten::empty_like"})


def layout_copies(trace: Trace) -> tuple[pd.DataFrame, np.ndarray]:
    """(the analysed steps' layout copies, the allocations made for them just before)."""
    ops = in_analysed_work(trace, trace.ops)
    copies = ops[ops["name"].astype(str) == "aten::_copy_from"]
    if not len(copies):
        return copies, np.zeros(0, np.int64)
    marked = flag(trace.slice_args.column(tf.ARG_LAYOUT_COPY, copies["id"].to_numpy(np.int64)))
    copies = copies[marked]
    if not len(copies):
        return copies, np.zeros(0, np.int64)
    by_op = ops.set_index("op_id")
    before = by_op.reindex(copies["op_id"].to_numpy(np.int64) - 1)
    made = before["name"].astype(str).isin(ALLOCATIONS).to_numpy() & (
        before["step"].to_numpy() == copies["step"].to_numpy())
    return copies, before["id"].to_numpy()[made].astype(np.int64)


def check(trace: Trace) -> list[Finding]:
    copies, allocations = layout_copies(trace)
    if not len(copies):
        return []
    removed = np.concatenate([copies["id"].to_numpy(np.int64), allocations])
    saving = removal_saving_ns(trace, removed, RULE_ID)
    if saving is None or saving < th.LAYOUT_COPIES_MIN_SHARE * step_time(trace):
        return []
    steps = max(int(copies["step"].nunique()), 1)
    sites = copies["source"].astype(str)
    lines = sites[sites != ""].value_counts()
    named = ", ".join(f"{site} ({n // steps}x)" for site, n in lines.head(3).items())
    items = [evidence(r.ts, r.dur, [r.id], f"layout copy of {r.shapes} at {r.source}: "
                      f"{us(r.dur)} on the host, {us(r.device_dur)} on the device")
             for r in top(copies, "dur").itertuples()]
    per_step = round(len(copies) / steps)
    overlap = (" Compiling the model, the host-bound finding's fix, folds these copies into "
               "its graphs too: the two savings overlap rather than add."
               if host_bound.is_host_bound(trace) and not host_bound.is_compiled(trace)
               else "")
    views = "a strided view" if per_step == 1 else f"{per_step} strided views"
    return [make(
        trace, RULE_ID, f"Layout copies: {views} made contiguous a step", saving, items,
        f"{'1 copy' if per_step == 1 else f'{per_step} copies'} a step on the device "
        f"{'reads' if per_step == 1 else 'read'} a strided view (a permute, "
        "transpose or slice) to make it contiguous, for .contiguous(), reshape or an op that "
        "needs contiguous input" + (f", at {named}" if named else "") + ": each is an "
        "allocation and a copy the host issues and the device runs "
        f"({us(copies['dur'].sum())} of host op time and {us(copies['device_dur'].sum())} of "
        "device time in all)." + overlap,
        "Compute in the layout the tensor has: contract or reduce over the dim where it is "
        "(x @ w on [batch, time, dim], then mean over dim 1, rather than permuting to "
        "[time, batch, dim] first), permute once where the data is made rather than before "
        "each op, and slice contiguous blocks (x[i] rather than x[:, i]).",
        symptom_ns=float(copies["dur"].sum() + copies["device_dur"].sum()),
        saving_basis="replay: the run replayed without the layout copies and the "
                     "allocations made for them")]
