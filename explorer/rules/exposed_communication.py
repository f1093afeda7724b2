"""Exposed communication on one trace: a device moves data with no compute to hide it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer.analyses.communication import collectives, exposed_transfer
from neuron_explorer.analyses.steady_state import in_analysed_steps
from neuron_explorer.common.intervals import Union
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make, step_time, top, us
from neuron_explorer.rules.host_bound import device_saving

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "exposed_communication"
RECOMMENDATION = (
    "Overlap communication with compute: with DDP, keep gradient bucketing on and tune "
    "bucket_cap_mb so the first buckets reduce while backward still runs (and use "
    "gradient_as_bucket_view=True); with FSDP2 (fully_shard), prefetch the next all-gather "
    "(set_modules_to_forward_prefetch / set_modules_to_backward_prefetch) and keep "
    "reshard_after_forward for large models only; issue collectives with async_op=True and "
    "wait on them only where the result is needed.")

LATE_RANK = (
    "Find the rank that arrives late: load every rank's trace as a run (neuron-explorer "
    "report RUN_FOLDER, or the dashboard's Ranks page), whose straggler finding names it and "
    "what it does that the others do not. For the part that moves data:")


def check(trace: Trace) -> list[Finding]:
    coll = collectives(trace)
    if not len(coll):
        return []
    comm = trace.communication()
    k = trace.kernels
    compute = k[~k["id"].isin(set(coll["id"].tolist())) & ~k["kind"].isin(["memcpy", "memset"])]
    exposed_rows = []
    for device, rows in coll.groupby("device"):
        c = compute[compute["device"] == device]
        work = Union(c["ts"].to_numpy(np.int64), (c["ts"] + c["dur"]).to_numpy(np.int64))
        covered = work.covered(rows["ts"].to_numpy(np.int64),
                               (rows["ts"] + rows["dur"]).to_numpy(np.int64))
        exposed_rows.append(rows.assign(exposed=rows["dur"].to_numpy() - covered))
    # the calls the analysed steps launched, as the totals count (a device behind its host
    # ran 40 ms of all-reduces, 25 of them in the steps' windows)
    exposed = in_analysed_steps(trace, pd.concat(exposed_rows, ignore_index=True))
    lost = float(comm["exposed_ns"].sum())
    if lost < th.EXPOSED_COMM_MIN_SHARE * step_time(trace):
        return []
    waits = _waits_recorded(coll)
    moving = float(exposed_transfer(trace).sum()) if waits else lost
    mostly_waiting = lost - moving > moving
    overlap = 100.0 * comm["overlap_ns"].sum() / max(comm["communication_ns"].sum(), 1)
    items = [evidence(r.ts, r.dur, [r.id], f"{r.collective} of {int(r.bytes)} bytes: "
                      f"{us(r.exposed)} of its {us(r.dur)} with no compute beside it")
             for r in top(exposed, "exposed").itertuples()]
    kinds = exposed.groupby("collective")["exposed"].sum().sort_values(ascending=False)
    by_kind = ", ".join(f"{name} {us(ns)}" for name, ns in kinds.head(3).items())
    saving = device_saving(trace, moving)
    return [make(
        trace, RULE_ID, (f"Collectives wait for other ranks to arrive ({len(coll)} collectives)"
                         if mostly_waiting else
                         f"Communication not hidden by compute ({len(coll)} collectives)"),
        saving.time_lost_ns, items,
        f"Only {overlap:.0f}% of communication time overlaps computation on the same device; "
        f"for {us(lost)} the device only communicates ({by_kind}). " + (
            f"Of that, {us(lost - moving)} is waiting for other ranks to arrive (recorded on "
            "each call), which no overlap hides: the late rank sets it (load every rank's "
            f"trace as a run to see which); {us(moving)} moves data." if waits else
            "Part of it can be waiting for other ranks to arrive: load every rank's trace "
            "as a run to tell the two apart.")
        + saving.note, (LATE_RANK + " " if mostly_waiting else "") + RECOMMENDATION,
        symptom_ns=lost, after=saving.after,
        saving_basis=saving.basis + ("; of the exposed time, the data moving only (each "
                                     "call's recorded wait for the other ranks left out)"
                                     if waits else ""))]


def _waits_recorded(coll: pd.DataFrame) -> bool:
    """Whether the trace records each call's wait for the other ranks (ours do; a PyTorch
    profiler's do not): a rank whose device waited 24 ms for a late rank was told that
    overlapping compute would save those 24 ms."""
    return bool(len(coll)) and bool((coll["wait_ns"] >= 0).all())

