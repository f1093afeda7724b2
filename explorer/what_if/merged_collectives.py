"""Small collectives merged: what the host saves issuing one collective a step where it
issued many (DDP with a small `bucket_cap_mb`, FSDP2's `fully_shard` on every layer,
per-tensor all-reduces).

Each collective is a host call (`c10d::all_reduce`, ...) that costs a launch. Merged, the
same bytes go in one call: the analysed steps are replayed with every small collective's
host call but each step's first of its kind gone (`counterfactual.removal_saving_ns`).
The transfers' own per-call latency is the small-collectives rule's to count (on the
critical path); this is the host's part. A DDP run of 40 buckets a step: 1.71 ms a step
replayed, 1.95 ms saved by one bucket (a trial).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from neuron_explorer.analyses import communication as comm
from neuron_explorer.analyses.steady_state import in_analysed_steps
from neuron_explorer.common import trace_format as tf
from neuron_explorer.memo import memoised
from neuron_explorer.what_if.counterfactual import removal_saving_ns

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace


def merged_collectives_saving(trace: Trace, max_bytes: int) -> float | None:
    """ns the analysed steps save with their collectives of fewer than `max_bytes` issued
    as one host call a step; None where there are none to merge or no replay."""
    return memoised(trace, f"merged_collectives:{max_bytes}",
                    lambda: _saving(trace, max_bytes))


def _saving(trace: Trace, max_bytes: int) -> float | None:
    coll = comm.collectives(trace)
    if not len(coll) or not len(trace.ops):
        return None
    coll = in_analysed_steps(trace, coll[(coll["bytes"] > 0) & (coll["bytes"] < max_bytes)])
    if not len(coll):
        return None
    op_ids = trace.slice_args.column(tf.ARG_OP_ID, coll["id"].to_numpy(np.int64))
    slice_of_op = trace.ops.set_index("op_id")["id"]
    calls = coll.assign(call=slice_of_op.reindex(
        [int(i) if i is not None else -1 for i in op_ids]).to_numpy())
    calls = calls.dropna(subset=["call"])
    # one call a step of each kind (an all-gather and a reduce-scatter stay two)
    first = calls.groupby(["step", "collective"])["ts"].transform("min")
    removed = calls.loc[calls["ts"] > first, "call"].to_numpy(np.int64)
    if not len(removed):
        return None
    return removal_saving_ns(trace, np.unique(removed), f"merged collectives:{max_bytes}")
