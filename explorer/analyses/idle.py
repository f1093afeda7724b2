"""Why the device sits idle: each gap between device activity, with its cause.

For a gap on a device, in order of precedence:
- `data`: the host was waiting for the next batch during the gap;
- `compile`: the host was compiling during the gap;
- `sync`: the host had just waited on the device (a sync ended at the gap's start
  or inside it), so nothing was queued;
- `host_launch`: the kernel after the gap was launched after the gap began: the
  device waited on the host to launch work (host-bound). Where the kernel then still
  waited longer than that, and more than `QUEUED_SPLIT_NS`, for something else (queued
  behind a collective waiting for another rank), the gap is two rows: `host_launch` up
  to the launch's return, `dependency` after it;
- `dependency`: the next kernel was already launched but had to wait (on inputs,
  a launch latency, a copy).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer.analyses.phases import in_analysed_work
from neuron_explorer.analyses.step_breakdown import host_slices, step_windows
from neuron_explorer.common.intervals import Union
from neuron_explorer.tables import assign_steps, launch_calls

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

COLUMNS = ["device", "ts", "dur", "step", "reason", "next_kernel_id", "next_slice_id",
           "launch_ts"]
REASONS = ("data", "compile", "sync", "host_launch", "dependency")
# a launched kernel that waits longer than this after its launch returned is waiting on
# something other than the host (launch latencies are microseconds)
QUEUED_SPLIT_NS = 50_000


def launch_ends(trace: Trace, k: pd.DataFrame) -> np.ndarray:
    """Host time each kernel's launch returned: the end of the runtime call that launched
    it, else of its op (-1: unknown). A kernel waits for its launch until then at most:
    the host's time inside the call (a first cuDNN call's set-up) is the host's work."""
    s = trace.table("slices")
    end = (s["ts"] + s["dur"]).to_numpy()
    call = launch_calls(trace, k["kernel_id"].to_numpy(np.int64))
    op_slice = k["op_slice_id"].to_numpy(np.int64)
    launch = np.where(op_slice >= 0, end[np.maximum(op_slice, 0)], -1)
    return np.where(call >= 0, end[np.maximum(call, 0)], launch).astype(np.int64)


def launch_times(trace: Trace, k: pd.DataFrame) -> np.ndarray:
    """Host time each kernel was launched: the runtime call that launched it, where the
    trace records those calls (PyTorch-profiler traces), else its op's start (-1: unknown)."""
    s_ts = trace.table("slices")["ts"].to_numpy()
    call = launch_calls(trace, k["kernel_id"].to_numpy(np.int64))
    op_slice = k["op_slice_id"].to_numpy(np.int64)
    launch = np.where(op_slice >= 0, s_ts[np.maximum(op_slice, 0)], -1)
    return np.where(call >= 0, s_ts[np.maximum(call, 0)], launch).astype(np.int64)


def idle_gaps(trace: Trace) -> pd.DataFrame:
    """Every idle gap inside the analysed steps, per device, with its reason."""
    k = trace.kernels
    if not len(k):
        return idle_gaps_empty()
    win = step_windows(trace)
    if not len(win):
        return idle_gaps_empty()
    lo = int(win["ts"].min())
    hi = int((win["ts"] + win["dur"]).max())
    hs = host_slices(trace)
    unions = {kind: Union(hs.loc[hs["kind"] == kind, "ts"].to_numpy(),
                          (hs.loc[hs["kind"] == kind, "ts"] + hs.loc[hs["kind"] == kind, "dur"])
                          .to_numpy()) for kind in ("dataloader", "compile")}
    syncs = hs[hs["kind"] == "sync"]
    sync_end = np.sort((syncs["ts"] + syncs["dur"]).to_numpy(np.int64))
    launch_all = launch_times(trace, k)
    launch_end_all = launch_ends(trace, k)
    rows = []
    for device, kd in k.groupby("device"):
        u = Union(kd["ts"].to_numpy(), (kd["ts"] + kd["dur"]).to_numpy())
        g0, g1 = u.gaps(lo, hi)
        if not len(g0):
            continue
        # kernel starting at each gap's end
        ks = kd.sort_values("ts")
        pos = np.searchsorted(ks["ts"].to_numpy(), g1, side="left")
        pos = np.minimum(pos, len(ks) - 1)
        nxt = ks.index.to_numpy()[pos]
        launch = launch_all[nxt]
        dur = g1 - g0
        data = unions["dataloader"].covered(g0, g1) * 2 >= dur
        comp = unions["compile"].covered(g0, g1) * 2 >= dur
        j = np.searchsorted(sync_end, g0, side="left")
        sync = (j < len(sync_end)) & (sync_end[np.minimum(j, max(len(sync_end) - 1, 0))] <= g1) \
            if len(sync_end) else np.zeros(len(g0), bool)
        host = launch >= g0
        reason = np.select([data, comp, sync, host], list(REASONS[:4]), default="dependency")
        # a kernel launched early in the gap that then waited on something else
        returned = launch_end_all[nxt]
        queued = ((reason == "host_launch") & (returned > g0)
                  & (g1 - returned > np.maximum(returned - g0, QUEUED_SPLIT_NS)))
        cut = np.where(queued, returned, g1)
        frame = pd.DataFrame({
            "device": int(device), "ts": g0, "dur": cut - g0, "reason": reason,
            "next_kernel_id": k.loc[nxt, "kernel_id"].to_numpy(np.int64),
            "next_slice_id": k.loc[nxt, "id"].to_numpy(np.int64), "launch_ts": launch})
        rest = frame[queued].assign(ts=cut[queued], dur=(g1 - cut)[queued],
                                    reason="dependency")
        frame = pd.concat([frame, rest], ignore_index=True).sort_values("ts", kind="stable")
        rows.append(frame.assign(step=assign_steps(frame["ts"].to_numpy(), trace.steps)))
    if not rows:
        return idle_gaps_empty()
    gaps = pd.concat(rows, ignore_index=True)[COLUMNS]
    # an eval pass inside a training step is no part of it (a gap running into the
    # training part counts from the part's start)
    return in_analysed_work(trace, gaps, clip=True).reset_index(drop=True)


def idle_gaps_empty() -> pd.DataFrame:
    """The gap table with no rows."""
    return pd.DataFrame({c: pd.Series(dtype=object if c == "reason" else "int64")
                         for c in COLUMNS})


def idle_summary(trace: Trace) -> pd.DataFrame:
    """Idle time per reason: reason, ns, gaps, share of the analysed step time."""
    gaps = trace.idle_reasons()
    total = float(step_windows(trace)["dur"].sum()) or 1.0
    agg = gaps.groupby("reason")["dur"].agg(["sum", "size"]).reindex(REASONS, fill_value=0)
    return pd.DataFrame({"reason": list(REASONS), "ns": agg["sum"].to_numpy(np.int64),
                         "gaps": agg["size"].to_numpy(np.int64),
                         "share": agg["sum"].to_numpy(np.float64) / total})
