"""Dependency idle: the device sits idle although its next kernel was already launched."""

from __future__ import annotations

from typing import TYPE_CHECKING

from neuron_explorer.analyses.critical_path import device_wait_saving
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make, step_time, top, us
from neuron_explorer.tables import slice_names

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "dependency_idle"


def check(trace: Trace) -> list[Finding]:
    gaps = trace.idle_reasons()
    waits = gaps[gaps["reason"] == "dependency"]
    symptom = float(waits["dur"].sum())
    if not len(waits):
        return []
    # only the waits the host then waited out make a step longer, and no more of them than
    # the steps' critical path runs through (the host's waits can be other waits: an MTIA
    # trace's ops that outlast their kernels counted 7.3 s against 3.6 s on the path)
    lost = device_wait_saving(trace, waits["ts"].to_numpy(), waits["dur"].to_numpy())
    path = trace.critical_path()
    if len(path):
        # the path's device waits with work launched: on an event, or to start
        waiting = path["category"].isin(["dependency", "launch"]) & (path["kind"] == "device")
        lost = min(lost, float(path.loc[waiting, "dur"].sum()))
    if lost < th.DEPENDENCY_IDLE_MIN_SHARE * step_time(trace):
        return []
    names = slice_names(trace)
    items = [evidence(r.ts, r.dur, [r.next_slice_id],
                      f"device idle {us(r.dur)} with {names[r.next_slice_id]} already launched "
                      f"{us(r.ts + r.dur - r.launch_ts)} before it started")
             for r in top(waits, "dur").itertuples()]
    streams = trace.tracks[trace.tracks["device"] >= 0]
    several = len(streams) > 1
    if (streams["kind"] == "gpu_stream").any():  # a GPU-like device: streams wait on events
        cause = ("the next kernel was queued but waited on something else: an event from "
                 "another stream (the compute stream waiting for a copy or a collective on a "
                 "communication stream), or a collective waiting for other ranks")
        fix = ("Look at what the kernels after these gaps wait for: cross-stream waits "
               "(cudaStreamWaitEvent, `wait_stream`, `record_stream`) that serialise streams, "
               "copies that could be issued earlier or non_blocking, and collectives whose "
               "peers arrive late (load every rank's trace as a run to see stragglers). Issue "
               "communication and copies as early as their inputs allow so the wait is hidden.")
    else:
        cause = ("the next kernel was queued but had to wait for its inputs or for a "
                 "collective or copy it depends on")
        fix = ("Give the device independent work to overlap with the wait: issue copies "
               "(non_blocking) and collectives (async_op=True) as early as their inputs allow, "
               "and wait on them only where their result is needed; under torch.compile, "
               "larger graphs let the compiler overlap them.")
    return [make(
        trace, RULE_ID, f"Device idle while launched work waits ({len(waits)} gaps)", lost, items,
        f"In {len(waits)} gaps the device did nothing although the host had already launched "
        f"the next kernel: {cause}" + (f" ({len(streams)} device streams or queues)."
                                         if several else ".")
        + f" The device waited {us(symptom)} in all; {us(lost)} of it held up the step "
        "(the host then waited for the device), and only that would be saved.", fix,
        symptom_ns=symptom,
        saving_basis="critical path: per step, the device's waits or the host's sync "
                     "time after them, whichever is less")]
