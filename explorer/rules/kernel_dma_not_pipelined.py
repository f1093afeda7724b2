"""An NKI kernel whose DMA and compute run one after the other when they could overlap:
loads are not pipelined with the engines that use them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from neuron_explorer.analyses.kernel_lines import (
    dma_compute_overlap,
    kernel_lines,
    nki_instructions,
    nki_runs,
)
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make, us
from neuron_explorer.rules.host_bound import device_saving

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "kernel_dma_not_pipelined"


def check(trace: Trace) -> list[Finding]:
    runs = nki_runs(trace)
    if not len(runs):
        return []
    ins = nki_instructions(trace)
    by_run = dict(tuple(ins.groupby("kernel_id")))
    findings = []
    for name, mine in runs.groupby("name", sort=False):
        lost, items = 0.0, []
        for run in mine.itertuples():
            part = by_run.get(run.kernel_id)
            if part is None:
                continue
            dma, compute, both = dma_compute_overlap(part)
            shorter = min(dma, compute)
            if (min(dma, compute) >= th.KERNEL_BUSY_SHARE * run.dur
                    and both < th.KERNEL_MIN_OVERLAP * shorter):
                lost += shorter - both
                items.append(evidence(run.ts, run.dur, [run.id],
                                      f"{name}: DMA busy {us(dma)}, compute {us(compute)}, "
                                      f"only {us(both)} at once"))
        if not items or lost < th.KERNEL_MIN_SHARE * float(mine["dur"].sum()):
            continue
        lines = kernel_lines(trace, name)
        waiting = lines.sort_values("stall_ns", ascending=False).head(2)
        where = "; ".join(f"{s} waits {us(v)} for its inputs"
                          for s, v in zip(waiting["source"], waiting["stall_ns"], strict=True)
                          if v > 0)
        saving = device_saving(trace, lost)
        findings.append(make(
            trace, RULE_ID, f"Kernel {name}: DMA and compute not pipelined",
            saving.time_lost_ns, items,
            f"{name} runs its DMA transfers and its compute one after the other: of the "
            f"shorter of the two, less than {th.KERNEL_MIN_OVERLAP:.0%} runs under the other, "
            "so each engine waits for the other in turn"
            + (f" ({where})" if where else "") + ". The time counted is the part that could "
            "have overlapped." + saving.note,
            "Pipeline the loads: allocate the tiles a loop iteration loads inside the loop "
            "(so several buffers rotate and the next load runs while this one computes), "
            "loop with nl.affine_range where iterations are independent, load a tile ahead "
            "of its use, and hoist loads reused across iterations out of the loop.",
            symptom_ns=lost, saving_basis=saving.basis, after=saving.after))
    return findings
