"""Small DMA transfers: under 4 KiB per partition, the fixed cost dominates."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from neuron_explorer.peaks import dma_bandwidth, partitions
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make, step_time, top, us
from neuron_explorer.tables import map_unique

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "small_dma"


def check(trace: Trace) -> list[Finding]:
    ins = trace.instructions
    if not len(ins):
        return []
    on_dma = map_unique(ins["engine"], lambda e: str(e).startswith("dma"), bool)
    dma = ins[on_dma | (ins["kind"].to_numpy() == "dma")]
    dma = dma[dma["bytes"] > 0]
    parts = partitions(trace.hardware_figures)
    small = dma[dma["bytes"] / parts < th.SMALL_DMA_BYTES_PER_PARTITION]
    if len(small) < th.SMALL_DMA_MIN_TRANSFERS:
        return []
    bw = dma_bandwidth(trace.hardware_figures)
    if not bw:
        big = dma[dma["bytes"] / parts >= th.SMALL_DMA_BYTES_PER_PARTITION]
        bw = float((big["bytes"] / big["dur"].clip(lower=1)).max()) * 1e9 if len(big) else 0.0
    ideal = small["bytes"].to_numpy(np.float64) / bw * 1e9 if bw else 0.0
    lost = float(np.clip(small["dur"].to_numpy(np.float64) - ideal, 0, None).sum())
    if lost < th.SMALL_DMA_MIN_SHARE * step_time(trace):
        return []
    items = [evidence(r.ts, r.dur, [r.id], f"{int(r.bytes)} B transfer took {us(r.dur)}")
             for r in top(small, "dur").itertuples()]
    median = int(small["bytes"].median())
    return [make(
        trace, RULE_ID, f"{len(small)} small DMA transfers", lost, items,
        f"{len(small)} of {len(dma)} DMA transfers move less than "
        f"{th.SMALL_DMA_BYTES_PER_PARTITION} B per partition (median {median} B in all); each "
        "pays the fixed DMA cost, so bandwidth stays far below the peak.",
        "Make transfers larger: batch small tensors together (fewer, bigger ops), use larger "
        "tiles, and keep data resident in SBUF across ops instead of spilling to HBM.")]
