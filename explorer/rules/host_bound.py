"""Host-bound device: the device idles between kernels because the host launches too slowly."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
from neuron_explorer.analyses.startup import startup_gaps
from neuron_explorer.device_terms import device_terms
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, is_inference, make, step_time, top, us

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "host_bound"


def launch_gaps(trace: Trace) -> pd.DataFrame:
    """The gaps in which the device waited for the host to launch, less the one-time
    start-up ones (`startup_gaps`): those a faster host would save on every step."""
    gaps = trace.idle_reasons()
    host = gaps[gaps["reason"] == "host_launch"]
    startup = startup_gaps(trace)
    return host[~host["next_slice_id"].isin(startup["next_slice_id"])] if len(startup) else host


def is_host_bound(trace: Trace) -> bool:
    """Whether the device mostly waits on the host to launch (this rule fires)."""
    lost = float(launch_gaps(trace)["dur"].sum())
    return lost > 0 and lost >= th.HOST_BOUND_MIN_SHARE * step_time(trace)


def prerequisite(trace: Trace) -> str:
    """For a rule whose saving is device time: the rule whose fix must come first (this
    one, on a host-bound run; "" otherwise), for `Finding.after`."""
    return RULE_ID if is_host_bound(trace) else ""


def device_time_note(trace: Trace) -> str:
    """For a rule whose time lost is device time: on a host-bound run that time does not
    shorten the step until the host launches faster (empty when the run is not host-bound)."""
    if not is_host_bound(trace):
        return ""
    return (" The run is host-bound now, so this is device time rather than step time: "
            "after you fix the host-bound issue, this is next.")


def check(trace: Trace) -> list[Finding]:
    host = launch_gaps(trace)
    lost = float(host["dur"].sum())
    if not is_host_bound(trace):
        return []
    names = trace.table("slices")["name"].to_numpy()
    items = [evidence(r.ts, r.dur, [r.next_slice_id],
                      f"device idle {us(r.dur)} until the host launched {names[r.next_slice_id]}")
             for r in top(host, "dur").itertuples()]
    median = float(host["dur"].median())
    return [make(
        trace, RULE_ID, f"Device waits on the host to launch work ({len(host)} gaps)", lost, items,
        f"In {len(host)} gaps (median {us(median)}) the next kernel was launched only after the "
        "device had gone idle: the host spends longer issuing each op than the device spends "
        "running it, so the device is starved.",
        _recommendation(trace),
        saving_basis="critical path: the host sets the step's length, and a host that kept "
                     "the device fed would save these gaps (one-time start-up gaps left out)")]


def _recommendation(trace: Trace) -> str:
    """Fewer, larger launches, in the terms of what the script already does."""
    cs = trace.compile_summary()
    # a --steps window may leave the compile spans out: the graph launches still say it
    compiled = len(cs["graphs"]) > 0 or bool((trace.ops["graph_id"] >= 0).any())
    breaks = ("remove the graph breaks that leave eager ops between graphs, "
              if len(cs["graph_breaks"]) else "")
    inference = is_inference(trace)
    batch = ("batch more requests into each call of the model" if inference else
             "increase the batch size")
    if compiled:
        return (f"The model is already compiled: {batch} so each launch does more work, "
                f"{breaks}and keep Python work (logging, metric math) out of the hot loop.")
    what = "the model" if inference else "the model or the training step"
    terms = device_terms(trace.metadata)
    return (f"Launch fewer, larger kernels: wrap {what} in {terms.compile_call} so ops fuse "
            f"into a few kernels per graph, or {batch} so each launch does more work; keep "
            "Python work (logging, metric math) out of the hot loop." + terms.launch_remedy
            + (_predicted_compile(trace) if terms.recorded_here else ""))


def _predicted_compile(trace: Trace) -> str:
    """What a compiled what-if replay predicts for the step time (traces with op keys)."""
    from neuron_explorer.whatif_replay import predicted_step_ns, prediction_too_large

    predicted = predicted_step_ns(trace, "compiled")
    recorded = float(trace.steps["dur"].median()) if len(trace.steps) else 0.0
    if predicted is None and prediction_too_large(trace, "compiled"):
        return (" `neuron-explorer whatif TRACE --mode compiled` replays the run compiled and "
                "gives the step it predicts (its programs are too large to predict here, "
                "while the report waits).")
    if predicted is None or not recorded:
        return ""
    return (f" A compiled what-if replay predicts a step of {us(predicted)} instead of "
            f"{us(recorded)} ({recorded / max(predicted, 1):.1f}x; `neuron-explorer whatif "
            "TRACE --mode compiled`).")
