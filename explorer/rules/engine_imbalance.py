"""One engine saturated while the other compute engines idle."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from neuron_explorer.analyses.engine_utilisation import engine_busy_totals
from neuron_explorer.analyses.phases import in_analysed_work
from neuron_explorer.common.trace_format import ENGINES
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, make, step_time, us
from neuron_explorer.rules.host_bound import device_saving

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "engine_imbalance"
ADVICE = {
    "tensor": "the Tensor Engine is the bottleneck: cut matmul work (bf16 or fp8, fewer "
              "recomputations) or overlap more vector/scalar work with it",
    "vector": "move elementwise work off the Vector Engine: fuse it into matmul epilogues, "
              "use activations that run on the Scalar Engine, or cut redundant copies/casts",
    "scalar": "activations saturate the Scalar Engine, which runs every activation function "
              "at one element a cycle per lane whatever the function (and, before trn3, the "
              "dtype): compute fewer of them (drop redundant ones, apply one to a smaller "
              "tensor before a broadcast or an expansion); on trn3, bf16 doubles the lanes",
    "gpsimd": "gathers/scatters/iota saturate GpSimd: replace index ops with dense "
              "equivalents (one-hot matmul, precomputed indices)",
}


def check(trace: Trace) -> list[Finding]:
    totals = engine_busy_totals(trace, analysed=True)
    totals = totals[totals["engine"].isin(ENGINES)]
    total = step_time(trace)
    if not len(totals) or total <= 0:
        return []
    findings = []
    for device, part in totals.groupby("device"):
        util = part.set_index("engine")["busy_ns"].reindex(ENGINES, fill_value=0) / total
        top = util.idxmax()
        others = util.drop(top)
        if util[top] < th.ENGINE_SATURATED or (others > th.ENGINE_IDLE).any():
            continue
        shorter = _kernel_saving(trace, int(device), str(top))
        saving = device_saving(trace, shorter)
        findings.append(make(
            trace, RULE_ID, f"{top.capitalize()} Engine saturated while others idle "
            f"(device {device})", saving.time_lost_ns, [],
            f"On device {device} the {top} engine is busy {util[top]:.0%} of the step while "
            + ", ".join(f"{e} {u:.0%}" for e, u in others.items())
            + f". Were its work in each kernel cut to the next busiest engine's (or the "
            f"DMA's), the kernels would take {us(shorter)} less: an upper bound, which the "
            "advice below reaches only as far as it cuts that engine's work (no replay "
            "measures it)." + saving.note,
            ADVICE[top] + ".", symptom_ns=shorter,
            saving_basis="estimate: at most, the engine's work in each kernel cut to the next "
                         "busiest engine's; " + saving.basis,
            after=saving.after))
    return findings


def _kernel_saving(trace: Trace, device: int, engine: str) -> float:
    """Device time the analysed kernels on `device` would save if `engine` did no more
    work in each than its next busiest engine or DMA queue (which then bounds the
    kernel): a kernel bound by another engine saves nothing."""
    k = in_analysed_work(trace, trace.kernels)
    k = k[k["device"].to_numpy() == device]
    if not len(k):
        return 0.0
    busy = k[f"busy_{engine}"].to_numpy(float)
    rest = np.max([k[f"busy_{e}"].to_numpy(float) for e in (*ENGINES, "dma") if e != engine],
                  axis=0)
    return float(np.clip(np.minimum(busy - rest, k["dur"].to_numpy(float) - rest), 0,
                         None).sum())
