"""Arithmetic intensity and roofline class of each op on the trace's hardware.

Intensity = FLOPs / HBM bytes. Below the ridge point (peak FLOP/s / peak bytes/s)
an op is memory-bound: more FLOPs per byte, not a faster engine, would speed it
up. The peak used is the one of the op's dtype when known (FP32 matmuls run at a
quarter of BF16 on the Tensor Engine); a compiled graph's dtype is the mix of its
matmuls' dtypes ("bfloat16+float32"), its peak that of the most used.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer.analyses.compiled_sections import matmul_dtype_mix
from neuron_explorer.analyses.phases import in_analysed_work
from neuron_explorer.peaks import hbm_bandwidth, peak_flops
from neuron_explorer.tables import map_unique

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

COLUMNS = ["name", "dtype", "count", "flops", "bytes", "intensity", "dur",
           "achieved_flops_per_s", "attainable_flops_per_s", "ridge", "bound"]
_DTYPE = re.compile(r"(bfloat16|float16|float32|float8_\w+|float64)")


def main_dtype(dtypes: str) -> str:
    """The first floating dtype in an op's dtypes string ('' when none)."""
    m = _DTYPE.search(dtypes or "")
    return m.group(1) if m else ""


def roofline(trace: Trace) -> pd.DataFrame:
    """Per (op name, dtype): totals, intensity, achieved and attainable FLOP/s, bound."""
    ops = in_analysed_work(trace, trace.ops)
    if not len(ops):
        return pd.DataFrame({c: pd.Series(dtype=object) for c in COLUMNS})
    ops = ops.assign(dtype=map_unique(ops["dtypes"], main_dtype))
    mix = matmul_dtype_mix(trace)
    if mix:  # a compiled graph: the dtypes of its matmuls, not of its first input
        graph_dtype = ops["kernel_id"].map(mix)
        ops["dtype"] = graph_dtype.where(graph_dtype.notna(), ops["dtype"])
    g = ops.groupby(["name", "dtype"], sort=False).agg(
        count=("id", "size"), flops=("flops", "sum"), bytes=("bytes", "sum"),
        dur=("device_dur", "sum")).reset_index()
    figures = trace.hardware_figures
    bw = hbm_bandwidth(figures)
    flops = g["flops"].to_numpy(np.float64)
    nbytes = g["bytes"].to_numpy(np.float64)
    dur_s = g["dur"].to_numpy(np.float64) / 1e9
    g["intensity"] = np.divide(flops, nbytes, out=np.full(len(g), np.nan), where=nbytes > 0)
    g["achieved_flops_per_s"] = np.divide(flops, dur_s, out=np.full(len(g), np.nan),
                                          where=dur_s > 0)
    # a mix's peak is its most used dtype's (the first named)
    peaks = np.array([peak_flops(figures, d.split("+")[0] or "bfloat16") or np.nan
                      for d in g["dtype"]], np.float64)
    g["ridge"] = peaks / bw if bw else np.nan
    g["attainable_flops_per_s"] = (np.minimum(peaks, g["intensity"].to_numpy() * bw)
                                   if bw else np.nan)
    intensity = g["intensity"].to_numpy()
    ridge = g["ridge"].to_numpy(np.float64)
    known = ~np.isnan(intensity) & ~np.isnan(ridge) & (flops > 0)
    g["bound"] = np.where(known, np.where(intensity < ridge, "memory", "compute"), "unknown")
    g.loc[(flops == 0) & (nbytes > 0), "bound"] = "memory"
    return g.sort_values("dur", ascending=False, ignore_index=True)[COLUMNS]
