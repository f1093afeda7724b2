"""Small collectives: many small messages, each paying the interconnect's per-call latency."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from neuron_explorer.analyses.ranks import step_collectives
from neuron_explorer.rules.finding import Finding, us
from neuron_explorer.rules.ranks import thresholds as th
from neuron_explorer.rules.ranks.finding import (
    analysed_step_count,
    capped_by_path,
    own_work_per_rank,
    pace_saving,
    rank_evidence,
    run_finding,
)

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
    host = _host_saving(run)
    if max(lost, host) < th.SMALL_COLLECTIVES_MIN_SHARE * run.analysed_time_ns():
        return []
    median = float(small["bytes"].median())
    items = [rank_evidence(int(r.rank), r.ts, r.dur, [r.id],
                           f"{r.collective} of {int(r.bytes)} bytes took {us(r.dur)}")
             for r in small.sort_values("dur", ascending=False).head(5).itertuples()]
    saving, basis = capped_by_path(
        run, lost, "estimate: the per-call latency, at the bandwidth the large messages "
        "reach", ("collective",), "collective transfers")
    if host:
        basis += ("; and replay: each rank's steps without the host calls that issued the "
                  "small collectives, but one a step of each kind (merged)")
    steps = max(analysed_step_count(run), 1)
    host_text = (f" Each is a host call too: issued as one a step, a replay of each rank "
                 f"saves the run {us(host / steps)} a step of the host's launches."
                 if host else "")
    return [run_finding(
        run, RULE_ID, f"{count:.0f} small collectives per rank are latency-bound",
        saving + host, items,
        f"{count:.0f} collectives per rank move less than "
        f"{th.SMALL_COLLECTIVE_BYTES >> 20} MiB (median {median / 1024:.0f} KiB); each pays "
        "the interconnect's fixed per-call latency, so they reach a fraction of the bandwidth "
        f"of large messages: their transfers take "
        f"{us(small['moving'].sum() / len(run) / steps)} a step per rank, and merged, their "
        f"bytes would take {us(needed / len(run) / steps)}."
        + host_text,
        "Send fewer, larger messages: with DDP raise bucket_cap_mb (gradients are reduced in "
        "buckets), with FSDP2 shard larger modules (fully_shard on blocks, not every layer), "
        "and batch per-tensor collectives into one (all_reduce a flattened tensor, or "
        "torch.distributed's coalescing manager).", symptom_ns=lost, saving_basis=basis)]


def _host_saving(run: Run) -> float:
    """What issuing the small collectives as one call a step saves the run's hosts: each
    rank's replayed saving (`RankDigest.merged_collectives_ns`), and the run moves at the
    pace of its slowest rank's own work, so it saves that pace less the slowest own work
    once each rank saves its part. A DDP run of 40 buckets a step was told "no time to
    save now"; one bucket saved 1.95 ms a step, all of it host launches."""
    saved = {rank: d.merged_collectives_ns or 0.0 for rank, d in run.digests.items()}
    if not any(saved.values()):
        return 0.0
    own = own_work_per_rank(run)
    if own is None:
        return min(saved.values())  # every rank must shorten for the run to
    return pace_saving(own, saved)
