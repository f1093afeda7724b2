"""Which device waits lie on a step's critical path, and so what removing them saves.

A device that waits (for a dependency, a copy, another rank) makes the step longer only
when the host later waits for that device: a host-bound step queues its next work
meanwhile and is as long without the wait. So within a step, removing device waits of
W ns shortens it by at most min(W, S), S being the host's time waiting on the device in
that step: syncs (`.item()`, `.cpu()`, `synchronize`, `cudaStreamSynchronize`) and ops
that return only once their own device work has finished (blocking copies: the host's
op interval covers its kernel's end, and the overlap is the wait).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace


def host_waits_per_step(trace: Trace) -> pd.Series:
    """The host's time waiting on the device in each analysed step (-1: the whole trace,
    when it has no steps): the step breakdown's `sync`, plus blocking ops' waits."""
    bd = trace.breakdown()
    sync = bd[(bd["side"] == "host") & (bd["category"] == "sync")].groupby("step")["ns"].sum()
    ts, dur = blocking_op_waits(trace)
    return sync.add(per_analysed_step(trace, ts, dur), fill_value=0)


def blocking_op_waits(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Where ops waited for their own device work: for each op whose host interval ends
    after its kernel does, the overlap of the two (start, length)."""
    k = trace.kernels
    if not len(k) or "op_slice_id" not in k:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    k = k[k["op_slice_id"].to_numpy() >= 0]
    s = trace.table("slices")
    op = k["op_slice_id"].to_numpy(np.int64)
    op_start = s["ts"].to_numpy(np.int64)[op]
    op_end = op_start + s["dur"].to_numpy(np.int64)[op]
    k_start = k["ts"].to_numpy(np.int64)
    k_end = k_start + k["dur"].to_numpy(np.int64)
    start = np.maximum(op_start, k_start)
    waited = (op_end >= k_end) & (k_end > start)
    return start[waited], (k_end - start)[waited]


def per_analysed_step(trace: Trace, ts: np.ndarray, dur: np.ndarray) -> pd.Series:
    """The sum of `dur` of intervals starting in each analysed step, indexed by step."""
    from neuron_explorer.analyses.step_breakdown import step_windows

    win = step_windows(trace).sort_values("ts")
    starts = win["ts"].to_numpy(np.int64)
    ends = starts + win["dur"].to_numpy(np.int64)
    ts = np.asarray(ts, np.int64)
    i = np.searchsorted(starts, ts, side="right") - 1
    inside = (i >= 0) & (ts < ends[np.maximum(i, 0)])
    steps = win["step"].to_numpy(np.int64)
    totals = np.bincount(i[inside], weights=np.asarray(dur, np.float64)[inside],
                         minlength=len(steps))
    return pd.Series(totals, index=steps)


# A step whose saving is past this many times the median step's is a one-time catch-up
# (a rank waiting once for another that started late), not a cost of every step.
CATCH_UP_FACTOR = 3


def device_wait_saving(trace: Trace, ts: np.ndarray, dur: np.ndarray) -> float:
    """What the analysed steps would save without the device waits [ts, ts + dur):
    per step, the waits or the host's sync time, whichever is less, capped at
    `CATCH_UP_FACTOR` times the median step's (a wait paid once is no per-step cost)."""
    waits = per_analysed_step(trace, ts, dur)
    sync = host_waits_per_step(trace).reindex(waits.index).fillna(0)
    saving = np.minimum(waits, sync)
    if len(saving) > 1:
        saving = saving.clip(upper=float(saving.median()) * CATCH_UP_FACTOR)
    return float(saving.sum())
