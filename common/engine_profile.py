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


# The opcodes of an SBUF spill's store and reload (backend/hardware/spills.py)
SPILL_OPCODES = ("DmaSpill", "DmaReload")


def spill_profile(engine: np.ndarray, opcode: np.ndarray, nbytes: np.ndarray,
                  start: np.ndarray, end: np.ndarray) -> dict:
    """What SBUF spills cost a kernel: the bytes its spill stores and reloads move
    (`spill_bytes`), how many are reloads (`reload_bytes`), and the time they run while
    no compute engine works (`spill_ns`: the compute engines wait for the reloads, or
    for the space the stores free)."""
    spill = np.isin(opcode, SPILL_OPCODES)
    if not spill.any():
        return {"spill_bytes": 0, "reload_bytes": 0, "spill_ns": 0}
    compute = np.isin(engine, ENGINES)
    alone = Union(start[spill], end[spill])
    busy = Union(start[compute], end[compute])
    both = Union.of((alone.starts, alone.ends), (busy.starts, busy.ends))
    return {"spill_bytes": int(nbytes[spill].sum()),
            "reload_bytes": int(nbytes[opcode == SPILL_OPCODES[1]].sum()),
            "spill_ns": both.total - busy.total}
