"""Queued idle: a device queue (stream) sits idle with work already launched to it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer.analyses.critical_path import host_waits_per_step
from neuron_explorer.analyses.phases import in_analysed_work
from neuron_explorer.analyses.stream_idle import GAP_COLUMNS, idle_gaps
from neuron_explorer.common.intervals import Union
from neuron_explorer.rules import dependency_idle
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make, step_time, top, us
from neuron_explorer.tables import slice_names

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "queued_idle"
NO_LAUNCH = np.iinfo(np.int64).min


def queued_gaps(trace: Trace) -> pd.DataFrame:
    """The analysed steps' gaps on a queue whose next kernel was launched before the
    queue went idle (HTA's `other` idle: not a wait on the host, and longer than
    back-to-back overhead), with `depth`: the work queued as the gap began."""
    series = trace.queue_length()
    gaps = idle_gaps(trace) if len(series) else pd.DataFrame(columns=GAP_COLUMNS)
    # a kernel whose launch the trace lacks (launched before recording, a device-side
    # request) says nothing about its queue
    gaps = gaps[(gaps["idle_category"] == "other") & (gaps["launched_at"] != NO_LAUNCH)]
    # queued means launched: a launch call still running as the queue went idle (an NKI
    # kernel's 50 us of dispatch after a sync, a host fallback computing between its copies)
    # is the host's time, not a wait of work already queued
    gaps = gaps[_launch_ends(trace, gaps["id"].to_numpy(np.int64))
                <= gaps["previous_end"].to_numpy(np.int64)]
    gaps = in_analysed_work(trace, gaps)
    if not len(gaps):
        return gaps.assign(depth=pd.Series(dtype=np.int64))
    depth = np.zeros(len(gaps), np.int64)
    for track, q in series.groupby("track_id"):
        mine = (gaps["track"] == track).to_numpy()
        ts = q["ts"].to_numpy(np.int64)
        at = np.searchsorted(ts, gaps["previous_end"].to_numpy(np.int64)[mine], "right") - 1
        depth[mine] = np.where(at >= 0, q["queue_length"].to_numpy()[np.maximum(at, 0)], 0)
    # the queue series knows only the launches it can name (runtime calls, our ops)
    return gaps.assign(depth=depth)[depth > 0]


def _launch_ends(trace: Trace, kernel_slices: np.ndarray) -> np.ndarray:
    """When the launch call (or op) of each kernel slice returned."""
    from neuron_explorer.tables import kernel_launches

    s = trace.table("slices")
    launch = kernel_launches(trace)
    ends = (s["ts"].to_numpy(np.int64) + s["dur"].to_numpy(np.int64))[np.maximum(launch, 0)]
    by_kernel = pd.Series(np.where(launch >= 0, ends, NO_LAUNCH),
                          index=trace.kernels["id"].to_numpy(np.int64))
    return by_kernel.reindex(kernel_slices).fillna(NO_LAUNCH).to_numpy(np.int64)


def held_up(trace: Trace, ts: np.ndarray, end: np.ndarray, track: np.ndarray) -> float:
    """What the analysed steps would save without the waits [ts, end) on queues `track`:
    per step, the time its critical path spends in them on their own queue (one waiting
    for another queue's kernel is on the path in that kernel, not here), at most the
    host's waits on the device in that step (a step whose host never waits is set by the
    host: the path's device stretch before the host's wait has the host's work beside it)."""
    path = trace.critical_path()
    if not len(path) or not len(ts):
        return 0.0
    seg = path[path["kind"] == "device"]
    per_step = pd.Series(0.0, index=pd.Index(path["step"].unique()))
    for queue in np.unique(track):
        mine = track == queue
        s = seg[seg["track"] == queue]
        start = s["ts"].to_numpy(np.int64)
        inside = Union(ts[mine], end[mine]).covered(start, start + s["dur"].to_numpy(np.int64))
        per_step = per_step.add(pd.Series(inside, index=s["step"].to_numpy()).groupby(level=0)
                                .sum(), fill_value=0)
    host = host_waits_per_step(trace).reindex(per_step.index).fillna(0)
    return float(np.minimum(per_step, host).sum())


def check(trace: Trace) -> list[Finding]:
    gaps = queued_gaps(trace)
    if not len(gaps) or dependency_idle.check(trace):
        return []  # dependency_idle already counts these waits, where the whole device idled
    lost = held_up(trace, gaps["previous_end"].to_numpy(np.int64),
                   gaps["ts"].to_numpy(np.int64), gaps["track"].to_numpy(np.int64))
    if lost < th.QUEUED_IDLE_MIN_SHARE * step_time(trace):
        return []
    symptom = float(gaps["idle_ns"].sum())
    names = slice_names(trace)
    items = [evidence(r.previous_end, r.idle_ns, [r.id],
                      f"{r.stream} idle {us(r.idle_ns)} with {r.depth} kernels queued; "
                      f"next: {names[r.id]}")
             for r in top(gaps, "idle_ns").itertuples()]
    streams = gaps.groupby("stream")["idle_ns"].sum().sort_values(ascending=False)
    depth = int(gaps["depth"].median())
    return [make(
        trace, RULE_ID,
        f"Device queue idle with work queued ({len(gaps)} gaps, median {depth} kernels "
        "waiting)", lost, items,
        f"In {len(gaps)} gaps a queue ({', '.join(streams.index[:3])}) did nothing although "
        f"the host had already launched its next kernels (median {depth} queued as it went "
        "idle): the host was ahead, so this idle is not host-bound; the queued kernel waited "
        "for something else (an event from another stream, a copy, a collective's peers, "
        f"a device-side dependency). The queues idled {us(symptom)} in all; {us(lost)} of "
        "it held up the steps (on their critical path, while the host waited for the "
        "device), and only that would be saved.",
        "Find what the kernel after each gap waits for: cross-stream waits "
        "(cudaStreamWaitEvent, `wait_stream`, `record_stream`) that could come later or go, "
        "copies that could be issued earlier (non_blocking, pinned memory) or on a side "
        "stream, collectives whose peers arrive late (load every rank's trace as a run). "
        "Issue what the queue waits for as early as its inputs allow.",
        symptom_ns=symptom,
        saving_basis="critical path: per step, the gaps' time on the critical path on "
                     "their own queue, at most the host's waits on the device")]
