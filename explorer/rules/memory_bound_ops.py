"""Memory-bound ops: low arithmetic intensity (below the roofline ridge) or DMA-dominated
kernels."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from neuron_explorer.analyses.phases import in_analysed_work
from neuron_explorer.common.trace_format import ENGINES
from neuron_explorer.peaks import peak_flops
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make, step_time, top, us
from neuron_explorer.rules.host_bound import device_saving

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "memory_bound_ops"


def check(trace: Trace) -> list[Finding]:
    rf = trace.roofline()
    k = in_analysed_work(trace, trace.kernels)
    lost = 0.0
    lines = []
    if len(rf):
        mem = rf[(rf["bound"] == "memory") & (rf["dur"] > 0) & (rf["flops"] > 0)
                 & ~rf["name"].isin(_fallback_names(trace))]
        for r in mem.itertuples():
            peak = peak_flops(trace.hardware_figures, r.dtype or "bfloat16") or 0
            ideal = r.flops / peak * 1e9 if peak else 0.0
            lost += max(r.dur - ideal, 0.0)
            intensity = r.flops / max(r.bytes, 1)
            line = (f"{r.name} ({r.dtype or 'dtype?'}): {intensity:.3g} FLOP/byte, "
                    f"ridge {r.ridge:.3g}, {us(r.dur)} on the device")
            lines.append((r.dur, line))
    dma_heavy = np.zeros(len(k), bool)
    if len(k):
        compute = sum(k[f"busy_{e}"].to_numpy() for e in ENGINES)
        dma_heavy = (k["kind"].to_numpy() == "kernel") & (compute > 0) & (
            k["busy_dma"].to_numpy() >= th.DMA_DOMINATED_RATIO * compute)
        if not len(rf) or not lines:
            lost += float(k.loc[dma_heavy, "dur"].sum())
    if lost < th.MEMORY_BOUND_MIN_SHARE * step_time(trace) or lost <= 0:
        return []
    saving = device_saving(trace, lost)
    heavy = k[dma_heavy].sort_values("dur", ascending=False)
    items = [evidence(r.ts, r.dur, [r.id], f"kernel {r.name}: DMA {us(r.busy_dma)} vs compute "
                      f"{us(r.busy_tensor + r.busy_vector + r.busy_scalar + r.busy_gpsimd)}")
             for r in top(heavy).itertuples()]
    lines.sort(key=lambda x: -x[0])
    return [make(
        trace, RULE_ID, "Memory-bound ops dominate device time", saving.time_lost_ns, items,
        "These ops move more bytes per FLOP than the hardware can feed its engines, so they "
        "run at memory speed: " + "; ".join(t for _, t in lines[:5])
        + (f"; {int(dma_heavy.sum())} kernels spend at least {th.DMA_DOMINATED_RATIO:g}x more "
           "time in DMA than computing" if dma_heavy.any() else "") + "." + saving.note,
        "Raise arithmetic intensity: fuse elementwise chains into their producer matmul "
        "(torch.compile does this), avoid materialising intermediates (in-place ops, fused "
        "attention/softmax), use bf16 to halve bytes, and batch small ops together.",
        symptom_ns=lost, saving_basis=saving.basis, after=saving.after)]


def _fallback_names(trace: Trace) -> set[str]:
    """Ops (and compiled graphs) that ran something on the host: their device time is the
    round trip to the host and back (`host_fallback`'s), not a memory-bound engine. A
    compiled graph with an FFT inside read 33 FLOP/byte and 340 us a step, 28.5 us once
    the FFT ran on the device."""
    ops = in_analysed_work(trace, trace.ops)
    if not len(ops) or "fallback" not in ops:
        return set()
    return set(ops.loc[ops["fallback"].astype(bool), "name"].astype(str))
