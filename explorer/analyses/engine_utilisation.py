"""How busy each engine is over time, in bins: utilisation = busy time / bin width.

Engine-level traces use the instructions on each engine and DMA queue. Without
instructions, a kernel's per-engine busy time is spread evenly over the kernel.
A trace with no engine data at all (PyTorch profiler) reports one pseudo-engine,
`device`: the time any kernel runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer.analyses.phases import in_analysed_work
from neuron_explorer.common.intervals import Union
from neuron_explorer.common.trace_format import ENGINE_DMA, ENGINES
from neuron_explorer.tables import map_unique

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

COLUMNS = ["ts", "device", "engine", "utilisation"]
DEFAULT_BINS = 200


def engine_family(engines: pd.Series) -> np.ndarray:
    """Engine names with every DMA queue as one `dma` engine."""
    return map_unique(engines, lambda e: "dma" if str(e).startswith("dma") else e)


def _family_codes(engines: pd.Series) -> tuple[np.ndarray, list[str]]:
    """`engine_family` as a code per row (-1 where none) into the families' names, from a
    categorical's codes where it is one (no name per row)."""
    if isinstance(engines.dtype, pd.CategoricalDtype):
        named = engine_family(pd.Series(engines.cat.categories, dtype=object))
        lookup, families = pd.factorize(named)
        codes = np.append(lookup, -1)[engines.cat.codes.to_numpy()]  # code -1: none
        return codes, [str(f) for f in families]
    codes, families = pd.factorize(engine_family(engines))
    return codes, [str(f) for f in families]


