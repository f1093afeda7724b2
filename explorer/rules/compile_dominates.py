"""Compile time dominating the recorded run (its share is of the run, not of a step)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from neuron_explorer.analyses.compilation import compiled_what
from neuron_explorer.analyses.steady_state import analysed_steps
from neuron_explorer.device_terms import device_terms
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make
from neuron_explorer.units import duration

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "compile_dominates"
# what its share of time is of: its time lies outside the analysed steps
SHARE_BASE = "the run"


def check(trace: Trace) -> list[Finding]:
    cs = trace.compile_summary()
    total = int(cs["totals"]["compile_ns"].iloc[0])
    span = trace.summary()["span_ns"]
    if not total or not span or total < th.COMPILE_DOMINANT_SHARE * span:
        return []
    graphs = cs["graphs"].sort_values("dur", ascending=False)
    items = [evidence(r.ts, r.dur, [], f"graph {r.graph_id} ({r.name}) compiled in "
                      f"{duration(r.dur)}") for r in graphs.itertuples()]
    items += [evidence(r.ts, r.dur, [], f"NKI kernel {r.name} compiled in {duration(r.dur)}")
              for r in cs["kernels"].sort_values("dur", ascending=False).itertuples()]
    totals = cs["totals"].iloc[0]
    churn = " and ".join(what for what, n in (("recompiles", totals["recompiles"]),
                                               ("graph breaks", totals["graph_breaks"])) if n)
    selection = analysed_steps(trace)
    return [make(
        trace, RULE_ID, f"Compilation takes {total / span:.0%} of the run", total, items,
        f"{compiled_what(totals)} took {duration(total)} to compile out of a "
        f"{duration(span)} run: the steps recorded are too few to pay it back. The per-step "
        f"figures leave it out: they use {selection.describe()}.",
        "Run many steps per compile: "
        + ("record after the warm-up (neuron-explorer record --steps START:STOP)"
           if device_terms(trace.metadata).recorded_here else
           "profile after the warm-up (torch.profiler.schedule(wait=..., warmup=...))")
        + " and cache compiled graphs between runs"
        + (f"; remove the {churn} that multiply compile work." if churn else "."),
        share_of=span, saving_basis="the compile time itself: a run that reuses its compiled "
                                    "graphs (a warm cache, more steps per compile) pays it "
                                    "once or not at all")]

