"""Idle time per device queue (stream) in HTA's three categories.

Between two kernels (copies and memsets included) on one queue the queue is idle for
the gap from the first one's end to the next one's start. HTA's
`get_idle_time_breakdown` calls that gap:
- `host_wait`: the next kernel's launch call began after the previous kernel ended: the
  host had not queued it yet;
- `kernel_wait`: otherwise, a gap under `consecutive_kernel_delay_ns` (30 us, HTA's
  default): the overhead of running kernels back to back;
- `other`: the rest: a launched kernel that still waited (for an event, another queue,
  a collective's peers).
This is per queue and over the whole trace, as HTA reports it; `Trace.idle_reasons()` is per
device over the analysed steps, with its causes read from the host's timeline (data,
compile, sync, host_launch, dependency).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

COLUMNS = ["stream", "idle_category", "idle_ns", "idle_share", "gaps"]
CATEGORIES = ("host_wait", "kernel_wait", "other")
CONSECUTIVE_KERNEL_DELAY_NS = 30_000  # HTA's default (30, in its microseconds)


def stream_idle(trace: Trace, hta_window: bool = False,
                consecutive_kernel_delay_ns: int = CONSECUTIVE_KERNEL_DELAY_NS) -> pd.DataFrame:
    """Per stream and category (`CATEGORIES`): the idle time between its kernels
    (`idle_ns`), its share of the stream's idle time and the number of gaps.
    `hta_window`: the kernels HTA keeps: launched in the trace (not before recording
    began) and before the last step of a trace of two or more."""
    frame = idle_gaps(trace, hta_window, consecutive_kernel_delay_ns, every_kernel=True)
    if not len(frame):
        return pd.DataFrame(columns=COLUMNS)
    rows = []
    for stream, part in frame.groupby("stream", sort=False):
        part = part[part["after_gap"]]
        total = float(part["idle_ns"].sum())
        for name in CATEGORIES:
            mine = part[part["idle_category"] == name]
            idle = int(mine["idle_ns"].sum())
            rows.append((stream, name, idle, idle / total if total > 0 else 0.0, len(mine)))
    return pd.DataFrame(rows, columns=COLUMNS)


GAP_COLUMNS = ["id", "step", "stream", "track", "previous_end", "ts", "launched_at",
               "idle_ns", "idle_category"]


def idle_gaps(trace: Trace, hta_window: bool = False,
              consecutive_kernel_delay_ns: int = CONSECUTIVE_KERNEL_DELAY_NS,
              every_kernel: bool = False) -> pd.DataFrame:
    """One row per gap between two kernels on one stream, by the kernel after it: id (its
    slice), step, stream, track, previous_end (the gap's start), ts (its end: the kernel's
    start), launched_at (the kernel's launch call or op, int64 min when not in the trace),
    idle_ns and idle_category. `every_kernel`: each stream's first kernel too, with
    `after_gap` False (its idle_ns is NaN)."""
    from neuron_explorer.tables import kernel_launches

    k = trace.kernels
    if not len(k):
        return pd.DataFrame(columns=GAP_COLUMNS)
    s = trace.table("slices")
    launch = kernel_launches(trace)
    launched_at = np.where(launch >= 0, s["ts"].to_numpy(np.int64)[np.maximum(launch, 0)],
                           np.iinfo(np.int64).min)  # no launch call: never a host wait
    if hta_window:
        keep = launch >= 0
        if len(trace.steps) >= 2:
            keep &= launched_at < int(trace.steps["ts"].max())
        k, launched_at = k[keep], launched_at[keep]
    track = s["track_id"].to_numpy()[k["id"].to_numpy(np.int64)]
    names = trace.tracks.set_index("track_id")["name"].astype(str).str.strip()
    frame = pd.DataFrame({"id": k["id"].to_numpy(), "step": k["step"].to_numpy(),
                          "stream": names.reindex(track).to_numpy(), "track": track,
                          "ts": k["ts"].to_numpy(np.int64),
                          "end": k["ts"].to_numpy(np.int64) + k["dur"].to_numpy(np.int64),
                          "launched_at": launched_at})
    frame = frame.sort_values(["track", "ts"], kind="stable", ignore_index=True)
    previous_end = frame.groupby("track")["end"].shift(1)
    gap = frame["ts"] - previous_end
    host_wait = frame["launched_at"] > previous_end
    category = np.where(host_wait, "host_wait",
                        np.where(gap < consecutive_kernel_delay_ns, "kernel_wait", "other"))
    # a stream's first kernel follows no gap; a stream of one kernel still has its rows
    frame = frame.assign(previous_end=previous_end, idle_category=category, idle_ns=gap,
                         after_gap=previous_end.notna())
    if every_kernel:
        return frame
    frame = frame[frame["after_gap"]]
    return frame.assign(previous_end=frame["previous_end"].astype(np.int64),
                        idle_ns=frame["idle_ns"].astype(np.int64))[GAP_COLUMNS]