def _bins(lo: int, hi: int, bin_ns: int | None) -> tuple[np.ndarray, int]:
    span = max(hi - lo, 1)
    width = int(bin_ns) if bin_ns else max(span // DEFAULT_BINS, 1)
    return np.arange(lo, hi, width, dtype=np.int64), width


def _spread_busy(a: np.ndarray, b: np.ndarray, rate: np.ndarray, t: np.ndarray) -> np.ndarray:
    """F(t) = sum over intervals of rate * |[a, b) before t|, at each time of t.

    With R(t), S(t) the sums of rate and rate*x over interval edges x <= t:
    F(t) = t*R_a(t) - S_a(t) - (t*R_b(t) - S_b(t)); differences of F over bins give
    each bin's busy time without looping over kernels.
    """
    def part(edges: np.ndarray) -> np.ndarray:
        order = np.argsort(edges, kind="stable")
        x, r = edges[order].astype(np.float64), rate[order]
        cum_r = np.r_[0.0, np.cumsum(r)]
        cum_rx = np.r_[0.0, np.cumsum(r * x)]
        i = np.searchsorted(x, t, side="right")
        return t * cum_r[i] - cum_rx[i]

    return part(a) - part(b)


def engine_utilisation(trace: Trace, bin_ns: int | None = None) -> pd.DataFrame:
    """Utilisation per device, engine and time bin (0..1)."""
    k = trace.kernels
    ins = trace.instructions
    if not len(k) and not len(ins):
        return pd.DataFrame({c: pd.Series(dtype=object) for c in COLUMNS})
    source = ins if len(ins) else k
    lo = int(source["ts"].min())
    hi = int((source["ts"] + source["dur"]).max())
    starts, width = _bins(lo, hi, bin_ns)
    ends = starts + width
    frames = []
    device_of = source["device"].to_numpy()
    devices = sorted(pd.unique(device_of).tolist())
    if len(ins):
        # columns and index arrays, no frame per device and engine: copies of the
        # instructions' every column took 1.9 GB of a 20 M-slice trace's engines page
        ts = ins["ts"].to_numpy(np.int64)
        end = ts + ins["dur"].to_numpy(np.int64)
        family, families = _family_codes(ins["engine"])
    for device in devices:
        if len(ins):
            mine = device_of == device
            for code in np.argsort(families, kind="stable").tolist():
                at = np.flatnonzero(mine & (family == code))
                if len(at):
                    u = Union(ts[at], end[at])
                    frames.append((device, families[code], u.covered(starts, ends) / width))
            continue
        dk = k[k["device"] == device]
        k0 = dk["ts"].to_numpy(np.int64)
        k1 = k0 + dk["dur"].to_numpy(np.int64)
        has_engines = any(dk[f"busy_{e}"].sum() > 0 for e in (*ENGINES, ENGINE_DMA))
        if not has_engines:
            u = Union(k0, k1)
            frames.append((device, "device", u.covered(starts, ends) / width))
            continue
        for engine in (*ENGINES, ENGINE_DMA):
            busy = dk[f"busy_{engine}"].to_numpy(np.float64)
            rate = np.divide(busy, k1 - k0, out=np.zeros(len(busy)), where=k1 > k0)
            spread = _spread_busy(k0, k1, rate, np.r_[starts, ends[-1:]])
            frames.append((device, engine, np.minimum(np.diff(spread) / width, 1.0)))
    rows = [pd.DataFrame({"ts": starts, "device": device, "engine": engine, "utilisation": util})
            for device, engine, util in frames]
    return pd.concat(rows, ignore_index=True)[COLUMNS]


def engine_busy_totals(trace: Trace, analysed: bool = False) -> pd.DataFrame:
    """Total busy ns per device and engine over the whole trace, or (`analysed`) over the
    kernels of the analysed steps only (for per-step diffs)."""
    ins = trace.instructions
    kernels = trace.kernels
    if analysed and len(trace.steps):
        kernels = in_analysed_work(trace, kernels)
        if len(ins):
            ins = ins[ins["kernel_id"].isin(kernels["kernel_id"])]
    rows = []
    if len(ins):
        ts = ins["ts"].to_numpy(np.int64)
        end = ts + ins["dur"].to_numpy(np.int64)
        keys = pd.DataFrame({"device": ins["device"].to_numpy(),
                             "engine": engine_family(ins["engine"])})
        # row positions per (device, engine): no sub-frame per group
        for (device, engine), rows_of in sorted(keys.groupby(["device", "engine"]).indices.items()):
            rows.append((int(device), str(engine), Union(ts[rows_of], end[rows_of]).total))
    elif len(kernels):
        k = kernels
        for device, dk in k.groupby("device"):
            total = 0
            for engine in (*ENGINES, ENGINE_DMA):
                ns = int(dk[f"busy_{engine}"].sum())
                total += ns
                if ns:
                    rows.append((int(device), engine, ns))
            if not total:
                u = Union(dk["ts"].to_numpy(), (dk["ts"] + dk["dur"]).to_numpy())
                rows.append((int(device), "device", u.total))
    return pd.DataFrame(rows, columns=["device", "engine", "busy_ns"])


def shortened_by_tensor_cut(kernels: pd.DataFrame, cut: np.ndarray) -> np.ndarray:
    """How much each kernel (rows of `trace.kernels`) shortens with its Tensor Engine time
    cut by `cut`: down to its busiest other engine (DMA, Vector, Scalar, GpSimd) or the
    Tensor Engine's new time, at most. A DMA-bound program saves little of a faster
    Tensor Engine (a compiled CNN's bf16 estimate was 5.6x what bf16 saved; its padding
    was claimed at 55 us a step, and fixing it saved nothing)."""
    def busy(engine: str) -> np.ndarray:
        column = f"busy_{engine}"
        return (kernels[column].fillna(0).to_numpy(np.float64) if column in kernels
                else np.zeros(len(kernels)))

    cut = np.asarray(cut, np.float64)
    floor = np.maximum.reduce([busy(e) for e in (*ENGINES[1:], ENGINE_DMA)]
                              + [busy("tensor") - cut])
    return np.minimum(cut, np.maximum(kernels["dur"].to_numpy(np.float64) - floor, 0.0))
