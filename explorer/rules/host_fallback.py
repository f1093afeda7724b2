"""Host fallback ops: ops with no device lowering that run on the host."""

from __future__ import annotations

from typing import TYPE_CHECKING

from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make, top, us

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "host_fallback"


def check(trace: Trace) -> list[Finding]:
    ops = trace.ops
    if not len(ops):
        return []
    fb = ops[ops["fallback"].astype(bool)]
    if len(fb) < th.FALLBACK_MIN_OPS:
        return []
    lost = float(fb["dur"].sum() + fb["device_dur"].sum())
    per_name = fb.groupby("name")["dur"].agg(["sum", "size"]).sort_values("sum", ascending=False)
    names = ", ".join(f"{n} ({c}x)" for n, (_, c) in per_name.iterrows())
    items = [evidence(r.ts, r.dur, [r.id], f"{r.name} ran on the host for {us(r.dur)}"
                      + (f" ({r.source})" if r.source else ""))
             for r in top(fb, "dur").itertuples()]
    worst = per_name.index[0]
    return [make(
        trace, RULE_ID, f"{len(fb)} ops fell back to the host", lost, items,
        f"These ops have no device lowering: {names}. Each one copies its inputs to the host, "
        "waits for the device, computes on the CPU and copies the result back.",
        f"Replace {worst} with ops the device supports (or express it with supported ops), or "
        "move it out of the training step (precompute it, or do it in the data pipeline).")]
