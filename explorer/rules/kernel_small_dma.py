"""An NKI kernel's lines whose DMA transfers spend most of their time on the fixed cost
of a transfer (small tiles, short contiguous rows), not hidden under compute."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
from neuron_explorer.analyses.kernel_lines import analysed_nki, dma_compute_overlap
from neuron_explorer.peaks import dma_fixed_text
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make
from neuron_explorer.rules.host_bound import device_saving

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "kernel_small_dma"


def check(trace: Trace) -> list[Finding]:
    runs, ins = analysed_nki(trace)
    figures = trace.hardware_figures or {}
    rate = float(figures.get("dma_bytes_per_s") or 0) / 1e9 / int(figures.get("dma_engines")
                                                                    or 16)
    # what the queues together can move, bytes per ns: the DMA engines' rate, or HBM's
    peak = min(r for r in (float(figures.get("dma_bytes_per_s") or 0),
                           float(figures.get("memory_bytes_per_s") or 0), math.inf) if r) / 1e9
    if not len(runs) or not rate:
        return []
    findings = []
    for name, mine in runs.groupby("name", sort=False):
        dma = ins[(ins["kernel"] == name) & (ins["engine"] == "dma") & (ins["bytes"] > 0)]
        if not len(dma):
            continue
        dur = dma["dur"].to_numpy(np.float64)
        overhead = np.clip(dur - dma["bytes"].to_numpy(np.float64) / rate, 0, None)
        # The share of the DMA busy time larger transfers could save: what the kernel's
        # transfers together fall short of the peak rate by. A transfer's time over its
        # queue's rate is no overhead where the queues share the engines and HBM: a kernel
        # at 95% of HBM's bandwidth was told 68% of its DMA time was overhead, and larger
        # tiles made it no faster.
        moved = busy = lost = 0.0
        for _kid, part in ins[ins["kernel"] == name].groupby("kernel_id"):
            d, _c, both = dma_compute_overlap(part)
            run_bytes = float(part.loc[part["engine"] == "dma", "bytes"].sum())
            moved, busy = moved + run_bytes, busy + d
            short = max(0.0, 1.0 - run_bytes / max(d, 1) / peak) if math.isfinite(peak) else 0.0
            lost += (d - both) * short  # the exposed DMA time's shortfall from the peak
        share = max(0.0, 1.0 - moved / max(busy, 1.0) / peak) if math.isfinite(peak) else 0.0
        if share < th.KERNEL_SMALL_DMA_OVERHEAD or \
                lost < th.KERNEL_MIN_SHARE * float(mine["dur"].sum()):
            continue
        per_line = dma.assign(overhead=overhead).groupby("source").agg(
            transfers=("bytes", "size"), median_bytes=("bytes", "median"),
            overhead=("overhead", "sum"), dur=("dur", "sum"))
        per_line = per_line.sort_values("overhead", ascending=False)
        run = mine.iloc[0]
        items = [evidence(run["ts"], run["dur"], [run["id"]],
                          f"{src}: {int(r.transfers)} transfers of {int(r.median_bytes)} B "
                          f"(median), {r.overhead / max(r.dur, 1):.0%} of their time overhead "
                          "(fixed cost, short rows)")
                 for src, r in per_line.iterrows()]
        saving = device_saving(trace, lost)
        findings.append(make(
            trace, RULE_ID, f"Kernel {name}: small DMA transfers", saving.time_lost_ns, items,
            f"{name}'s transfers move data at {1 - share:.0%} of the peak rate while DMA "
            f"is busy: {share:.0%} of its DMA time is overhead, the fixed cost of each "
            f"transfer{dma_fixed_text(figures)} that the transfers in flight do not hide, "
            "and short contiguous rows (under 4 KiB per partition); "
            f"{len(dma)} transfers of {int(dma['bytes'].median())} B (median, per queue). "
            "The time counted is that share of the DMA time not hidden under compute."
            + saving.note,
            "Move more per transfer: load larger tiles (a block of several tiles in one "
            "nl.load / nisa.dma_copy, e.g. [128, 2048] instead of [128, 512]), lay data out "
            "so each partition reads a long contiguous row (2 KiB or more), and hoist loads "
            "reused across loop iterations.",
            symptom_ns=lost, saving_basis=saving.basis, after=saving.after))
    return findings
