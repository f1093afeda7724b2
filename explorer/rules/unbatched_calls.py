"""Requests served a model call each: every call pays the host's launch of every op, and
the device runs kernels sized for one call's rows, where a call over several requests'
rows launches once for all of them.

A classifier served one request a call was told to compile (422 us a request) and, in a
clause, to "batch more requests"; one batch of its 16 queued requests saved 626 us a
request, 1.5x the figure it was given, and no finding stated it. What batching saves is
the run replayed with `BATCH` calls at a time as one call over their rows
(`what_if.batched_calls`). Only inference runs whose analysed steps are each one model call
on its own requests (the `eval` phase: no generation, whose calls depend on the one before)
are replayed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from neuron_explorer.analyses.phases import EVAL, model_calls
from neuron_explorer.analyses.steady_state import analysed_steps
from neuron_explorer.common import trace_format as tf
from neuron_explorer.rules import host_bound
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make, step_time, trains, us
from neuron_explorer.what_if.batched_calls import batched_saving_ns, call_rows

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "unbatched_calls"
# calls batched into one in the replay: a batch a server fills from its queue (a compiled
# program is built that much larger as it is recorded)
BATCH = tf.BATCHED_CALLS


def check(trace: Trace) -> list[Finding]:
    steps = analysed_steps(trace).steps
    if trains(trace) or len(steps) < 4:
        return []
    phases = trace.phases()
    if not len(phases) or set(phases.loc[phases["step"].isin(steps), "phase"]) != {EVAL}:
        return []
    k = min(BATCH, len(steps))
    saving = batched_saving_ns(trace, k)
    if saving is None or saving < th.UNBATCHED_CALLS_MIN_SHARE * step_time(trace):
        return []
    rows = call_rows(trace)
    # a call of one row serves one request; a call of many already batches, and the fix is
    # a larger batch (a server of 8 a call was told to batch "up to 4")
    single = rows == 1
    batch = (f"batches of up to {k} requests" if single else
             f"calls of up to {k * rows} rows ({k} of today's calls)" if rows else
             f"calls of {k} times today's rows")
    title = (f"Requests served a model call each ({len(steps)} calls)" if single else
             f"Model calls of {rows} rows each ({len(steps)} calls)" if rows else
             f"Model calls served one at a time ({len(steps)} calls)")
    calls = model_calls(trace)
    calls = calls[calls["step"].isin(steps)]
    compiled = host_bound.is_compiled(trace)
    lowered = ("each op lowered again at the larger shapes, each compiled graph's program "
               "built again by the backend over them" if compiled else
               "each op lowered again at the larger shapes")
    dynamic = (" A compiled model meets a new batch size with a recompile: pad each batch "
               "to one size, or mark its batch dim dynamic "
               "(torch._dynamo.mark_dynamic(x, 0)) so one graph serves every size."
               if compiled else "")
    overlap = "" if not host_bound.is_host_bound(trace) else (
        " The host-bound finding's advice for this compiled model is this batching: this is "
        "its saving, replayed (its own figure counts the device's idle gaps only)."
        if compiled else
        " Compiling (the host-bound finding's fix) and reading results less often cut "
        "some of the same launches and reads: those savings overlap with this one "
        "rather than add.")
    items = [evidence(int(r.ts), int(r.end - r.ts), [int(r.id)],
                      f"the model's call in step {int(r.step)}, one of {len(steps)}")
             for r in calls.head(th.MAX_EVIDENCE).itertuples()]
    return [make(
        trace, RULE_ID, title, saving, items,
        f"Each of the {len(steps)} analysed calls runs every op of the model for "
        + ("its own request" if single else f"{rows} rows" if rows else "its own rows")
        + ": the host launches each op once a call, and the device runs kernels sized for "
        f"one call. Replayed with {k} calls at a time as one call over their rows ({lowered}; "
        "the other calls' launches, host time inside the "
        f"model and reads of results gone), the calls take {us(saving)} less, "
        f"{us(saving / len(steps))} a call today." + overlap,
        f"Serve {batch}: stack the queued requests' inputs (torch.stack or torch.cat; "
        "inputs of different lengths padded to one length with an attention mask, or "
        "requests of one length batched together) and call the model once, then read the "
        "results once a batch (outputs.argmax(-1).tolist()). Requests that arrive over time "
        f"wait for their batch: take what is queued, up to {k} calls' worth or a latency "
        "bound (dynamic batching)." + dynamic,
        saving_basis=f"replay: the run replayed with {k} calls at a time as one call over "
                     f"their rows, {lowered}")]
