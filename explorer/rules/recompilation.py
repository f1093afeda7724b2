"""Graph breaks and recompilations inside the step, and recompilation storms."""

from __future__ import annotations

from typing import TYPE_CHECKING

from neuron_explorer.analyses.compilation import compile_spans
from neuron_explorer.analyses.intervals import Union
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "recompilation"


def check(trace: Trace) -> list[Finding]:
    cs = trace.compile_summary()
    breaks = cs["graph_breaks"]
    recompiles = cs["recompiles"]
    in_step_breaks = breaks[breaks["step"] >= 0] if len(trace.steps) else breaks
    in_step_rec = recompiles[recompiles["step"] >= 0] if len(trace.steps) else recompiles
    storm = len(recompiles) >= th.RECOMPILE_STORM
    if not len(in_step_breaks) and not len(in_step_rec) and not storm:
        return []
    spans = compile_spans(trace)
    lost = 0.0
    if len(trace.steps) and len(spans):
        u = Union(spans["ts"].to_numpy(), (spans["ts"] + spans["dur"]).to_numpy())
        st = trace.steps
        lost = float(u.covered(st["ts"].to_numpy(), (st["ts"] + st["dur"]).to_numpy()).sum())
    items = []
    for label, frame in (("graph break", in_step_breaks), ("recompile", in_step_rec)):
        for r in frame.itertuples():
            where = f" at {r.source}" if r.source else ""
            items.append(evidence(r.ts, 0, [r.id], f"{label}{where}: {r.reason or 'no reason'}"))
    reasons = sorted({r for r in list(in_step_breaks["reason"]) + list(in_step_rec["reason"]) if r})
    title = (f"Recompilation storm: {len(recompiles)} recompiles" if storm else
             f"{len(in_step_breaks)} graph breaks and {len(in_step_rec)} recompiles in steps")
    sources = sorted({s for s in list(in_step_breaks["source"]) + list(in_step_rec["source"]) if s})
    return [make(
        trace, RULE_ID, title, lost, items,
        "Graph breaks split the model into smaller graphs (more launches, less fusion, host "
        "work between graphs); recompiles rebuild graphs when guards fail (new shapes, dtypes "
        "or Python values). Reasons: " + ("; ".join(reasons[:5]) or "not recorded") + ".",
        ("Fix the graph breaks at " + ", ".join(sources[:3]) + "; " if sources else "")
        + "keep shapes static (pad or bucket sequence lengths) or mark dynamic dims with "
        "torch._dynamo.mark_dynamic / torch.compile(dynamic=True); avoid Python side effects "
        "and .item() inside compiled code.")]
