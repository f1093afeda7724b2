"""The trace's counter series, one summary row per series: the counter tracks it recorded
(HBM in use, SBUF occupancy, engine utilisation in ours; whatever counters a
PyTorch-profiler trace recorded), the bandwidth of its copies and memsets per kind (HTA's
memory-bandwidth series) and the CUPTI counters of its profiled kernels (HTA's counter
data with operators).

A counter holds its value until its next sample, so its mean over time weights each
sample by how long it held.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

COLUMNS = ["series", "track_id", "device", "samples", "first_ts", "last_ts", "min", "max",
           "mean", "time_weighted_mean", "last"]
SERIES_COLUMNS = ["series", "track_id", "device", "ts", "value"]
BANDWIDTH_COLUMNS = ["device", "copy", "ts", "gbps"]
CUPTI_RANGE = "cuda_profiler_range"  # the category of a CUPTI range profiler's kernels
BANDWIDTH_ARG = "memory bandwidth (GB/s)"  # Kineto's, on each copy and memset
# FLOPs per executed SASS instruction counted by the range profiler (an FMA is two)
SASS_FLOPS = {f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum": 2 if "fma" in op else 1
              for op in ("ffma", "fmul", "fadd", "hfma", "hmul", "hadd", "dfma", "dmul", "dadd")}


def counter_series(trace: Trace) -> pd.DataFrame:
    """Every counter series as samples (`SERIES_COLUMNS`): the trace's counter tracks;
    each copy kind's bandwidth (GB/s, `copy_bandwidth`), track_id -1; each CUPTI counter
    over the profiled kernels (its value from a kernel's start, 0 from its end)."""
    counters = trace.counters
    device = trace.tracks.set_index("track_id")["device"]
    frames = [pd.DataFrame({
        "series": counters["name"].astype(str), "track_id": counters["track_id"],
        "device": counters["track_id"].map(device).fillna(-1).astype(np.int64),
        "ts": counters["ts"], "value": counters["value"].astype(np.float64)})]
    bandwidth = trace.copy_bandwidth()
    if len(bandwidth):
        frames.append(pd.DataFrame({
            "series": bandwidth["copy"] + " bandwidth (GB/s)", "track_id": -1,
            "device": bandwidth["device"], "ts": bandwidth["ts"], "value": bandwidth["gbps"]}))
    kernels = trace.cupti_counters()
    if len(kernels):
        names = [c for c in kernels.columns if c not in CUPTI_COLUMNS]
        for name in names:  # ends first: a kernel starting as the last ends holds its own
            for ts, value in ((kernels["ts"] + kernels["dur"], 0.0 * kernels[name]),
                              (kernels["ts"], kernels[name])):
                frames.append(pd.DataFrame({
                    "series": name, "track_id": kernels["track_id"],
                    "device": kernels["device"], "ts": ts, "value": value}))
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame(columns=SERIES_COLUMNS)
    every = pd.concat(frames, ignore_index=True)
    every["ts"] = every["ts"].astype(np.int64)
    every["track_id"] = every["track_id"].astype(np.int64)
    return every.sort_values(["series", "device", "track_id", "ts"],
                             kind="stable").reset_index(drop=True)[SERIES_COLUMNS]


def counter_summary(trace: Trace) -> pd.DataFrame:
    """Per counter series (`COLUMNS`, of `counter_series`): its device (-1: the host),
    samples, the times of its first and last sample, min, max, mean over samples, mean
    over time (each value held until the next sample; the last one held for none) and
    its last value."""
    c = counter_series(trace)
    if not len(c):
        return pd.DataFrame(columns=COLUMNS)
    rows = []
    for (name, dev, track), part in c.groupby(["series", "device", "track_id"], sort=True):
        ts = part["ts"].to_numpy(np.int64)
        value = part["value"].to_numpy(np.float64)
        held = np.diff(ts)
        span = float(held.sum())
        weighted = float((value[:-1] * held).sum() / span) if span > 0 else float(value.mean())
        rows.append((name, int(track), int(dev), len(part), int(ts[0]),
                     int(ts[-1]), float(value.min()), float(value.max()),
                     float(value.mean()), weighted, float(value[-1])))
    return pd.DataFrame(rows, columns=COLUMNS)


def copy_kind(name: str, kind: str) -> str:
    """HTA's name for a copy's kind: `Memset`, or the name's first 11 characters
    (`Memcpy HtoD`, `Memcpy DtoH`, `Memcpy DtoD`...); `Memcpy` for one named otherwise."""
    if kind == "memset" or name.startswith("Memset"):
        return "Memset"
    return name[:11] if name.startswith("Memcpy") else "Memcpy"


def copy_bandwidth(trace: Trace, hta_window: bool = False) -> pd.DataFrame:
    """Per device and copy kind, the bandwidth its copies (or memsets) use over time, GB/s
    (`BANDWIDTH_COLUMNS`): each copy adds its own from its start to its end (the trace's
    `memory bandwidth (GB/s)` where Kineto wrote it, else bytes over duration), a sample
    at each start and end (HTA's `get_memory_bw_time_series`; `hta_window`: the copies
    HTA keeps, launched before the last step)."""
    from neuron_explorer.analyses.communication import collectives, hta_kept

    k = trace.kernels
    if hta_window:
        k, _ = hta_kept(trace, k, collectives(trace))
    copies = k[k["kind"].isin(["memcpy", "memset"]) & (k["dur"] > 0)]
    size = copies["bytes"].fillna(0).to_numpy(np.float64)
    # a copy of unknown size adds nothing (Kineto writes its bytes beside its bandwidth)
    copies, size = copies[size > 0], size[size > 0]
    if not len(copies):  # (reading args decodes them all: not for none)
        return pd.DataFrame(columns=BANDWIDTH_COLUMNS)
    written = trace.slice_args.numbers(BANDWIDTH_ARG, copies["id"].to_numpy(np.int64),
                                       default=np.nan, dtype="float64")
    rate = np.where(np.isnan(written), size / copies["dur"].to_numpy(np.float64), written)
    kinds = [copy_kind(str(n), str(kd)) for n, kd in
             zip(copies["name"], copies["kind"], strict=True)]
    ts = copies["ts"].to_numpy(np.int64)
    end = ts + copies["dur"].to_numpy(np.int64)
    dev = copies["device"].to_numpy(np.int64)
    events = pd.DataFrame({
        "device": np.concatenate([dev, dev]), "copy": kinds + kinds,
        "ts": np.concatenate([ts, end]), "delta": np.concatenate([rate, -rate]),
        "order": np.concatenate([np.ones(len(ts)), np.zeros(len(ts))])})
    # a copy that ends as the next begins does not add to it: ends first at a tie
    events = events.sort_values(["device", "copy", "ts", "order"], kind="stable")
    events["gbps"] = events.groupby(["device", "copy"])["delta"].cumsum()
    events.loc[events["gbps"].abs() < 1e-9, "gbps"] = 0.0
    return events[BANDWIDTH_COLUMNS].reset_index(drop=True)


CUPTI_COLUMNS = ["id", "ts", "dur", "name", "track_id", "device", "launch", "top_level_op",
                 "bottom_level_op", "flops"]


def cupti_counters(trace: Trace) -> pd.DataFrame:
    """One row per kernel profiled by the CUPTI range profiler (`cuda_profiler_range`
    slices; `CUPTI_COLUMNS`, then one column per counter): the kernel, the launch call it
    pairs with (the n-th `cudaLaunchKernel` for the n-th kernel, as HTA pairs them; -1
    when the counts differ), the outermost and innermost ops around that call, and the
    FLOPs the SASS instruction counters give (NaN without them)."""
    s = trace.table("slices")  # without the args: only the ranges' are read
    # compared as categoricals: a string per slice took 1 GB of a 10 M-slice report
    ranges = s[(s["category"] == CUPTI_RANGE).to_numpy(bool)].sort_values("ts", kind="stable")
    if not len(ranges):
        return pd.DataFrame(columns=CUPTI_COLUMNS)
    values: list[dict[str, float]] = []
    for i in ranges["id"]:
        args = trace.slice_args.get(int(i))
        values.append({key: float(v) for key, v in args.items() if _is_number(v)}
                      if isinstance(args, dict) else {})
    counters = sorted({key for v in values for key in v})
    launches = s[((s["kind"] == "runtime") & (s["name"] == "cudaLaunchKernel")).to_numpy(bool)
                 ].sort_values("ts", kind="stable")
    paired = len(launches) == len(ranges)
    launch_ids = launches["id"].to_numpy(np.int64) if paired else np.full(len(ranges), -1)
    ops = [_op_stack(s, int(i)) if i >= 0 else [] for i in launch_ids]
    tracks = trace.tracks.set_index("track_id")
    # Kineto writes a device's events under the device's index as their pid
    device = tracks["device"].where(tracks["device"] >= 0, tracks["pid"])
    frame = pd.DataFrame({
        "id": ranges["id"].to_numpy(np.int64), "ts": ranges["ts"].to_numpy(np.int64),
        "dur": ranges["dur"].to_numpy(np.int64), "name": ranges["name"].astype(str).to_numpy(),
        "track_id": ranges["track_id"].to_numpy(np.int64),
        "device": ranges["track_id"].map(device).fillna(-1).astype(np.int64).to_numpy(),
        "launch": launch_ids, "top_level_op": [o[0] if o else "" for o in ops],
        "bottom_level_op": [o[-1] if o else "" for o in ops]})
    for key in counters:
        frame[key] = [v.get(key, np.nan) for v in values]
    sass = [key for key in counters if key in SASS_FLOPS]
    frame["flops"] = (sum(frame[key] * SASS_FLOPS[key] for key in sass) if sass
                      else np.nan)
    return frame[CUPTI_COLUMNS + counters]


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _op_stack(slices: pd.DataFrame, launch: int) -> list[str]:
    """The names of the ops (outermost first) around slice `launch`."""
    names: list[str] = []
    parent = int(slices.at[launch, "parent_id"])
    while parent >= 0:
        if str(slices.at[parent, "kind"]) == "op":
            names.append(str(slices.at[parent, "name"]))
        parent = int(slices.at[parent, "parent_id"])
    return names[::-1]


QUEUE_COUNTER = "Queue Length"  # HTA's counter names in its counters-augmented trace
BANDWIDTH_COUNTER = "Memcpy BW"


def write_with_counters(trace: Trace, path: str, hta_window: bool = False) -> str:
    """A copy of a PyTorch-profiler JSON trace with two series added as counter events,
    as HTA's `generate_trace_with_counters` adds them (for Perfetto or chrome://tracing):
    each stream's queue length (`queue_length`, a counter `Queue Length (<stream>)`) and
    each copy kind's bandwidth (`copy_bandwidth`, `<kind> bandwidth (GB/s)`), under the
    device's pid. One series per counter name, where HTA tells its streams apart by an
    `id` that not every reader keeps. Written to `path` (gzipped if it ends in `.gz`);
    returns it. A trace that is no JSON event list (our .pftrace recordings: their
    counters are in the trace already, and queue length is a table) is refused."""
    import gzip
    import json

    from neuron_explorer.common.errors import NeuronExplorerError

    refused = NeuronExplorerError(
        f"{trace.path or 'this trace'} is not a PyTorch-profiler JSON trace: only those get "
        "HTA's counters-augmented copy (queue length and copy bandwidth are tables here: "
        "trace.queue_length(), trace.copy_bandwidth())")
    if not trace.path:
        raise refused
    with open(trace.path, "rb") as f:
        data = f.read()
    try:  # the file itself says what it is (a .pftrace is no JSON)
        raw = json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
    except (ValueError, OSError):
        raise refused from None
    events = raw.get("traceEvents") if isinstance(raw, dict) else raw
    if not isinstance(events, list):
        raise refused
    tracks = trace.tracks.set_index("track_id")
    added = []
    for (stream, track), part in trace.queue_length(hta_window).groupby(
            ["stream", "track_id"], sort=True):
        pid = tracks.at[track, "pid"]
        added += [{"ph": "C", "name": f"{QUEUE_COUNTER} ({stream})", "pid": pid, "ts": _us(ts),
                   "args": {QUEUE_COUNTER: int(value)}}
                  for ts, value in zip(part["ts"], part["queue_length"], strict=True)]
    device_pid = tracks[tracks["device"] >= 0].groupby("device")["pid"].first()
    for (device, copy), part in copy_bandwidth(trace, hta_window).groupby(
            ["device", "copy"], sort=True):
        pid = device_pid.get(device, device)
        added += [{"ph": "C", "name": f"{copy} bandwidth (GB/s)", "pid": pid, "ts": _us(ts),
                   "args": {BANDWIDTH_COUNTER: float(value)}}
                  for ts, value in zip(part["ts"], part["gbps"], strict=True)]
    for event in added:  # numpy scalars are not JSON
        event["pid"] = event["pid"].item() if hasattr(event["pid"], "item") else event["pid"]
    events.extend(added)
    text = json.dumps(raw).encode()
    with open(path, "wb") as f:
        f.write(gzip.compress(text) if str(path).endswith(".gz") else text)
    return str(path)


def _us(ts_ns: Any) -> int | float:
    """A time in ns as the JSON trace's us: whole where it is."""
    ts_ns = int(ts_ns)
    return ts_ns // 1000 if ts_ns % 1000 == 0 else ts_ns / 1000
