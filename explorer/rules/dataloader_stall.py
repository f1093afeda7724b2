"""Data-loader stalls: the step waits for its next batch."""

from __future__ import annotations

from typing import TYPE_CHECKING

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

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "dataloader_stall"


def check(trace: Trace) -> list[Finding]:
    bd = trace.breakdown()
    lost = float(bd.loc[(bd["side"] == "host") & (bd["category"] == "dataloader"), "ns"].sum())
    if lost < th.DATALOADER_MIN_SHARE * step_time(trace) or lost <= 0:
        return []
    hs = host_slices(trace)
    dl = hs[hs["kind"] == "dataloader"].sort_values("dur", ascending=False)
    items = [evidence(r.ts, r.dur, [r.id], f"waited {us(r.dur)} for the next batch")
             for r in top(dl).itertuples()]
    return [make(
        trace, RULE_ID, "Steps wait for the data loader", lost, items,
        f"The {loop_name(trace)} spent {us(lost)} waiting for batches; the device has nothing to "
        "do while the host prepares data.",
        "Load batches in parallel with the step: give your DataLoader num_workers=4 or more, "
        "persistent_workers=True and prefetch_factor=2 or more"
        + (", pin_memory=True" if device_terms(trace.metadata).pinned_memory else "")
        + "; move heavy preprocessing (decoding, tokenisation, augmentation) offline or into "
        "the workers' Dataset code.")]
