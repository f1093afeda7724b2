"""Time per kernel source line per engine: the line profile of NKI kernels.

NKI kernels' instructions carry the kernel line that issued them (their `source`
arg); this sums each line's instruction time per engine (DMA queues together) over
every run of the kernel in the trace.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer import trace_format as tf
from neuron_explorer.tables import ENGINES

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

ENGINE_COLUMNS = (*ENGINES, "dma")
COLUMNS = ["source", "file", "line", *(f"{e}_ns" for e in ENGINE_COLUMNS), "total_ns",
           "stall_ns", "instructions", "share"]


def kernel_lines(trace: Trace, kernel: object) -> pd.DataFrame:
    """One row per source line of `kernel` (its name, or the @nki.jit kernel itself):
    busy ns per engine, total, stall (how long the compute engines sat idle just before
    the line's instructions, waiting for their inputs), instruction count and share of
    the kernel's instruction time, in file and line order. Empty when the trace holds no engine-level records
    of the kernel."""
    name = kernel if isinstance(kernel, str) else getattr(kernel, "__name__", str(kernel))
    kernels = trace.kernels
    ids = kernels.loc[kernels["name"] == name, "kernel_id"].to_numpy()
    ins = trace.instructions
    ins = ins[np.isin(ins["kernel_id"].to_numpy(), ids)]
    if not len(ins):
        return pd.DataFrame(columns=COLUMNS)
    source = trace.slice_args.texts(tf.ARG_SOURCE, ins["id"].to_numpy())
    engine = np.where(pd.Series(ins["engine"]).str.startswith("dma").to_numpy(), "dma",
                      ins["engine"].to_numpy())
    starts = kernels.set_index("kernel_id")["ts"]
    frame = pd.DataFrame({"source": source, "engine": engine, "dur": ins["dur"].to_numpy(),
                          "stall": _stall(ins, starts)})
    frame = frame[frame["source"] != ""]
    busy = frame.pivot_table(index="source", columns="engine", values="dur", aggfunc="sum",
                             fill_value=0)
    out = pd.DataFrame(index=busy.index)
    for e in ENGINE_COLUMNS:
        out[f"{e}_ns"] = busy[e].astype(np.int64) if e in busy else 0
    out["total_ns"] = out[[f"{e}_ns" for e in ENGINE_COLUMNS]].sum(axis=1)
    compute = frame[frame["engine"] != "dma"]
    out["stall_ns"] = compute.groupby("source")["stall"].sum().reindex(out.index).fillna(
        0).astype(np.int64)
    out["instructions"] = frame.groupby("source").size()
    out["share"] = out["total_ns"] / max(int(out["total_ns"].sum()), 1)
    out = out.reset_index()
    parts = out["source"].str.rsplit(":", n=1)
    out["file"] = parts.str[0]
    out["line"] = pd.to_numeric(parts.str[1], errors="coerce").fillna(0).astype(np.int64)
    return out.sort_values(["file", "line"], ignore_index=True)[COLUMNS]


def _stall(ins: pd.DataFrame, kernel_start: pd.Series) -> np.ndarray:
    """Idle time of each instruction's engine (or DMA queue) just before it, within its
    kernel run: its start minus the latest end of the earlier ones (from kernel start)."""
    ts = ins["ts"].to_numpy()
    frame = pd.DataFrame({"kernel": ins["kernel_id"].to_numpy(),
                          "engine": ins["engine"].to_numpy(), "ts": ts,
                          "end": ts + ins["dur"].to_numpy()})  # positional index
    frame = frame.sort_values(["kernel", "engine", "ts"], kind="stable")
    prev = frame.groupby(["kernel", "engine"])["end"].transform(
        lambda end: end.shift(1).cummax())
    first = kernel_start.reindex(frame["kernel"].to_numpy()).to_numpy()
    prev = np.where(prev.isna().to_numpy(), first, prev.to_numpy())
    stall = np.zeros(len(frame), np.int64)
    stall[frame.index.to_numpy()] = np.maximum(frame["ts"].to_numpy() - prev, 0)
    return stall


def engine_profile(engine: np.ndarray, start: np.ndarray, end: np.ndarray,
                   duration: int) -> dict:
    """Busy % per engine (DMA: the union of its queues), how much of the DMA time
    overlaps compute, and the engine busiest for longest (the critical one)."""
    from neuron_explorer.analyses.intervals import Union

    busy = {}
    unions = {}
    for e in ENGINE_COLUMNS:
        keep = engine == e
        unions[e] = Union(start[keep], end[keep])
        busy[e] = unions[e].total
    compute = Union.of(*[(unions[e].starts, unions[e].ends) for e in ENGINES])
    both = Union.of((compute.starts, compute.ends), (unions["dma"].starts, unions["dma"].ends))
    overlap = compute.total + unions["dma"].total - both.total
    duration = max(int(duration), 1)
    return {"busy_pct": {e: 100.0 * v / duration for e, v in busy.items()},
            "dma_compute_overlap_pct": 100.0 * overlap / max(unions["dma"].total, 1),
            "critical_engine": max(busy, key=busy.get)}


def kernel_profile(trace: Trace, kernel: object) -> pd.DataFrame:
    """One row per run of `kernel`: duration, engine busy %, DMA/compute overlap %,
    SBUF/PSUM high-water marks and the critical engine."""
    name = kernel if isinstance(kernel, str) else getattr(kernel, "__name__", str(kernel))
    runs = trace.kernels[trace.kernels["name"] == name]
    ins = trace.instructions
    rows = []
    for run in runs.itertuples():
        mine = ins[ins["kernel_id"] == run.kernel_id]
        engine = np.where(mine["engine"].str.startswith("dma").to_numpy(), "dma",
                          mine["engine"].to_numpy())
        ts = mine["ts"].to_numpy()
        prof = engine_profile(engine, ts, ts + mine["dur"].to_numpy(), run.dur)
        rows.append({"kernel_id": run.kernel_id, "dur_ns": int(run.dur),
                     **{f"busy_{e}_pct": v for e, v in prof["busy_pct"].items()},
                     "dma_compute_overlap_pct": prof["dma_compute_overlap_pct"],
                     "sbuf_bytes": int(run.sbuf_bytes), "psum_bytes": int(run.psum_bytes),
                     "critical_engine": prof["critical_engine"]})
    return pd.DataFrame(rows)
