"""Where each step's time goes, on the device and on the host.

Device side (partitions the step): compute time split by engine in proportion to
each kernel's engine busy time (`kernel` when the trace has no engine data),
`dma_only` (only copies or DMA running), and `idle`.
Host side (partitions the step, by priority): `sync` (waiting on the device),
`dataloader`, `compile`, `op_dispatch` (inside op calls), `python` (the rest).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer.analyses.levels import records_device
from neuron_explorer.analyses.phases import split_phases, training_windows
from neuron_explorer.analyses.steady_state import in_analysed_steps
from neuron_explorer.common.intervals import Union
from neuron_explorer.common.trace_format import ENGINES
from neuron_explorer.tables import kind_mask

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

COLUMNS = ["step", "side", "category", "ns", "share"]
HOST_CATEGORIES = ("sync", "dataloader", "compile", "op_dispatch", "python")
HOST_KINDS = {"sync": ("sync",), "dataloader": ("dataloader",), "compile": ("compile",),
              "op_dispatch": ("op", "runtime")}


def step_windows(trace: Trace) -> pd.DataFrame:
    """Steps to analyse (the steady state: `steady_state.select_steps`); a trace without
    steps is one window over its whole span. In a run that trains and also evaluates or
    generates, the training steps alone, without the eval passes recorded in them."""
    if len(trace.steps):
        if split_phases(trace):
            return in_analysed_steps(trace, training_windows(trace))
        return in_analysed_steps(trace, trace.steps)[["step", "ts", "dur"]]
    s = trace.table("slices")
    if not len(s):
        return pd.DataFrame({"step": [], "ts": [], "dur": []}, dtype="int64")
    lo = int(s["ts"].min())
    hi = int((s["ts"] + s["dur"]).max())
    return pd.DataFrame({"step": [-1], "ts": [lo], "dur": [hi - lo]})


def counted_steps(trace: Trace) -> int:
    """How many steps the per-step figures divide by: the analysed windows (`step_windows`),
    in a run that also evaluates or samples its training steps alone; 0 without steps.
    Counting the sampling steps too, a diffusion run's findings divided 9 training steps'
    time by 17."""
    return len(step_windows(trace)) if len(trace.steps) else 0


def _spans(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    ts = frame["ts"].to_numpy(np.int64)
    return ts, ts + frame["dur"].to_numpy(np.int64)


def is_dma_kernel(k: pd.DataFrame) -> np.ndarray:
    """Kernels that only move data: copies/memsets, or busy only on DMA queues."""
    compute = sum(k[f"busy_{e}"].to_numpy() for e in ENGINES)
    return (k["kind"].to_numpy() != "kernel") | ((compute == 0) & (k["busy_dma"].to_numpy() > 0))


def host_slices(trace: Trace) -> pd.DataFrame:
    """Slices on host tracks."""
    host_tracks = trace.tracks.loc[trace.tracks["device"] < 0, "track_id"]
    s = trace.table("slices")
    return s[s["track_id"].isin(host_tracks)]


def _device_rows(trace: Trace, win: pd.DataFrame) -> list[tuple]:
    """Device categories per step; with several devices, the mean device (two devices each
    busy half the step are half idle, not fully busy together)."""
    k = trace.kernels
    devices = k["device"].unique() if len(k) else []
    if len(devices) <= 1:
        return _rows_of_one_device(k, win)
    per_device = pd.DataFrame(
        [row for d in devices for row in _rows_of_one_device(k[k["device"] == d], win)],
        columns=["step", "side", "category", "ns"])
    mean = per_device.groupby(["step", "side", "category"], sort=False)["ns"].sum()
    rows: list[tuple] = []
    for (st, side, category), total in mean.items():
        rows.append((st, side, category, int(total) // len(devices)))
    # keep each step's parts summing to the step: the rounding goes to the largest part
    frame = pd.DataFrame(rows, columns=["step", "side", "category", "ns"])
    dur = dict(zip(win["step"], win["dur"], strict=True))
    for st, part in frame.groupby("step", sort=False):
        missing = int(dur[st]) - int(part["ns"].sum())
        if missing:
            frame.loc[part["ns"].idxmax(), "ns"] += missing
    return list(frame.itertuples(index=False, name=None))


def _rows_of_one_device(k: pd.DataFrame, win: pd.DataFrame) -> list[tuple]:
    a = win["ts"].to_numpy(np.int64)
    b = a + win["dur"].to_numpy(np.int64)
    rows: list[tuple] = []
    steps = win["step"].to_numpy()
    if not len(k):
        for st, d in zip(steps, b - a, strict=True):
            rows.append((st, "device", "idle", int(d)))
        return rows
    dma = is_dma_kernel(k)
    comp_u = Union(*_spans(k[~dma]))
    all_u = Union(*_spans(k))
    compute = comp_u.covered(a, b)
    dma_only = all_u.covered(a, b) - compute
    idle = (b - a) - all_u.covered(a, b)
    ck = k[~dma]
    engine_cols = [f"busy_{e}" for e in ENGINES]
    busy = ck[engine_cols].to_numpy(np.float64)
    has_engines = busy.sum() > 0
    by_start = np.argsort(ck["ts"].to_numpy(), kind="stable")
    k0, k1 = (x[by_start] for x in _spans(ck))
    busy = busy[by_start]
    longest = int((k1 - k0).max()) if len(k0) else 0
    for i, st in enumerate(steps):
        if has_engines and compute[i] > 0:
            # only kernels that can overlap the step: starting in [a - longest, b)
            lo, hi = np.searchsorted(k0, [a[i] - longest, b[i]])
            s0, s1 = k0[lo:hi], k1[lo:hi]
            overlap = np.clip(np.minimum(s1, b[i]) - np.maximum(s0, a[i]), 0, None)
            frac = np.divide(overlap, s1 - s0, out=np.zeros(len(s0)), where=(s1 > s0))
            weights = (busy[lo:hi] * frac[:, None]).sum(axis=0)
            split = weights / weights.sum() * compute[i] if weights.sum() else weights
            parts = np.floor(split).astype(np.int64)
            parts[int(np.argmax(split))] += int(compute[i] - parts.sum())  # keep the sum exact
            for e, ns in zip(ENGINES, parts.tolist(), strict=True):
                rows.append((st, "device", e, ns))
        elif has_engines:  # no compute in this step: zero for every engine
            rows.extend((st, "device", e, 0) for e in ENGINES)
        else:
            rows.append((st, "device", "kernel", int(compute[i])))
        rows.append((st, "device", "dma_only", int(dma_only[i])))
        rows.append((st, "device", "idle", int(idle[i])))
    return rows


def _host_rows(trace: Trace, win: pd.DataFrame) -> list[tuple]:
    a = win["ts"].to_numpy(np.int64)
    b = a + win["dur"].to_numpy(np.int64)
    # masks over all slices: cached kind codes, no frame of host slices, no string compares
    s = trace.table("slices")
    host_tracks = trace.tracks.loc[trace.tracks["device"] < 0, "track_id"].to_numpy()
    host = np.isin(s["track_id"].to_numpy(), host_tracks)
    ts = s["ts"].to_numpy(np.int64)
    end = ts + s["dur"].to_numpy(np.int64)
    spans: list[tuple[np.ndarray, np.ndarray]] = []
    previous = np.zeros(len(a), np.int64)
    rows: list[tuple] = []
    per_cat: dict[str, np.ndarray] = {}
    for cat in HOST_CATEGORIES[:-1]:
        m = host & kind_mask(trace, HOST_KINDS[cat])
        spans.append((ts[m], end[m]))
        cov = Union.of(*spans).covered(a, b)
        per_cat[cat] = cov - previous
        previous = cov
    per_cat["python"] = (b - a) - previous
    for i, st in enumerate(win["step"].to_numpy()):
        for cat in HOST_CATEGORIES:
            rows.append((st, "host", cat, int(per_cat[cat][i])))
    return rows


def breakdown(trace: Trace) -> pd.DataFrame:
    """Long-form breakdown of every analysed step: step, side, category, ns, share of the
    step (no device rows at `--level framework`, which records no device work)."""
    win = step_windows(trace)
    if not len(win):
        return pd.DataFrame({c: pd.Series(dtype="float64" if c == "share" else
                                          ("int64" if c in ("step", "ns") else object))
                             for c in COLUMNS})
    device = _device_rows(trace, win) if records_device(trace) else []  # not: 100% idle
    rows = device + _host_rows(trace, win)
    frame = pd.DataFrame(rows, columns=COLUMNS[:4])
    frame["step"] = frame["step"].astype("int64")
    frame["ns"] = frame["ns"].astype("int64")
    dur = win.set_index("step")["dur"]
    denom = dur.reindex(frame["step"]).to_numpy(np.float64)
    frame["share"] = np.divide(frame["ns"].to_numpy(np.float64), denom,
                               out=np.zeros(len(frame)), where=denom > 0)
    return frame
