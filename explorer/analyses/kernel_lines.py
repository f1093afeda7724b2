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
           "instructions", "share"]


def kernel_lines(trace: Trace, kernel: object) -> pd.DataFrame:
    """One row per source line of `kernel` (its name, or the @nki.jit kernel itself):
    busy ns per engine, total, instruction count and share of the kernel's instruction
    time, in file and line order. Empty when the trace holds no engine-level records
    of the kernel."""
    name = kernel if isinstance(kernel, str) else getattr(kernel, "__name__", str(kernel))
    kernels = trace.kernels
    ids = kernels.loc[kernels["name"] == name, "kernel_id"].to_numpy()
    ins = trace.instructions
    ins = ins[np.isin(ins["kernel_id"].to_numpy(), ids)]
    if not len(ins):
        return pd.DataFrame(columns=COLUMNS)
    source = trace.args.texts(tf.ARG_SOURCE, ins["id"].to_numpy())
    engine = np.where(pd.Series(ins["engine"]).str.startswith("dma").to_numpy(), "dma",
                      ins["engine"].to_numpy())
    frame = pd.DataFrame({"source": source, "engine": engine, "dur": ins["dur"].to_numpy()})
    frame = frame[frame["source"] != ""]
    busy = frame.pivot_table(index="source", columns="engine", values="dur", aggfunc="sum",
                             fill_value=0)
    out = pd.DataFrame(index=busy.index)
    for e in ENGINE_COLUMNS:
        out[f"{e}_ns"] = busy[e].astype(np.int64) if e in busy else 0
    out["total_ns"] = out[[f"{e}_ns" for e in ENGINE_COLUMNS]].sum(axis=1)
    out["instructions"] = frame.groupby("source").size()
    out["share"] = out["total_ns"] / max(int(out["total_ns"].sum()), 1)
    out = out.reset_index()
    parts = out["source"].str.rsplit(":", n=1)
    out["file"] = parts.str[0]
    out["line"] = pd.to_numeric(parts.str[1], errors="coerce").fillna(0).astype(np.int64)
    return out.sort_values(["file", "line"], ignore_index=True)[COLUMNS]
