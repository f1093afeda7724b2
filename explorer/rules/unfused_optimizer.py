"""An optimizer that has `fused=True` and runs without it: its foreach step launches a
pass over every parameter per formula term (AdamW: eight a step), where the fused step is
one kernel.

A user's compiled transformer spent 28% of its step there, host-paced: each pass is a
launch the host pays for. No finding said so (short_kernel_sequence claimed 114 us for
every sequence it saw, the optimizer's among them; fused=True saved 317 us a step).

What it saves is the run replayed with each optimizer step one launch of the fused kernel
(`what_if.fused_optimizer`). Where host_bound leads with the optimizer's fix on a compiled
model, its saving counts fused=True's; where the optimizer is built anew every step,
optimizer_recreated's fix comes first. Elsewhere this finding states fused=True's saving,
and memory_bound_ops leaves it out of its own: an eager DDP run's AdamW passes were 51%
of its step, named only inside the host-bound finding's text (its headline the compiled
replay's 846 us a step, fused=True's 2.84 ms in none).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from neuron_explorer.analyses.step_breakdown import counted_steps
from neuron_explorer.rules import host_bound, optimizer_recreated
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make, step_time, top, us
from neuron_explorer.what_if.counterfactual import first_step_extra_ns

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace
    from neuron_explorer.what_if.fused_optimizer import FusedOptimizerSaving

RULE_ID = "unfused_optimizer"


def states_the_saving(trace: Trace) -> FusedOptimizerSaving | None:
    """fused=True's replayed saving where this finding states it (None: no finding here)."""
    from neuron_explorer.what_if.fused_optimizer import fused_optimizer_saving

    fused = fused_optimizer_saving(trace)
    if fused is None or not fused.step_ns:
        return None
    # judged without the first step's one-time cost: a longer run pays it once too
    if fused.step_ns + fused.state_steps_ns < th.UNFUSED_OPTIMIZER_MIN_SHARE * step_time(trace):
        return None
    if len(optimizer_recreated.remade_state(trace)[0]) or (
            host_bound.advises_the_optimizer(trace) and host_bound.is_compiled(trace)):
        return None
    return fused


def check(trace: Trace) -> list[Finding]:
    from neuron_explorer.what_if.fused_optimizer import optimizer_steps

    fused = states_the_saving(trace)
    if fused is None:
        return []
    names = "/".join(fused.optimizers)
    saved = float(fused.step_ns or 0)
    steps = max(counted_steps(trace), 1)
    # the first step makes the optimizer's state (SGD's momentum buffers copied from the
    # gradients): fused=True does that in its kernel, a saving made once; what it costs
    # once more is the step counters' (the text names them as its cause)
    once = max(first_step_extra_ns(trace, "fused optimizer"), 0.0) - fused.state_steps_ns
    calls = optimizer_steps(trace)  # not None: the saving was replayed over them
    items = [evidence(r.ts, r.dur, [r.id], f"{r.name} (step {r.step}): {fused.passes} "
                      f"passes over the parameters, {us(r.dur)} of host time")
             for r in top(calls, "dur").itertuples()]
    return [make(
        trace, RULE_ID, f"{names}'s step runs unfused: {fused.passes} passes a step"
        + (f", one op per parameter in each ({fused.passes * fused.parameters} ops)"
           if fused.single_tensor else ""),
        saved, items,
        f"Each {names}.step runs {fused.passes} passes over the parameters ("
        + (f"one op per term and each of its {fused.parameters} parameters: the single-tensor "
           "implementation, which foreach=False selects, and so does fused=False passed "
           "explicitly, as it turns PyTorch's default of foreach off; "
           if fused.single_tensor else
           "the foreach implementation, PyTorch's default: a kernel per formula term; with "
           "foreach=False, one per term and parameter; ")
        + "each a launch the host issues and a read and write of the parameters on the "
        "device). "
        f"fused=True runs the update as one kernel: replayed so, the analysed steps take "
        f"{us(saved)} less, {us((saved - once) / steps)} a step"
        + (f" and {us(once)} more in the first, where the optimizer's state is made"
           if once > 0 else "")
        + (f", the first of them {us(-once)} less: there fused=True makes each "
           "parameter's step counter on the device (an empty and a zero_ apiece: a foreach "
           "step keeps them on the host)" if once < 0 else "")
        + f", {us(fused.device_ns / steps)} a step of it device time."
        + (f" With zero_grad(set_to_none=False), fused=True also zeroes the {fused.zeroed} "
           f"gradients in one op instead of one op each: {us(fused.zeroing_step_ns / steps)} "
           "a step of the saving (set_to_none=True drops that zeroing instead)."
           if fused.zeroed else "")
        + (" This is part of the host-bound finding's saving, not beside it: that finding's "
           "replay fuses the optimizer's step too, with the eager ops it brings into the "
           "graphs, so the two savings overlap rather than add."
           if host_bound.counts_the_fused_optimizer(trace) else ""),
        f"Construct the optimizer with fused=True ({names}(params, ..., fused=True)). "
        + host_bound.COMPILED_STEP_CAVEAT,
        symptom_ns=saved, once_ns=once,
        saving_basis="replay: the run replayed with each optimizer step one launch of the "
                     "fused kernel")]
