"""Memory-bound ops: low arithmetic intensity (below the roofline ridge) or DMA-dominated
kernels."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from neuron_explorer.analyses.phases import in_analysed_work
from neuron_explorer.common.trace_format import ENGINES
from neuron_explorer.device_terms import device_terms
from neuron_explorer.peaks import peak_flops
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make, step_time, top, us
from neuron_explorer.rules.host_bound import (
    compiled_device_saving_ns,
    compiled_saving_ns,
    counts_the_fused_optimizer,
    device_saving,
    is_compiled,
    is_host_bound,
)

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "memory_bound_ops"
# where no replay of the fixes applies (no op keys; compiled programs too large to replay
# while a report waits): the symptom, an upper bound that had read as a measured saving
# (twice what compiling saved a mixer MLP whose programs were too large)
ESTIMATE = ("estimate: at most, the memory-bound ops' time above the compute roof (no replay "
            "of the fixes); ")


def check(trace: Trace) -> list[Finding]:
    rf = trace.roofline()
    k = in_analysed_work(trace, trace.kernels)
    lost = 0.0
    lines = []
    if len(rf):
        mem = rf[(rf["bound"] == "memory") & (rf["dur"] > 0) & (rf["flops"] > 0)
                 & ~rf["name"].isin(_fallback_names(trace))]
        for r in mem.itertuples():
            peak = peak_flops(trace.hardware_figures, r.dtype or "bfloat16") or 0
            ideal = r.flops / peak * 1e9 if peak else 0.0
            lost += max(r.dur - ideal, 0.0)
            intensity = r.flops / max(r.bytes, 1)
            line = (f"{r.name} ({r.dtype or 'dtype?'}): {intensity:.3g} FLOP/byte, "
                    f"ridge {r.ridge:.3g}, {us(r.dur)} on the device")
            lines.append((r.dur, line))
    dma_heavy = np.zeros(len(k), bool)
    if len(k):
        compute = sum(k[f"busy_{e}"].to_numpy() for e in ENGINES)
        dma_heavy = (k["kind"].to_numpy() == "kernel") & (compute > 0) & (
            k["busy_dma"].to_numpy() >= th.DMA_DOMINATED_RATIO * compute)
        if not len(rf) or not lines:
            lost += float(k.loc[dma_heavy, "dur"].sum())
    fixes = _replayed_fixes(trace)
    host_bound = is_host_bound(trace)
    # a fix replayed whole states the step time it saves; on a host-bound run compiling is
    # host_bound's fix, whose replayed saving holds the device work it fuses (counted here
    # too, an eager transformer's claim was 6x what fused=True then saved), and this finding
    # states the device time its other fixes save after that one
    stepwise = [f for f in fixes or () if f.step_ns is not None and not host_bound]
    device_ns = lost if fixes is None else sum(
        f.device_ns for f in fixes if f not in stepwise and not (host_bound and f.compiles))
    saving = device_saving(trace, device_ns)
    claimed = saving.time_lost_ns + sum(f.step_ns or 0.0 for f in stepwise)
    # without a replay the rule fires on the symptom, as it always did
    shown = lost if fixes is None else claimed
    if shown < th.MEMORY_BOUND_MIN_SHARE * step_time(trace) or shown <= 0:
        return []
    heavy = k[dma_heavy].sort_values("dur", ascending=False)
    items = [evidence(r.ts, r.dur, [r.id], f"kernel {r.name}: DMA {us(r.busy_dma)} vs compute "
                      f"{us(r.busy_tensor + r.busy_vector + r.busy_scalar + r.busy_gpsimd)}")
             for r in top(heavy).itertuples()]
    lines.sort(key=lambda x: -x[0])
    return [make(
        trace, RULE_ID, "Memory-bound ops dominate device time", claimed, items,
        "These ops move more bytes per FLOP than the hardware can feed its engines, so they "
        "run at memory speed: " + "; ".join(t for _, t in lines[:5])
        + (f"; {int(dma_heavy.sum())} kernels spend at least {th.DMA_DOMINATED_RATIO:g}x more "
           "time in DMA than computing" if dma_heavy.any() else "") + "."
        + _replayed_sentence(fixes, lost, host_bound) + (saving.note if device_ns else ""),
        _recommendation(fixes), symptom_ns=lost,
        saving_basis=ESTIMATE + saving.basis if fixes is None else (
            "replay: " + " and ".join(f.basis for f in fixes
                                      if not (host_bound and f.compiles))
            + (f"; for the device time: {saving.basis}" if device_ns else "")),
        after=saving.after if device_ns else "")]


@dataclass(frozen=True)
class _Fix:
    """One fix this rule advises, with the device time its replay saves."""

    device_ns: float
    step_ns: float | None  # the step time its replay saves, where it replays the steps whole
    advice: str  # the recommendation's sentence
    replayed: str  # what the replay found, for the explanation
    basis: str  # for `Finding.saving_basis`
    compiles: bool = False  # the fix is compiling the model (host_bound's on a host-bound run)


def _replayed_fixes(trace: Trace) -> list[_Fix] | None:
    """The advised fixes a replay of this recording can apply, each with the device time
    it saves (and the step time, where its replay gives one); None for a trace no replay
    applies to (not recorded by this backend, a prediction the rules do not replay, no op
    keys, or programs too large to replay while a report waits), whose time lost stays the
    time above the compute roof. A compiled trace's graphs are fused already: only its
    optimizer is replayed."""
    from neuron_explorer.rules import unfused_optimizer
    from neuron_explorer.what_if.fused_optimizer import fused_optimizer_saving
    from neuron_explorer.what_if.replay import replayable

    if not replayable(trace) or not device_terms(trace.metadata).recorded_here:
        return None
    compiled = compiled_device_saving_ns(trace)
    if compiled is None and not is_compiled(trace):  # no op keys, or too large to replay
        return None
    fixes = []
    if compiled:
        steps = compiled_saving_ns(trace)
        fixes.append(_Fix(
            compiled, steps, "Compile the model (torch.compile): its elementwise chains fuse "
            "with their producers and stay on chip.",
            f"compiled, the replayed steps' device work takes {us(compiled)} less"
            + (f" and the steps {us(steps)} less (fused kernels, fewer launches)"
               if steps is not None else ""),
            "the steps replayed compiled", compiles=True))
    fused = fused_optimizer_saving(trace)
    if unfused_optimizer.states_the_saving(trace) is not None or \
            counts_the_fused_optimizer(trace):
        # that finding states fused=True's saving, or the host-bound one counts it (a
        # compiled MLP's host-bound fix was fused=True, and this finding claimed 1.98 ms
        # more for it "after" that fix, where it then saved nothing): not claimed twice
        fused = None
    if fused is not None and fused.device_ns > 0:
        names = "/".join(fused.optimizers)
        passes = f"{fused.passes} pass" + ("es" if fused.passes != 1 else "")
        fixes.append(_Fix(
            fused.device_ns, None, f"Pass fused=True to {names}: one kernel a step updates every "
            f"parameter, instead of {passes} over them.",
            f"{names} with fused=True updates the parameters in one kernel instead of "
            f"{passes}: {us(fused.device_ns)} less",
            "the optimizer steps replayed fused"))
    return fixes


def _replayed_sentence(fixes: list[_Fix] | None, above_roof: float, host_bound: bool) -> str:
    if not fixes:
        return ""
    return (f" Of the {us(above_roof)} these ops spend above the compute roof, the advised "
            "fixes save what their replays do: " + "; ".join(
                f.replayed + (" (the host-bound finding's fix: part of its saving, not "
                              "beside it)" if host_bound and f.compiles else "")
                for f in fixes) + ".")


def _recommendation(fixes: list[_Fix] | None) -> str:
    general = ("Raise arithmetic intensity: fuse elementwise chains into their producer "
               "matmul (torch.compile does this), avoid materialising intermediates (in-place "
               "ops, fused attention/softmax), use bf16 to halve bytes, and batch small ops "
               "together.")
    if not fixes:
        return general
    return " ".join(f.advice for f in fixes) + " Beyond these: " + general[0].lower() + \
        general[1:]


def _fallback_names(trace: Trace) -> set[str]:
    """Ops (and compiled graphs) that ran something on the host: their device time is the
    round trip to the host and back (`host_fallback`'s), not a memory-bound engine. A
    compiled graph with an FFT inside read 33 FLOP/byte and 340 us a step, 28.5 us once
    the FFT ran on the device."""
    ops = in_analysed_work(trace, trace.ops)
    if not len(ops) or "fallback" not in ops:
        return set()
    return set(ops.loc[ops["fallback"].astype(bool), "name"].astype(str))
