"""Exposed communication: devices move data with no compute running to hide it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from neuron_explorer.rules.finding import Finding, us
from neuron_explorer.rules.ranks import thresholds as th
from neuron_explorer.rules.ranks.finding import capped_by_path, run_finding

if TYPE_CHECKING:
    from neuron_explorer.runs.run import Run

RULE_ID = "exposed_communication"


def check(run: Run) -> list[Finding]:
    comm = run.communication()
    if not len(comm) or not comm["communication_ns"].sum():
        return []
    per_rank = comm.groupby("rank")[["exposed_transfer_ns", "communication_ns",
                                     "overlap_ns"]].sum()
    lost = float(per_rank["exposed_transfer_ns"].mean())
    if lost < th.EXPOSED_COMM_MIN_SHARE * run.analysed_time_ns():
        return []
    overlap = 100.0 * per_rank["overlap_ns"].sum() / per_rank["communication_ns"].sum()
    kinds = run.collective_stats().groupby("collective")["time_ns"].sum()
    top = ", ".join(f"{k} {us(v / len(run))}" for k, v in
                    kinds.sort_values(ascending=False).head(3).items())
    saving, basis = capped_by_path(
        run, lost, "estimate: the transfers no compute hides", ("collective",),
        "collective transfers")
    return [run_finding(
        run, RULE_ID, f"Communication not hidden by compute: {us(lost)} per rank", saving, [],
        f"Only {overlap:.0f}% of communication time overlaps computation; per rank the devices "
        f"spend {us(lost)} moving data with nothing else to do (by kind, per rank: {top}). "
        "Waits for late ranks are not counted here.",
        "Overlap communication with compute: with DDP, keep gradient bucketing on and tune "
        "bucket_cap_mb so the first buckets reduce while backward still runs (and use "
        "gradient_as_bucket_view=True); with FSDP2 (fully_shard), prefetch the next "
        "all-gather (set_modules_to_forward_prefetch / set_modules_to_backward_prefetch) and "
        "keep reshard_after_forward for large models only; issue collectives with "
        "async_op=True and wait on them only where the result is needed.",
        symptom_ns=lost, saving_basis=basis)]
