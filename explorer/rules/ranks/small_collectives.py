"""Small collectives: many small messages, each paying the interconnect's per-call latency."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from neuron_explorer.analyses.ranks import step_collectives
from neuron_explorer.rules.finding import Finding, us
from neuron_explorer.rules.ranks import thresholds as th
from neuron_explorer.rules.ranks.finding import capped_by_path, rank_evidence, run_finding

if TYPE_CHECKING:
    from neuron_explorer.runs.run import Run

RULE_ID = "small_collectives"


def check(run: Run) -> list[Finding]:
    coll = step_collectives(run)
    if not len(coll):
        return []
    moving = np.maximum(coll["transfer_ns"].to_numpy(), 0)
    coll = coll.assign(moving=moving)
    small = coll[(coll["bytes"] > 0) & (coll["bytes"] < th.SMALL_COLLECTIVE_BYTES)]
    large = coll[coll["bytes"] >= th.SMALL_COLLECTIVE_BYTES]
    count = len(small) / len(run)
    if count < th.SMALL_COLLECTIVES_MIN_COUNT:
        return []
    # What the same bytes would take at the bandwidth the run reaches on large messages
    # (or its best small one): the rest is per-call latency that merging would save.
    if len(large) and large["moving"].sum() > 0:
        bandwidth = large["bytes"].sum() / large["moving"].sum()
    else:
        rates = small["bytes"] / small["moving"].replace(0, np.nan)
        bandwidth = float(rates.max()) if rates.notna().any() else 0.0
    needed = small["bytes"].sum() / bandwidth if bandwidth > 0 else 0.0
    lost = max(float(small["moving"].sum()) - needed, 0.0) / len(run)
    if lost < th.SMALL_COLLECTIVES_MIN_SHARE * run.analysed_time_ns():
        return []
    median = float(small["bytes"].median())
    items = [rank_evidence(int(r.rank), r.ts, r.dur, [r.id],
                           f"{r.collective} of {int(r.bytes)} bytes took {us(r.dur)}")
             for r in small.sort_values("dur", ascending=False).head(5).itertuples()]
    saving, basis = capped_by_path(
        run, lost, "estimate: the per-call latency, at the bandwidth the large messages "
        "reach", ("collective",), "collective transfers")
    return [run_finding(
        run, RULE_ID, f"{count:.0f} small collectives per rank are latency-bound", saving,
        items,
        f"{count:.0f} collectives per rank move less than "
        f"{th.SMALL_COLLECTIVE_BYTES >> 20} MiB (median {median / 1024:.0f} KiB); each pays "
        "the interconnect's fixed per-call latency, so they reach a fraction of the bandwidth "
        f"of large messages. Merged, their bytes would take {us(needed / len(run))} per rank.",
        "Send fewer, larger messages: with DDP raise bucket_cap_mb (gradients are reduced in "
        "buckets), with FSDP2 shard larger modules (fully_shard on blocks, not every layer), "
        "and batch per-tensor collectives into one (all_reduce a flattened tensor, or "
        "torch.distributed's coalescing manager).", symptom_ns=lost, saving_basis=basis)]
