"""The trace's counter series (HBM in use, SBUF occupancy, engine utilisation in ours;
whatever counters a PyTorch-profiler trace recorded), one summary row per series.

A counter holds its value until its next sample, so its mean over time weights each
sample by how long it held (HTA's memory-bandwidth and CUPTI counter series are such
series too; the PyTorch-profiler traces at hand record none).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

COLUMNS = ["series", "track_id", "device", "samples", "first_ts", "last_ts", "min", "max",
           "mean", "time_weighted_mean", "last"]


def counter_summary(trace: Trace) -> pd.DataFrame:
    """Per counter series (`COLUMNS`): its device (-1: the host), samples, the times of
    its first and last sample, min, max, mean over samples, mean over time (each value
    held until the next sample; the last one held for none) and its last value."""
    c = trace.counters
    if not len(c):
        return pd.DataFrame(columns=COLUMNS)
    device = trace.tracks.set_index("track_id")["device"]
    rows = []
    for (track, name), part in c.groupby(["track_id", "name"], sort=True):
        part = part.sort_values("ts", kind="stable")
        ts = part["ts"].to_numpy(np.int64)
        value = part["value"].to_numpy(np.float64)
        held = np.diff(ts)
        span = float(held.sum())
        weighted = float((value[:-1] * held).sum() / span) if span > 0 else float(value.mean())
        rows.append((name, int(track), int(device.get(track, -1)), len(part), int(ts[0]),
                     int(ts[-1]), float(value.min()), float(value.max()),
                     float(value.mean()), weighted, float(value[-1])))
    return pd.DataFrame(rows, columns=COLUMNS)
