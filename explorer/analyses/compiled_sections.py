"""What each compiled graph runs, section by section, named as the user wrote it.

A `torch.compile(backend="neuron")` graph runs as one program whose instructions
say which section (fused group) they belong to, its aten op(s), and what the user's
code called to make them (`LayerNorm`, `F.layer_norm`, `torch.softmax`): the module
type or torch function Dynamo recorded, so `aten::native_layer_norm` reads as the
`nn.LayerNorm` it came from.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer.trace_format import (
    ARG_KERNEL_ID,
    ARG_MODULE,
    ARG_OPS,
    ARG_SECTION,
    ARG_SOURCE,
    ARG_WRITTEN,
    CAT_DMA,
    CAT_INSTRUCTION,
)

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

COLUMNS = ["graph", "section", "written", "ops", "module", "source", "runs", "instructions",
           "engine_ns"]


def compiled_sections(trace: Trace) -> pd.DataFrame:
    """One row per (graph, section): what it runs (`written`: the user's call, `ops`: the aten
    ops), where (`module`, `source`), how often the graph ran (`runs`), its instructions per
    run and its engine time per run (ns, summed over engines and DMA queues), in program order."""
    slices = trace.table("slices")
    if not len(slices):
        return pd.DataFrame(columns=COLUMNS)
    rows = slices[slices["category"].isin([CAT_INSTRUCTION, CAT_DMA])]
    ids = rows["id"].to_numpy(np.int64)
    args = trace.slice_args
    section = args.texts(ARG_SECTION, ids)
    keep = section != ""
    if not keep.any():
        return pd.DataFrame(columns=COLUMNS)
    ids = ids[keep]
    kernel_id = args.numbers(ARG_KERNEL_ID, ids, default=-1).astype(np.int64)
    names = dict(zip(trace.kernels["kernel_id"], trace.kernels["name"], strict=False))
    frame = pd.DataFrame({
        "graph": [names.get(k, f"kernel {k}") for k in kernel_id],
        "kernel_id": kernel_id,
        "section": section[keep],
        "written": args.texts(ARG_WRITTEN, ids),
        "ops": args.texts(ARG_OPS, ids),
        "module": args.texts(ARG_MODULE, ids),
        "source": args.texts(ARG_SOURCE, ids),
        "ts": rows["ts"].to_numpy(np.int64)[keep],
        "dur": rows["dur"].to_numpy(np.int64)[keep],
    })
    keys = ["graph", "section", "written", "ops", "module", "source"]
    out = frame.groupby(keys, sort=False).agg(
        runs=("kernel_id", "nunique"), instructions=("dur", "size"), engine_ns=("dur", "sum"),
        first=("ts", "min")).reset_index()
    out["instructions"] = out["instructions"] // out["runs"]
    out["engine_ns"] = out["engine_ns"] // out["runs"]
    return out.sort_values(["graph", "first"], kind="stable")[COLUMNS].reset_index(drop=True)
