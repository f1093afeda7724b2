"""How much work waits in each device queue (a CUDA stream, a NeuronCore's compute or
collective queue) over time: the kernels, copies and memsets launched to it that have not
started yet, as Holistic Trace Analysis counts it.

A kernel joins its queue when the host launches it (the runtime call's start in a
PyTorch-profiler trace: cudaLaunchKernel, cudaMemcpyAsync, cudaMemsetAsync...; the op's
start in our recordings) and leaves it when it starts. A queue that stays deep means the
host runs ahead of the device (device-bound); one that is empty while the device idles
means the host is late (host-bound).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

SERIES_COLUMNS = ["stream", "track_id", "ts", "queue_length"]
SUMMARY_COLUMNS = ["stream", "track_id", "count", "mean", "std", "min", "25%", "50%", "75%",
                   "max", "time_weighted_mean", "empty_share", "full_ns", "full_share"]
# the launches a CUDA stream holds before a launch call blocks (HTA's
# CUDA_MAX_LAUNCH_QUEUE_PER_STREAM)
CUDA_FULL_QUEUE = 1024


def queue_length(trace: Trace, hta_window: bool = False) -> pd.DataFrame:
    """Per queue, its length after each launch and each start, in time order (at equal
    times, starts first): stream (the queue's track name), track_id, ts, queue_length.
    Work whose launch is not in the trace (launched before the recording began, or a
    sampled trace's) is left out, as HTA leaves it out; with `hta_window`, so is work
    launched in the last step of a trace of two or more (HTA drops the last step)."""
    from neuron_explorer.analyses.launch_stats import launch_stats

    launches = launch_stats(trace, hta_window)  # the same launches, found once
    if not len(launches):
        return pd.DataFrame(columns=SERIES_COLUMNS)
    s = trace.table("slices")
    launch = s["ts"].to_numpy(np.int64)[launches["launch"].to_numpy(np.int64)]
    start = s["ts"].to_numpy(np.int64)[launches["id"].to_numpy(np.int64)]
    track = s["track_id"].to_numpy()[launches["id"].to_numpy(np.int64)]
    events = pd.DataFrame({
        "track_id": np.r_[track, track],
        "ts": np.r_[launch, start],
        "delta": np.r_[np.ones(len(track), np.int64), -np.ones(len(track), np.int64)]})
    events = events.sort_values(["track_id", "ts", "delta"], kind="stable", ignore_index=True)
    events["queue_length"] = events.groupby("track_id")["delta"].cumsum()
    streams = launches.drop_duplicates("stream")
    names = pd.Series(streams["stream"].to_numpy(),
                      index=s["track_id"].to_numpy()[streams["id"].to_numpy(np.int64)])
    events["stream"] = names.reindex(events["track_id"]).to_numpy()
    return events[SERIES_COLUMNS]


def queue_length_summary(trace: Trace, hta_window: bool = False,
                         full: int = CUDA_FULL_QUEUE) -> pd.DataFrame:
    """Per queue: the statistics of its length over its samples (one per launch and start,
    as HTA's summary gives them, each sample once), its time-weighted mean from its first
    launch to its last start, and the share of that time it was empty; `full_ns`, the
    time it held `full` or more (a full queue: the next launch call blocks the host,
    HTA's time blocked on a full queue) and `full_share`, that time's share."""
    series = queue_length(trace, hta_window)
    if not len(series):
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    rows = []
    for (stream, track), q in series.groupby(["stream", "track_id"], sort=False):
        stats = q["queue_length"].describe()
        ts = q["ts"].to_numpy(np.int64)
        held = np.diff(ts)  # each length holds until the next sample
        lengths = q["queue_length"].to_numpy()[:-1]
        span = float(held.sum())
        rows.append({"stream": stream, "track_id": int(track),
                     **{c: float(stats[c]) for c in SUMMARY_COLUMNS[2:10]},
                     "time_weighted_mean": float((lengths * held).sum() / span) if span else 0.0,
                     "empty_share": float(held[lengths == 0].sum() / span) if span else 0.0,
                     "full_ns": int(held[lengths >= full].sum()),
                     "full_share": float(held[lengths >= full].sum() / span) if span else 0.0})
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
