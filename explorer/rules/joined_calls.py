"""Calls of the model in one step on inputs that do not depend on each other's results:
classifier-free guidance's conditioned and unconditioned passes, a shared encoder run on
two inputs. Each call pays the host's launch of every op, and the device runs kernels
sized for one call's rows, where one call over the stacked inputs launches once.

A guided sampler ran its two passes a step apart, 38% of each sampling step that one
call over both saved, and no finding named it. What joining saves is the run replayed
with each step's independent calls as the first of them over all of their rows
(`what_if.batched_calls.joined_calls_saving_ns`); a pass that reads another's result (a
corrector's) stays apart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from neuron_explorer.analyses.phases import model_calls, model_name
from neuron_explorer.analyses.steady_state import analysed_steps
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make, step_time, us
from neuron_explorer.what_if.batched_calls import joined_calls_saving_ns

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "joined_calls"


def check(trace: Trace) -> list[Finding]:
    found = joined_calls_saving_ns(trace)
    if found is None:
        return []
    saving, calls_a_step = found
    if saving < th.JOINED_CALLS_MIN_SHARE * step_time(trace):
        return []
    steps = analysed_steps(trace).steps
    name = model_name(trace)
    calls = model_calls(trace)
    first = calls[calls["step"] == calls.loc[calls["step"].isin(steps), "step"].min()]
    items = [evidence(int(r.ts), int(r.end - r.ts), [int(r.id)],
                      f"`{name}`'s call {i + 1} of step {int(r.step)}")
             for i, r in enumerate(first.head(th.MAX_EVIDENCE).itertuples())]
    return [make(
        trace, RULE_ID,
        f"`{name}` called {calls_a_step} times a step on independent inputs",
        saving, items,
        f"In the analysed steps, `{name}` runs {calls_a_step} calls of the same ops whose "
        "inputs read none of the other calls' results (classifier-free guidance's "
        "conditioned and unconditioned passes, a shared encoder on two inputs): the host "
        "launches every op once a call, and the device runs kernels sized for one call's "
        f"rows. Replayed as one call over their rows stacked (each op lowered again at "
        f"{calls_a_step} times its rows; the other calls' launches and host time gone, an "
        "op kept for each input stacked and for the split of the result), the steps take "
        f"{us(saving)} less.",
        f"Stack the calls' inputs and call `{name}` once: out = {name}(torch.cat([x_a, "
        f"x_b]), torch.cat([c_a, c_b])), then out_a, out_b = out.chunk({calls_a_step}) (an "
        "input the calls share is repeated, torch.cat([x, x]); one that never changes, "
        "such as the empty condition's labels, is stacked once before the loop). Calls "
        "that read each other's results (a corrector's pass) stay apart.",
        saving_basis=f"replay: the run replayed with each step's {calls_a_step} "
                     "independent calls as one over their rows, each op lowered at the "
                     "larger shapes, an op a call kept for each input stacked and the "
                     "result's split")]
