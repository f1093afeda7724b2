"""Data-loader stalls: the step waits for its next batch."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
from neuron_explorer.analyses.step_breakdown import host_slices
from neuron_explorer.device_terms import device_terms
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import (
    Finding,
    evidence,
    loop_name,
    make,
    step_time,
    top,
    us,
)
from neuron_explorer.trace_format import ARG_WORKER

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "dataloader_stall"
ONE_WORKER_SHARE = 0.6  # a worker behind this much of the wait is named as the slow one


def _worker_share(waits: pd.DataFrame) -> str:
    """Which worker the waits were on, when the recording followed the workers."""
    known = waits[waits["worker"] >= 0]
    if not len(known):
        return ""
    by_worker = known.groupby("worker")["dur"].sum().sort_values(ascending=False)
    worst, share = int(by_worker.index[0]), float(by_worker.iloc[0] / by_worker.sum())
    if len(by_worker) > 1 and share >= ONE_WORKER_SHARE:
        return (f" Worker {worst} is behind {share:.0%} of the wait: its batches take longer "
                "than the others' (its row in the timeline shows where: fetching or collating).")
    return (f" The waits are spread over {len(by_worker)} worker"
            f"{'s' if len(by_worker) != 1 else ''}: together they fetch batches slower than "
            "the step uses them.")


def check(trace: Trace) -> list[Finding]:
    bd = trace.breakdown()
    lost = float(bd.loc[(bd["side"] == "host") & (bd["category"] == "dataloader"), "ns"].sum())
    if lost < th.DATALOADER_MIN_SHARE * step_time(trace) or lost <= 0:
        return []
    hs = host_slices(trace)
    dl = hs[hs["kind"] == "dataloader"].sort_values("dur", ascending=False)
    # Recorded with worker processes, each wait names the worker it waited on.
    dl = dl.assign(worker=trace.slice_args.numbers(ARG_WORKER, dl["id"].to_numpy(), default=-1))
    items = [evidence(r.ts, r.dur, [r.id], f"waited {us(r.dur)} for the next batch"
                      + (f" from DataLoader worker {r.worker}" if r.worker >= 0 else ""))
             for r in top(dl).itertuples()]
    return [make(
        trace, RULE_ID, "Steps wait for the data loader", lost, items,
        f"The {loop_name(trace)} spent {us(lost)} waiting for batches; the device has nothing to "
        "do while the host prepares data." + _worker_share(dl),
        "Load batches in parallel with the step: give your DataLoader num_workers=4 or more, "
        "persistent_workers=True and prefetch_factor=2 or more"
        + (", pin_memory=True" if device_terms(trace.metadata).pinned_memory else "")
        + "; move heavy preprocessing (decoding, tokenisation, augmentation) offline or into "
        "the workers' Dataset code.")]
