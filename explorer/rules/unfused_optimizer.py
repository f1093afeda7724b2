"""An optimizer that has `fused=True` and runs without it: its foreach step launches a
pass over every parameter per formula term (AdamW: eight a step), where the fused step is
one kernel.

A user's compiled transformer spent 28% of its step there, host-paced: each pass is a
launch the host pays for. No finding said so (short_kernel_sequence claimed 114 us for
every sequence it saw, the optimizer's among them; fused=True saved 317 us a step).

What it saves is the run replayed with each optimizer step one launch of the fused kernel
(`what_if.fused_optimizer`). Where memory_bound_ops fires, or host_bound with the
optimizer's fix first, their fix includes fused=True and counts this saving; where the
optimizer is built anew every step, optimizer_recreated's fix comes first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from neuron_explorer.analyses.steady_state import analysed_steps
from neuron_explorer.rules import host_bound, memory_bound_ops, optimizer_recreated
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make, step_time, top, us

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "unfused_optimizer"


def check(trace: Trace) -> list[Finding]:
    from neuron_explorer.what_if.fused_optimizer import fused_optimizer_saving, optimizer_steps

    fused = fused_optimizer_saving(trace)
    if fused is None or not fused.step_ns:
        return []
    if fused.step_ns < th.UNFUSED_OPTIMIZER_MIN_SHARE * step_time(trace):
        return []
    if (len(optimizer_recreated.remade_state(trace)[0]) or host_bound.advises_the_optimizer(trace)
            or memory_bound_ops.check(trace)):
        return []
    names = "/".join(fused.optimizers)
    steps = max(len(analysed_steps(trace).steps), 1)
    calls = optimizer_steps(trace)  # not None: the saving was replayed over them
    items = [evidence(r.ts, r.dur, [r.id], f"{r.name} (step {r.step}): {fused.passes} "
                      f"passes over the parameters, {us(r.dur)} of host time")
             for r in top(calls, "dur").itertuples()]
    return [make(
        trace, RULE_ID, f"{names}'s step runs unfused: {fused.passes} passes a step",
        fused.step_ns, items,
        f"Each {names}.step runs {fused.passes} passes over the parameters (the foreach "
        "implementation, PyTorch's default: a kernel per formula term, each a launch the "
        "host issues and a read and write of every parameter-sized list on the device). "
        f"fused=True runs the update as one kernel: replayed so, the analysed steps take "
        f"{us(fused.step_ns)} less, {us(fused.step_ns / steps)} a step, "
        f"{us(fused.device_ns / steps)} of it device time.",
        f"Construct the optimizer with fused=True ({names}(params, ..., fused=True)); or "
        "compile its step (mark each step with neuron_explorer.step() then: a compiled "
        "optimizer step ends no step in the recording).",
        symptom_ns=fused.step_ns,
        saving_basis="replay: the run replayed with each optimizer step one launch of the "
                     "fused kernel")]
