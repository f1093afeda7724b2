"""Small DMA transfers: the fixed cost of each transfer (generating its descriptors, then
trigger to first byte) dominates its time."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from neuron_explorer.common.intervals import Union
from neuron_explorer.peaks import dma_bandwidth, dma_fixed_text, partitions
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make, step_time, top, us
from neuron_explorer.rules.host_bound import device_saving
from neuron_explorer.tables import map_unique

if TYPE_CHECKING:
    import pandas as pd
    from neuron_explorer.trace import Trace

RULE_ID = "small_dma"


def _engine_bandwidth(trace: Trace) -> float | None:
    """Bytes/ns of one DMA engine: transfers are spread over the engines."""
    figures = trace.hardware_figures or {}
    bw = dma_bandwidth(figures)
    return bw / 1e9 / int(figures.get("dma_engines") or 16) if bw else None


def _small(dma: pd.DataFrame, per_engine: float | None, parts: int) -> np.ndarray:
    """Transfers that run below half an engine's bandwidth (fixed cost, short rows); with no
    hardware figures, those under 4 KiB per partition."""
    nbytes = dma["bytes"].to_numpy(np.float64)
    if per_engine:
        ideal = nbytes / per_engine
        return dma["dur"].to_numpy(np.float64) > th.SMALL_DMA_SLOWDOWN * ideal
    return nbytes / parts < th.SMALL_DMA_BYTES_PER_PARTITION


def _time_lost(trace: Trace, small: pd.DataFrame, per_engine: float | None) -> float:
    """The part of the small transfers' fixed cost the device cannot hide: their time with no
    compute engine busy, scaled by the share of that time that is fixed cost."""
    dur = small["dur"].to_numpy(np.float64)
    ideal = small["bytes"].to_numpy(np.float64) / per_engine if per_engine else 0.0
    overhead_share = float(np.clip(dur - ideal, 0, None).sum() / max(dur.sum(), 1.0))
    ins = trace.instructions
    compute = ins[~map_unique(ins["engine"], lambda e: str(e).startswith("dma"), bool)]
    exposed = 0
    for device, s in small.groupby("device"):
        c = compute[compute["device"] == device]
        s_ends = s["ts"].to_numpy() + s["dur"].to_numpy()
        c_ends = c["ts"].to_numpy() + c["dur"].to_numpy()
        busy = Union(c["ts"].to_numpy(), c_ends)
        both = Union.of((s["ts"].to_numpy(), s_ends), (c["ts"].to_numpy(), c_ends))
        exposed += both.total - busy.total
    return exposed * overhead_share


def check(trace: Trace) -> list[Finding]:
    ins = trace.instructions
    if not len(ins):
        return []
    on_dma = map_unique(ins["engine"], lambda e: str(e).startswith("dma"), bool)
    dma = ins[on_dma | (ins["kind"].to_numpy() == "dma")]
    dma = dma[dma["bytes"] > 0]
    per_engine = _engine_bandwidth(trace)
    small = dma[_small(dma, per_engine, partitions(trace.hardware_figures))]
    if len(small) < th.SMALL_DMA_MIN_TRANSFERS:
        return []
    lost = _time_lost(trace, small, per_engine)
    if lost < th.SMALL_DMA_MIN_SHARE * step_time(trace):
        return []
    items = [evidence(r.ts, r.dur, [r.id], f"{int(r.bytes)} B transfer took {us(r.dur)}")
             for r in top(small, "dur").itertuples()]
    median = int(small["bytes"].median())
    saving = device_saving(trace, lost)
    return [make(
        trace, RULE_ID, f"{len(small)} small DMA transfers", saving.time_lost_ns, items,
        f"{len(small)} of {len(dma)} DMA transfers (median {median} B) spend most of their "
        f"time on the fixed cost of a transfer{dma_fixed_text(trace.hardware_figures)} rather "
        "than moving data: they are too "
        f"small, or their rows are shorter than {th.SMALL_DMA_BYTES_PER_PARTITION} B per "
        "partition. The time counted is when the device does nothing but these transfers."
        + saving.note,
        "Make transfers larger: batch small tensors together (fewer, bigger ops), use larger "
        "tiles, and keep data resident in SBUF across ops instead of spilling to HBM.",
        symptom_ns=lost, saving_basis=saving.basis, after=saving.after)]
