"""Device time per user annotation region (`record_function` ranges), nested.

A region is a host slice the user named: a `user_annotation` in a PyTorch-profiler
trace (`record_function`, `Optimizer.step#...`, the DataLoader's ranges), an `annotation`
in ours (`neuron_explorer.annotate`, `record_function`). ProfilerStep#N ranges are steps,
not regions (`Trace.breakdown` is per step). A kernel, copy or memset belongs to the
innermost region around its launch (the runtime call, or our op) on the launching
thread, as the profiler's own `gpu_user_annotation` ranges do.

Regions are grouped by their path (the names of the regions around them, outermost
first). HTA's `get_gpu_user_annotation_breakdown` sums each name's `gpu_user_annotation`
durations: the span from the first to the last kernel launched inside it, here
`device_span_ns`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

COLUMNS = ["path", "name", "depth", "count", "host_ns", "kernels", "device_ns",
           "device_total_ns", "device_span_ns", "share"]
PATH_SEPARATOR = " > "
REGION_CATEGORY = "user_annotation"  # PyTorch profiler's category of record_function ranges


def annotation_regions(trace: Trace, hta_window: bool = False) -> pd.DataFrame:
    """Per region path (`COLUMNS`): its name and depth (0: outermost region), count (of
    its ranges), host_ns (their time), kernels and device_ns (the work whose innermost
    region it is), device_total_ns (nested regions' work included), device_span_ns (per
    range, first start to last end of all that work), share (device_ns over all device
    work's). `hta_window`: over the ranges and kernels HTA keeps: launched in the trace,
    before the last ProfilerStep of a trace of two or more."""
    from neuron_explorer.analyses.kernel_sequences import launched
    from neuron_explorer.tables import innermost_in

    s = trace.table("slices")
    host_tracks = trace.tracks.loc[trace.tracks["device"] < 0, "track_id"].to_numpy()
    is_region = ((s["category"] == REGION_CATEGORY) | (s["kind"] == "annotation")) \
        & (s["kind"] != "step") & s["track_id"].isin(host_tracks)
    if hta_window and len(trace.steps) >= 2:
        is_region &= s["ts"] < int(trace.steps["ts"].max())
    region = is_region.to_numpy()
    ids = np.flatnonzero(region)
    if not len(ids):
        return pd.DataFrame(columns=COLUMNS)
    parent = s["parent_id"].to_numpy(np.int64)
    slot = np.full(len(s), -1, np.int64)  # slice id -> row of `ids`
    slot[ids] = np.arange(len(ids))
    outer = innermost_in(parent, region, parent[ids])  # each region's enclosing region
    outer_row = np.where(outer >= 0, slot[np.maximum(outer, 0)], -1)
    depth = np.where(outer_row < 0, 0, -1)
    path = s["name"].to_numpy(object)[ids]
    while (ready := (depth < 0) & (depth[np.maximum(outer_row, 0)] >= 0)).any():
        depth[ready] = depth[outer_row[ready]] + 1  # a level at a time, outer ones first
        path[ready] = path[outer_row[ready]] + PATH_SEPARATOR + path[ready]

    k = launched(trace, hta_window)
    dur = k["dur"].to_numpy(np.int64)
    start, end = k["ts"].to_numpy(np.int64), k["ts"].to_numpy(np.int64) + dur
    inner = innermost_in(parent, region, k["launch"].to_numpy(np.int64))
    own = np.where(inner >= 0, slot[np.maximum(inner, 0)], -1)  # row of each one's region
    n = len(ids)
    mine = own >= 0
    kernels = np.bincount(own[mine], minlength=n)
    self_ns, total_ns = np.zeros(n, np.int64), np.zeros(n, np.int64)
    np.add.at(self_ns, own[mine], dur[mine])
    first = np.full(n, np.iinfo(np.int64).max)
    last = np.full(n, np.iinfo(np.int64).min)
    cur = own.copy()
    while (live := cur >= 0).any():  # up through the regions around each kernel's
        np.add.at(total_ns, cur[live], dur[live])
        np.minimum.at(first, cur[live], start[live])
        np.maximum.at(last, cur[live], end[live])
        cur = np.where(live, outer_row[np.maximum(cur, 0)], -1)
    span = np.where(last >= first, last - first, 0)

    rows = pd.DataFrame({
        "path": path, "name": s["name"].to_numpy(object)[ids], "depth": depth,
        "host_ns": s["dur"].to_numpy(np.int64)[ids], "kernels": kernels,
        "device_ns": self_ns, "device_total_ns": total_ns,
        "device_span_ns": span, "range": ~_continued(trace, ids, path)})
    out = rows.groupby("path", sort=True).agg(
        name=("name", "first"), depth=("depth", "first"), count=("range", "sum"),
        host_ns=("host_ns", "sum"), kernels=("kernels", "sum"), device_ns=("device_ns", "sum"),
        device_total_ns=("device_total_ns", "sum"),
        device_span_ns=("device_span_ns", "sum")).reset_index()
    all_ns = float(dur.sum())
    out["share"] = out["device_ns"] / all_ns if all_ns > 0 else 0.0
    return out[COLUMNS]


def _continued(trace: Trace, ids: np.ndarray, path: np.ndarray) -> np.ndarray:
    """Which region slices of `ids` go on with a range the one before ended: our recorder
    splits a range still open at a step's end into one slice per step, the next starting
    at the step's start where the last ended, with the same args (a request around each
    model call, whose return ends a step, was counted twice: 64 requests for 32)."""
    s = trace.table("slices")
    if not len(trace.steps):
        return np.zeros(len(ids), bool)
    track = s["track_id"].to_numpy(np.int64)[ids].tolist()
    ts = s["ts"].to_numpy(np.int64)[ids]
    end = (ts + s["dur"].to_numpy(np.int64)[ids]).tolist()
    starts = set(trace.steps["ts"].astype("int64").tolist())
    ended: dict[tuple, int] = {}
    for i, k, p, e in zip(ids.tolist(), track, path.tolist(), end, strict=True):
        ended.setdefault((k, p, e), i)  # the first to end there: a piece of no length after
    out = np.zeros(len(ids), bool)
    for row, (i, k, p, t) in enumerate(zip(ids.tolist(), track, path.tolist(), ts.tolist(),
                                           strict=True)):
        before = ended.get((k, p, t)) if t in starts else None
        out[row] = before is not None and before != i and \
            trace.slice_args.get(before) == trace.slice_args.get(i)
    return out
