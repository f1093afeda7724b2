"""Eager ops beside a compiled run's graphs, on a run its device paces: each launches
kernels of its own, which load their inputs from HBM and store their results back;
compiled with the graphs, their work fuses with each other's. On a host-bound run the
host_bound finding says so, counting the host's launches too."""

from __future__ import annotations

from typing import TYPE_CHECKING

from neuron_explorer.rules import host_bound
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make, step_time, top, trains, us

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "eager_beside_graphs"


def check(trace: Trace) -> list[Finding]:
    from neuron_explorer.what_if.into_graphs import (
        backward_seed,
        eager_launches,
        into_graphs_saving,
    )

    if (not len(trace.steps) or "graph_id" not in trace.ops or not host_bound.is_compiled(trace)
            or host_bound.is_host_bound(trace)):
        return []
    launches = eager_launches(trace)
    movable = launches.movable[~backward_seed(launches.movable)]
    if not len(launches.graphs) or not len(movable):
        return []
    # the optimizer's step left out: the unfused_optimizer finding claims what fusing saves
    into = into_graphs_saving(trace, optimizer=False)
    if into is None or into.saving_ns < th.EAGER_BESIDE_GRAPHS_MIN_SHARE * step_time(trace):
        return []
    steps = max(launches.graphs["step"].nunique(), 1)
    device = float(movable["device_dur"].fillna(0).sum())
    items = [evidence(r.ts, r.dur, [r.id], f"{r.name} at {r.source}: {us(r.device_dur)} on the "
                      "device, a kernel of its own")
             for r in top(movable.fillna({"device_dur": 0}), "device_dur").itertuples()]
    explanation = (
        f"{len(movable) / steps:.0f} ops a step ({_what(trace, movable)}; "
        "the optimizer's step left to its own finding) run as kernels of their own beside "
        f"the compiled graphs, {us(device / steps)} of device time a step, on a run the "
        "device paces: each loads its inputs from HBM and stores its results back. "
        "Compiled with the graphs, they run as one fused program after the graph they "
        "follow (what they hand each other stays on chip).")
    return [make(
        trace, RULE_ID, "Ops run eagerly beside the compiled graphs", into.saving_ns, items,
        explanation,
        host_bound.into_graphs_advice(trace, optimizer_told=False),
        symptom_ns=device, saving_basis=(
            f"{host_bound.INTO_GRAPHS}, the ops that join each graph as one program fused "
            "along their recorded data flow, run after it, and the zero gradients filled "
            "in for outputs returned with their gradient tracked left out, with the "
            "backward graph's read of them: an estimate either way (inside the graph some "
            "of it would overlap the graph's own work; the compiler may fuse it "
            "otherwise, as a cast taken into the graph's last matmul)"))]


def _what(trace: Trace, movable) -> str:
    """What the eager ops are: an inference run's code beside its model, a training run's
    loss (where it runs eagerly) or the work on its model's outputs."""
    if not trains(trace):
        return "code beside the model"
    if host_bound.loss_is_eager(movable):
        return "the loss and other code beside the model"
    return "work on the model's outputs beside it, the loss compiled with it"
