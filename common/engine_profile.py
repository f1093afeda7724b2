"""How busy a kernel's engines were: per engine (DMA: the union of its queues), how much
DMA overlapped compute, and the engine busy longest. Shared by the NKI runner's own
profile and the explorer's kernel profile, so both read the same."""

from __future__ import annotations

import numpy as np
from neuron_explorer.common.intervals import Union
from neuron_explorer.common.trace_format import ENGINE_DMA, ENGINES

ENGINE_COLUMNS = (*ENGINES, ENGINE_DMA)


def engine_profile(engine: np.ndarray, start: np.ndarray, end: np.ndarray,
                   duration: int) -> dict:
    """Busy % per engine (DMA: the union of its queues), how much of the DMA time
    overlaps compute, and the engine busiest for longest (the critical one)."""
    busy = {}
    unions = {}
    for e in ENGINE_COLUMNS:
        keep = engine == e
        unions[e] = Union(start[keep], end[keep])
        busy[e] = unions[e].total
    compute = Union.of(*[(unions[e].starts, unions[e].ends) for e in ENGINES])
    both = Union.of((compute.starts, compute.ends), (unions["dma"].starts, unions["dma"].ends))
    overlap = compute.total + unions["dma"].total - both.total
    duration = max(int(duration), 1)
    return {"busy_pct": {e: 100.0 * v / duration for e, v in busy.items()},
            "dma_compute_overlap_pct": 100.0 * overlap / max(unions["dma"].total, 1),
            "critical_engine": max(busy, key=busy.__getitem__)}
