"""A step's length when the device falls behind its host.

A step is recorded as the host's window (from one optimizer step to the next). Where
nothing in a step waits for the device (no sync, no read of a result), the host ends the
window while the step's kernels still run: a device that needs longer than its host
falls further behind every step, and the run goes at the device's pace (a longer run's
host would wait at a full launch queue). Its steps then last the time between the ends
of consecutive steps' device work, not the host's windows. Every per-time figure (step
time, MFU, HFU, MBU, the findings' shares) reads these paced lengths; the breakdown and
the critical path stay within the host's windows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer.analyses.phases import split_phases
from neuron_explorer.analyses.step_breakdown import step_windows
from neuron_explorer.memo import memoised

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

# Pairs of consecutive steps needed to time the device per step.
MIN_INTERVALS = 2
# The device paces the run when its median time per step is this much above the
# host's median window (below it, the two differ by jitter, not by a device behind).
PACED_RATIO = 1.05


def device_intervals(trace: Trace) -> pd.Series:
    """Per analysed step (`step_windows`' rows): the time from the end of the step before's
    device work (its last kernel) to the end of this step's; NaN where either ran none."""
    windows = step_windows(trace)
    steps = windows["step"].astype(np.int64)
    kernels = trace.kernels
    # a run that also evaluates: its training windows leave the eval passes out, the
    # ends of the steps' device work do not (those steps are timed by their windows)
    if (not len(windows) or not len(kernels) or int(steps.iloc[0]) < 0
            or split_phases(trace)):
        return pd.Series(np.nan, index=windows.index)
    ends = _device_ends(trace)
    mine = ends.reindex(steps.to_numpy()).to_numpy(np.float64)
    before = ends.reindex((steps - 1).to_numpy()).to_numpy(np.float64)
    return pd.Series(mine - before, index=windows.index)


def device_paced_step_ns(trace: Trace) -> float | None:
    """The median of `device_intervals` over the analysed steps (None with fewer than
    `MIN_INTERVALS`)."""
    intervals = device_intervals(trace).dropna()
    if len(intervals) < MIN_INTERVALS:
        return None
    return float(intervals.median())


def device_behind(host: np.ndarray, intervals: np.ndarray) -> bool:
    """Whether the device needs clearly longer per step than its host: over the steps timed
    both ways, the median of each step's device interval over its host window is at least
    PACED_RATIO. Each side's median apart called a rank device-paced whose windows
    alternate 2.6 and 8.5 ms (waiting for the other rank every other step) with its device
    work ending with each window: the two medians fell on different steps."""
    host, intervals = np.asarray(host, np.float64), np.asarray(intervals, np.float64)
    both = ~np.isnan(intervals) & (host > 0)
    if int(both.sum()) < MIN_INTERVALS:
        return False
    return float(np.median(intervals[both] / host[both])) >= PACED_RATIO


def device_paces(trace: Trace) -> bool:
    """Whether the trace's device paces its run (`device_behind` over its analysed steps)."""
    def decide() -> bool:
        windows = step_windows(trace)
        return device_behind(windows["dur"].to_numpy(np.float64),
                             device_intervals(trace).to_numpy(np.float64))
    return memoised(trace, "device_paces", decide)


def paced_durations(trace: Trace) -> np.ndarray:
    """Each analysed window's length (`step_windows`' rows) as the run's pace sets it: the
    host's window, or where the device paces the run (`device_paces`), the device's
    interval for that step (the host's window where its interval is unknown)."""
    return memoised(trace, "paced_durations", lambda: _paced(trace)).copy()


def step_times(trace: Trace) -> pd.DataFrame:
    """The analysed steps as the report times them: step, ts, host_dur (the host's window,
    `trace.steps`' dur) and dur (`paced_durations`: the step time's and total's parts).
    Where the device paces the run, savings worked out from the windows read a compiled
    CNN's 696 us steps as 628."""
    windows = step_windows(trace)
    return pd.DataFrame({"step": windows["step"].to_numpy(np.int64),
                         "ts": windows["ts"].to_numpy(np.int64),
                         "host_dur": windows["dur"].to_numpy(np.int64),
                         "dur": np.rint(paced_durations(trace)).astype(np.int64)})


def _paced(trace: Trace) -> np.ndarray:
    windows = step_windows(trace)
    host = windows["dur"].to_numpy(np.float64)
    if not len(host) or not device_paces(trace):
        return host
    ends = _device_ends(trace).reindex(windows["step"].astype(np.int64).to_numpy())
    own = ends.to_numpy(np.float64) - windows["ts"].to_numpy(np.float64)
    return paced_lengths(host, device_intervals(trace).to_numpy(np.float64), own)


def paced_lengths(host: np.ndarray, intervals: np.ndarray, own: np.ndarray) -> np.ndarray:
    """Steps' lengths as the run's pace sets them, from each step's host window, its device
    interval (NaN: unknown) and the time from its window's start to the end of its own
    device work: the windows, or where the device is behind (`device_behind`) the
    intervals; a step without an interval (the first) lasts until its own device work is
    done. A replay times the run it makes with this, as the report times a recording."""
    if not len(host) or not device_behind(host, intervals):
        return host
    first = np.fmax(host, own)  # fmax: a step that ran no kernel keeps its window
    return np.where(np.isnan(intervals), first, intervals)


def _device_ends(trace: Trace) -> pd.Series:
    """Per step (>= 0): the end of its last kernel."""
    kernels = trace.kernels
    ends = (kernels["ts"] + kernels["dur"]).groupby(kernels["step"]).max()
    return ends[ends.index >= 0]  # step -1: work outside every step, after the last too
