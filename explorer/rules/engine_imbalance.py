"""One engine saturated while the other compute engines idle."""

from __future__ import annotations

from typing import TYPE_CHECKING

from neuron_explorer.analyses.engine_utilisation import engine_busy_totals
from neuron_explorer.common.trace_format import ENGINES
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, make, step_time

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "engine_imbalance"
ADVICE = {
    "tensor": "the Tensor Engine is the bottleneck: cut matmul work (bf16 or fp8, fewer "
              "recomputations) or overlap more vector/scalar work with it",
    "vector": "move elementwise work off the Vector Engine: fuse it into matmul epilogues, "
              "use activations that run on the Scalar Engine, or cut redundant copies/casts",
    "scalar": "activations saturate the Scalar Engine: fuse them, use cheaper activations "
              "(relu/gelu-tanh) or run them in bf16",
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
        second = float(others.max()) * total
        lost = (float(util[top]) * total - second) / 2
        findings.append(make(
            trace, RULE_ID, f"{top.capitalize()} Engine saturated while others idle "
            f"(device {device})", lost, [],
            f"On device {device} the {top} engine is busy {util[top]:.0%} of the step while "
            + ", ".join(f"{e} {u:.0%}" for e, u in others.items())
            + ". The time lost assumes half the imbalance could be shared out.",
            ADVICE[top] + "."))
    return findings
