"""Long launch delays: kernels launched onto an idle queue that start long after their
launch returned (HTA's launch-delay outliers, less those queued behind other work)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer.analyses.phases import in_analysed_work
from neuron_explorer.analyses.stream_idle import idle_gaps
from neuron_explorer.rules import dependency_idle
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make, step_time, top, us
from neuron_explorer.rules.queued_idle import held_up

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "launch_delay"


def idle_delays(trace: Trace) -> pd.DataFrame:
    """The analysed steps' kernels whose launch delay (call return to start) is over the
    cutoff and was spent with their queue idle: launched after the queue's previous kernel
    ended (a delay behind queued work is the device being busy, not a loss). Columns of
    `launch_stats`, with track, step, ts (the start) and returned (the call's return)."""
    stats = trace.launch_stats()
    delayed = stats[stats["launch_delay_ns"] > th.LAUNCH_DELAY_MIN_NS]
    gaps = idle_gaps(trace)
    empty = gaps[gaps["idle_category"] == "host_wait"].set_index("id")
    delayed = delayed[delayed["id"].isin(empty.index)]
    delayed = delayed.assign(track=empty["track"].reindex(delayed["id"]).to_numpy(),
                             step=empty["step"].reindex(delayed["id"]).to_numpy(),
                             ts=empty["ts"].reindex(delayed["id"]).to_numpy(np.int64))
    delayed = delayed.assign(returned=delayed["ts"] - delayed["launch_delay_ns"])
    return in_analysed_work(trace, delayed)


def check(trace: Trace) -> list[Finding]:
    delays = idle_delays(trace)
    if not len(delays) or dependency_idle.check(trace):
        return []  # dependency_idle already counts these waits, where the whole device idled
    lost = held_up(trace, delays["returned"].to_numpy(np.int64), delays["ts"].to_numpy(np.int64),
                   delays["track"].to_numpy(np.int64))
    if lost < th.LAUNCH_DELAY_MIN_SHARE * step_time(trace):
        return []
    symptom = float(delays["launch_delay_ns"].sum())
    items = [evidence(r.returned, r.launch_delay_ns, [r.id, r.launch],
                      f"{r.name} on {r.stream} started {us(r.launch_delay_ns)} after its "
                      "launch returned, its queue idle")
             for r in top(delays, "launch_delay_ns").itertuples()]
    median = float(delays["launch_delay_ns"].median())
    return [make(
        trace, RULE_ID, f"Kernels start long after their launch ({len(delays)} launches)",
        lost, items,
        f"{len(delays)} kernels waited over {us(th.LAUNCH_DELAY_MIN_NS)} (median {us(median)}) "
        "between their launch call's return and their start, although nothing ran before "
        "them on their queue: the queue was idle and the launch latency itself, or a wait "
        "the launch carried (an event on another stream), held them. Launch latencies are "
        f"normally microseconds. The delays total {us(symptom)}; {us(lost)} of them held up "
        "the steps (on their critical path, while the host waited for the device), and only "
        "that would be saved.",
        "Look at the first launch of each delayed kernel (lazy module loading: warm the "
        "kernels up before timing, or CUDA_MODULE_LOADING=EAGER), at other processes "
        "sharing the device (MPS, time-slicing), and at stream waits recorded before the "
        "launch; CUDA graphs (torch.compile mode='reduce-overhead') replace per-kernel "
        "launches where the delay is the launch itself.",
        symptom_ns=symptom,
        saving_basis="critical path: per step, the delays' time on the critical path on "
                     "their kernels' queues, at most the host's waits on the device")]
