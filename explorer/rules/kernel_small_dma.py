"""An NKI kernel's lines whose DMA transfers spend most of their time on the fixed cost
of a transfer (small tiles, short contiguous rows), not hidden under compute."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from neuron_explorer.analyses.kernel_lines import dma_compute_overlap, nki_instructions, nki_runs
from neuron_explorer.peaks import dma_fixed_text
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make
from neuron_explorer.rules.host_bound import device_saving

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "kernel_small_dma"


def check(trace: Trace) -> list[Finding]:
    runs = nki_runs(trace)
    figures = trace.hardware_figures or {}
    rate = float(figures.get("dma_bytes_per_s") or 0) / 1e9 / int(figures.get("dma_engines")
                                                                    or 16)
    if not len(runs) or not rate:
        return []
    ins = nki_instructions(trace)
    findings = []
    for name, mine in runs.groupby("name", sort=False):
        dma = ins[(ins["kernel"] == name) & (ins["engine"] == "dma") & (ins["bytes"] > 0)]
        if not len(dma):
            continue
        dur = dma["dur"].to_numpy(np.float64)
        overhead = np.clip(dur - dma["bytes"].to_numpy(np.float64) / rate, 0, None)
        share = overhead.sum() / max(dur.sum(), 1.0)
        lost = 0.0
        for _kid, part in ins[ins["kernel"] == name].groupby("kernel_id"):
            d, _c, both = dma_compute_overlap(part)
            lost += (d - both) * share  # the exposed DMA time's fixed-cost part
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
            f"{share:.0%} of {name}'s DMA time is overhead, not moving data at a queue's "
            f"full rate: the fixed cost of each transfer{dma_fixed_text(figures)} that the "
            "transfers in "
            "flight do not hide, and short contiguous rows (under 4 KiB per partition); "
            f"{len(dma)} transfers of {int(dma['bytes'].median())} B (median, per queue). "
            "The time counted is that share of the DMA time not hidden under compute."
            + saving.note,
            "Move more per transfer: load larger tiles (a block of several tiles in one "
            "nl.load / nisa.dma_copy, e.g. [128, 2048] instead of [128, 512]), lay data out "
            "so each partition reads a long contiguous row (2 KiB or more), and hoist loads "
            "reused across loop iterations.",
            symptom_ns=lost, saving_basis=saving.basis, after=saving.after))
    return findings
