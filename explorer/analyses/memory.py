"""Device memory: HBM in use over time, its peak, and what holds it at the peak.

Our traces record HBM in use as a counter per device. PyTorch-profiler traces
record it as `[memory]` instants (with `Total Allocated`) when memory profiling
was on. The holders at the peak are estimated by time: each change in memory is
charged to the op whose kernel (or host call) was running when it happened, and
an op's holding is its net change from the start of the trace to the peak.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer import trace_format as tf

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
    s = trace.base_slices
    mem = s[s["name"] == "[memory]"]
    if len(mem):
        ids = mem["id"].to_numpy()
        total = pd.to_numeric(pd.Series(trace.args.column("Total Allocated", ids)),
                              errors="coerce")
        device = pd.to_numeric(pd.Series(trace.args.column("Device Id", ids)), errors="coerce")
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


def _charge(trace: Trace, device: int, ts: np.ndarray) -> np.ndarray:
    """Op slice id charged for a memory change at each time (-1: none)."""
    k = trace.kernels
    ops = trace.ops
    out = np.full(len(ts), -1, np.int64)
    if len(k) and "op_slice_id" in k:
        kd = k[(k["device"] == device) & (k["op_slice_id"] >= 0)].sort_values("ts")
        if len(kd):
            i = np.searchsorted(kd["ts"].to_numpy(), ts, side="right") - 1
            ok = i >= 0
            out[ok] = kd["op_slice_id"].to_numpy()[i[ok]]
    missing = out < 0
    if missing.any() and len(ops):
        o = ops.sort_values("ts")
        i = np.searchsorted(o["ts"].to_numpy(), ts[missing], side="right") - 1
        got = np.where(i >= 0, o["id"].to_numpy()[np.maximum(i, 0)], -1)
        out[missing] = got
    return out


def memory_at_peak(trace: Trace) -> pd.DataFrame:
    """Ops (and their modules) holding memory at each device's peak, largest first."""
    tl = trace.memory_timeline()
    peaks = peak_memory(trace)
    rows = []
    ops = trace.ops.set_index("id") if len(trace.ops) else None
    for device, peak_bytes, peak_ts in peaks.itertuples(index=False):
        d = tl[(tl["device"] == device) & (tl["ts"] <= peak_ts)]
        values = d["in_use_bytes"].to_numpy(np.int64)
        delta = np.diff(np.r_[0, values])
        owner = _charge(trace, int(device), d["ts"].to_numpy(np.int64))
        held = pd.Series(delta).groupby(owner).sum()
        held = held[held > 0].sort_values(ascending=False)
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
