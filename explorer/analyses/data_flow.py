"""Which ops read, through any chain of recorded ops, what other ops computed: the data
flow each eager op records (`producers`: per tensor input, how many op ids back the op
that made it was). Calls whose inputs do not depend on each other's results can run as
one call over their rows; calls that do (a sampler's steps, a corrector's second pass)
cannot."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import numpy as np
from neuron_explorer.common import trace_format as tf

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace


def reads_results_of(trace: Trace, sources: np.ndarray, readers: np.ndarray) -> bool | None:
    """Whether any op of `readers` (op ids) reads a result of an op of `sources`, directly
    or through the ops between them; None where the trace records no data flow."""
    ops = trace.ops
    if not len(sources) or not len(readers) or not len(ops) or "op_id" not in ops:
        return None
    lo, hi = int(np.min(sources)), int(np.max(readers))
    op_ids = ops["op_id"].to_numpy(np.int64)
    window = ops[(op_ids >= lo) & (op_ids <= hi)].sort_values("op_id", kind="stable")
    made = trace.slice_args.column(tf.ARG_PRODUCERS, window["id"].to_numpy(np.int64))
    if not any(m for m in made):
        return None
    reached = {int(s) for s in sources}
    for op_id, backs in zip(window["op_id"].astype(int).tolist(), made, strict=True):
        if op_id in reached or not backs:
            continue
        offsets = json.loads(backs) if isinstance(backs, str) else backs
        if any(k > 0 and op_id - k in reached for k in offsets):
            reached.add(op_id)
    return bool(reached & {int(r) for r in readers})


def model_call_reads_last(trace: Trace, step: int, last: int) -> bool | None:
    """Whether the model's call in `step` reads, through any ops, a result of its call in
    step `last`: a sampler's or a generation's next step (x from the last update, the
    sequence and its new token), not a request of its own. A step's read of the call
    before's answer (it lands in the next step) is no input of the model. None where the
    trace records no data flow."""
    from neuron_explorer.analyses.phases import model_calls

    ops = trace.ops.sort_values("ts", kind="stable")
    ts = ops["ts"].to_numpy(np.int64)
    op_ids = ops["op_id"].to_numpy(np.int64)
    calls = model_calls(trace)

    def inside(s: int) -> np.ndarray:
        found = [op_ids[np.searchsorted(ts, r.ts):np.searchsorted(ts, r.end)]
                 for r in calls[calls["step"] == s].itertuples()]
        return np.concatenate(found) if found else np.zeros(0, np.int64)

    return reads_results_of(trace, inside(last), inside(step))
