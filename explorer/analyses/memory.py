"""Device memory: HBM in use over time, its peak, and what holds it at the peak.

Our traces record HBM in use as a counter per device. PyTorch-profiler traces
record it as `[memory]` instants (with `Total Allocated`) when memory profiling
was on. The holders at the peak are the allocations still live at the peak: each
allocation is charged to the op that began last before it on the host clock (the
clock memory changes are dated on), and releases free allocations of their size
(else the latest ones), so the holders sum to the peak.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer.common import trace_format as tf

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

TIMELINE_COLUMNS = ["ts", "device", "in_use_bytes"]
PEAK_COLUMNS = ["device", "peak_ts", "op", "module", "bytes", "share_of_peak"]


def memory_timeline(trace: Trace) -> pd.DataFrame:
    """ts, device, in_use_bytes, sorted by device then time."""
    c = trace.counters
    parts = []
    if len(c):
        hbm = c[c["name"] == tf.COUNTER_HBM]
        if len(hbm):
            dev = trace.tracks.set_index("track_id")["device"]
            parts.append(pd.DataFrame({
                "ts": hbm["ts"].to_numpy(np.int64),
                "device": dev.reindex(hbm["track_id"]).fillna(-1).to_numpy(np.int64),
                "in_use_bytes": hbm["value"].to_numpy(np.float64).astype(np.int64)}))
    s = trace.table("slices")
    mem = s[s["name"] == "[memory]"]
    if len(mem):
        ids = mem["id"].to_numpy()
        total = pd.to_numeric(pd.Series(trace.slice_args.column("Total Allocated", ids)),
                              errors="coerce")
        device = pd.to_numeric(pd.Series(trace.slice_args.column("Device Id", ids)),
                               errors="coerce")
        ok = total.notna().to_numpy()
        parts.append(pd.DataFrame({"ts": mem["ts"].to_numpy()[ok],
                                   "device": device.fillna(-1).to_numpy()[ok].astype(np.int64),
                                   "in_use_bytes": total.to_numpy()[ok].astype(np.int64)}))
    if not parts:
        return pd.DataFrame({c: pd.Series(dtype="int64") for c in TIMELINE_COLUMNS})
    frame = pd.concat(parts, ignore_index=True)
    return frame.sort_values(["device", "ts"], kind="stable", ignore_index=True)[TIMELINE_COLUMNS]


def peak_memory(trace: Trace) -> pd.DataFrame:
    """Per device: peak bytes in use and when."""
    tl = trace.memory_timeline()
    if not len(tl):
        return pd.DataFrame({"device": [], "peak_bytes": [], "peak_ts": []}, dtype="int64")
    idx = tl.groupby("device")["in_use_bytes"].idxmax()
    peak = tl.loc[idx.to_numpy()]
    return pd.DataFrame({"device": peak["device"].to_numpy(),
                         "peak_bytes": peak["in_use_bytes"].to_numpy(),
                         "peak_ts": peak["ts"].to_numpy()})


def _charge(trace: Trace, ts: np.ndarray) -> np.ndarray:
    """Op slice id charged for a memory change at each host time: the last op that began
    at or before it (-1: none). Memory changes are dated on the host clock, like op slices."""
    ops = trace.ops
    out = np.full(len(ts), -1, np.int64)
    if not len(ops):
        return out
    o = ops.sort_values("ts")
    i = np.searchsorted(o["ts"].to_numpy(np.int64), ts, side="right") - 1
    ok = i >= 0
    out[ok] = o["id"].to_numpy()[i[ok]]
    return out


def live_allocations(deltas: np.ndarray, owner: np.ndarray) -> dict[int, int]:
    """Bytes each owner still holds after the changes `deltas` (in time order).

    The counter says how much is in use, not which block a release frees, so a release
    frees the latest live allocation of its exact size when there is one (the same tensor,
    or one like it), else the latest allocations (last in, first out). What remains sums to
    the bytes in use at the end: holders never add up to more than the peak."""
    stack: list[list[int]] = []  # [owner, bytes still held], in allocation order
    by_size: dict[int, list[int]] = {}  # size -> positions in `stack` allocated with it
    for d, who in zip(deltas.tolist(), owner.tolist(), strict=True):
        if d > 0:
            by_size.setdefault(d, []).append(len(stack))
            stack.append([who, d])
            continue
        need = -d
        same = by_size.get(need)
        while need and same:
            i = same.pop()
            if i < len(stack) and stack[i][1] == need:
                stack[i][1] = 0
                need = 0
        while need and stack:
            top = stack[-1]
            take = min(top[1], need)
            top[1] -= take
            need -= take
            if top[1] == 0:
                stack.pop()
        while stack and stack[-1][1] == 0:
            stack.pop()
    held: dict[int, int] = {}
    for who, nbytes in stack:
        if nbytes > 0:
            held[who] = held.get(who, 0) + nbytes
    return held


def memory_at_peak(trace: Trace) -> pd.DataFrame:
    """Ops (and their modules) whose allocations are still live at each device's peak,
    largest first; they sum to the peak (what was in use before the first op shows as
    "(before any op)")."""
    tl = trace.memory_timeline()
    peaks = peak_memory(trace)
    rows = []
    ops = trace.ops.set_index("id") if len(trace.ops) else None
    for device, peak_bytes, peak_ts in peaks.itertuples(index=False):
        d = tl[(tl["device"] == device) & (tl["ts"] <= peak_ts)]
        values = d["in_use_bytes"].to_numpy(np.int64)
        # up to the peak's own change (several changes can share its timestamp)
        values = values[: int(np.argmax(values)) + 1]
        owner = _charge(trace, d["ts"].to_numpy(np.int64)[: len(values)])
        held = live_allocations(np.diff(np.r_[0, values]), owner)
        for op_slice, nbytes in held.items():
            if ops is not None and op_slice in ops.index:
                name, module = ops.at[op_slice, "name"], ops.at[op_slice, "module"]
            else:
                name, module = "(before any op)", ""
            rows.append((int(device), int(peak_ts), name, module, int(nbytes),
                         nbytes / peak_bytes if peak_bytes else 0.0))
    frame = pd.DataFrame(rows, columns=PEAK_COLUMNS)
    if not len(frame):
        return frame
    grouped = frame.groupby(["device", "peak_ts", "op", "module"], as_index=False)[
        ["bytes", "share_of_peak"]].sum()
    return grouped.sort_values(["device", "bytes"], ascending=[True, False], ignore_index=True)
