"""Cast round trips: a bf16 tensor cast to float32 (`.float()`) and straight back to bf16.

Inside an autocast region a matmul's inputs are cast to the autocast dtype whatever dtype
they have, so `q.float() @ k.float()` still multiplies in bf16: each `.float()` is a copy
up and autocast's cast a copy back down, for nothing, and autograd makes the same two
copies again for the gradient. A trial's hand-written attention "kept in float32 for
stability" made 14 such copies a step in its forward alone; dropping the `.float()`
calls saved 10% of its step, and no finding named them.

Found in the recorded data flow: an `aten::_to_copy` from a lower precision to float32
whose every reader is an `aten::_to_copy` back to that precision. What dropping them saves
is the run replayed without both copies of each trip.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer.analyses.phases import in_analysed_work
from neuron_explorer.common import trace_format as tf
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import (
    Finding,
    evidence,
    make,
    named_sites,
    step_time,
    top,
    us,
)
from neuron_explorer.tables import ancestor_of_kind
from neuron_explorer.what_if.counterfactual import removal_saving_ns

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "cast_round_trip"
CAST = "aten::_to_copy"
LOWER = frozenset({"bfloat16", "float16"})


def round_trips(trace: Trace) -> tuple[pd.DataFrame, np.ndarray]:
    """(the analysed steps' casts up to float32 whose every reader casts straight back
    down, the ids of those casts back)."""
    from neuron_explorer.what_if.compiled import recorded_data_flow
    from neuron_explorer.what_if.replay import op_keys

    ops = trace.ops.sort_values("ts", kind="stable", ignore_index=True)
    cast_rows = np.flatnonzero(ops["name"].astype(str).to_numpy() == CAST)
    none = (ops.iloc[:0], np.zeros(0, np.int64))
    if not len(cast_rows):
        return none
    keys = op_keys(trace, ops["id"].to_numpy(np.int64)[cast_rows])
    if keys is None:
        return none
    # per cast row: (from, to) dtype of its one tensor
    dtypes = {int(r): (key[1][0][1], key[2][0][1]) for r, key in zip(cast_rows, keys,
                                                                      strict=True)
              if len(key[1]) == 1 and len(key[2]) == 1}
    if not any(s in LOWER and t == "float32" for s, t in dtypes.values()):
        return none  # every run's uploads are casts too: no data flow read for them alone
    flow = recorded_data_flow(trace, ops)
    if flow is None:
        return none
    _, direct = flow
    no_work = ops["kernel_count"].to_numpy() == 0

    def readers(row: int, seen: frozenset = frozenset()) -> set[int]:
        """The ops that read `row`'s result, through views of it (`k.float().transpose()`:
        ops that launch nothing pass their input on)."""
        out: set[int] = set()
        for r in direct.get(row, ()):
            if no_work[r] and r not in seen:
                out |= readers(r, seen | {r})
            else:
                out.add(r)
        return out

    up, back = [], []
    for row, (source, target) in dtypes.items():
        read = readers(row)
        if source in LOWER and target == "float32" and read and all(
                dtypes.get(r) == ("float32", source) for r in read):
            up.append(row)
            back.extend(sorted(read))
    ups = ops.iloc[up]
    kept = in_analysed_work(trace, ups)
    backs = ops.iloc[back]
    return kept, backs.loc[backs["step"].isin(kept["step"].unique()), "id"].to_numpy(np.int64)


def check(trace: Trace) -> list[Finding]:
    ups, backs = round_trips(trace)
    if not len(ups):
        return []
    saving = removal_saving_ns(trace, np.concatenate([ups["id"].to_numpy(np.int64), backs]),
                               RULE_ID)
    if saving is None or saving < th.CAST_ROUND_TRIP_MIN_SHARE * step_time(trace):
        return []
    steps = max(int(ups["step"].nunique()), 1)
    per_step = round((len(ups) + len(backs)) / steps)
    # the forward's casts name the user's lines (the backward's carry the backward() call's)
    forward = ancestor_of_kind(trace, ups["id"].to_numpy(np.int64), (tf.CAT_BACKWARD,)) < 0
    named = named_sites(ups.loc[forward if forward.any() else slice(None), "source"]
                        .astype(str), steps)
    items = [evidence(r.ts, r.dur, [r.id], f"{r.dtypes} cast to float32 at {r.source}, then "
                      f"back: {us(r.dur)} on the host, {us(r.device_dur)} on the device")
             for r in top(ups, "dur").itertuples()]
    return [make(
        trace, RULE_ID, f"Casts to float32 undone at once: {per_step} copies a step", saving,
        items,
        f"{per_step} copies a step cast a bfloat16 tensor to float32 and straight back"
        + (f" (the casts up at {named})" if named else "") + ". Inside an autocast region "
        "a matmul's inputs are cast to the autocast dtype whatever their dtype, so a "
        "`.float()` before one does not make it run in float32: the matmul still "
        "multiplies in bfloat16, and the two copies (and the two autograd makes for the "
        f"gradient) are work for nothing ({us(ups['device_dur'].sum())} of device time in "
        "the casts up alone).",
        "Drop the .float() (or .to(torch.float32)) before these matmuls: under autocast it "
        "changes no result. To run such a matmul in float32, disable autocast around it "
        "(with torch.autocast('neuron', enabled=False)) and give it float32 inputs there.",
        symptom_ns=float(ups["dur"].sum() + ups["device_dur"].sum()),
        saving_basis="replay: the run replayed without the casts up to float32 and the "
                     "casts straight back")]
