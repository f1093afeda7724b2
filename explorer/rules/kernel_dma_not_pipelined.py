"""An NKI kernel whose DMA and compute run one after the other when they could overlap:
loads are not pipelined with the engines that use them.

The saving is the kernel scheduled again with its SBUF tiles rotated (a fresh buffer for
each write, as a tile allocated inside its loop gets: `rotated_lengths`), which the
recorder does once per kernel and input sizes. Rotated, loads also run side by side on
more queues, so a DMA-bound kernel saves far more than the compute its DMA could hide: a
single-buffered matmul whose Tensor Engine was 9.9% busy got no finding, and rotating
its tiles saved 47% of each run. Recordings without the rotated length count the part of
the shorter of DMA and compute that could have overlapped."""

from __future__ import annotations

from typing import TYPE_CHECKING

from neuron_explorer.analyses.kernel_lines import (
    analysed_nki,
    dma_compute_overlap,
    kernel_lines,
    rotated_lengths,
)
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make, us
from neuron_explorer.rules.host_bound import device_saving

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "kernel_dma_not_pipelined"


def check(trace: Trace) -> list[Finding]:
    runs, ins = analysed_nki(trace)
    if not len(runs):
        return []
    by_run = dict(tuple(ins.groupby("kernel_id")))
    rotated = rotated_lengths(trace)
    findings = []
    for name, mine in runs.groupby("name", sort=False):
        lost, symptom, items, replayed = 0.0, 0.0, [], 0
        for run in mine.itertuples():
            part = by_run.get(run.kernel_id)
            if part is None:
                continue
            dma, compute, both = dma_compute_overlap(part)
            shorter = min(dma, compute)
            scheduled = _scheduled_as(rotated, str(name), int(run.dur))
            alone = None if scheduled is None else rotated[(str(name), scheduled)]
            if alone is not None and scheduled is not None:
                # the replay says it, whatever the overlap: a kernel whose compute hid
                # under its DMA still loaded one tile at a time
                saved = max(scheduled - alone, 0)
                replayed += 1
            elif (shorter >= th.KERNEL_BUSY_SHARE * run.dur
                  and both < th.KERNEL_MIN_OVERLAP * shorter):
                saved = shorter - both
            else:
                continue
            if saved <= 0:
                continue
            lost += saved
            symptom += shorter - both
            items.append(evidence(run.ts, run.dur, [run.id],
                                  f"{name}: DMA busy {us(dma)}, compute {us(compute)}, "
                                  f"only {us(both)} at once"
                                  + (f"; {us(alone)} with its tiles rotated"
                                     if alone is not None else "")))
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
            (f"{name} reuses its SBUF tiles' buffers: each load into a tile waits until "
             "the compute before it has read the tile, so loads cannot run ahead"
             if replayed else
             f"{name} runs its DMA transfers and its compute one after the other: of the "
             f"shorter of the two, less than {th.KERNEL_MIN_OVERLAP:.0%} runs under the "
             "other, so each engine waits for the other in turn")
            + (f" ({where})" if where else "") + "."
            + (" The time counted is what the kernel saves scheduled again with its SBUF "
               "tiles rotated (a fresh buffer for each write, as a tile allocated inside "
               "its loop gets): the next loads run while this tile computes, and side by "
               "side on more DMA queues." if replayed else
               " The time counted is the part that could have overlapped.") + saving.note,
            "Pipeline the loads: allocate the tiles a loop iteration loads inside the loop "
            "(so several buffers rotate and the next load runs while this one computes), "
            "loop with nl.affine_range where iterations are independent, load a tile ahead "
            "of its use, and hoist loads reused across iterations out of the loop.",
            symptom_ns=symptom, saving_basis=("replay: the kernel rescheduled with its tiles "
                                           "rotated; " if replayed else "") + saving.basis,
            after=saving.after))
    return findings


def _scheduled_as(rotated: dict[tuple[str, int], int], name: str, dur: int) -> int | None:
    """The scheduled length, among those recorded for kernel `name`, that a run of `dur`
    ns is (the device adds its fixed start-up to each run: under a microsecond)."""
    lengths = [length for kernel, length in rotated if kernel == name]
    if not lengths:
        return None
    nearest = min(lengths, key=lambda length: abs(dur - length))
    return nearest if abs(dur - nearest) <= max(RUN_SLACK_NS, 0.01 * nearest) else None


RUN_SLACK_NS = 2_000
