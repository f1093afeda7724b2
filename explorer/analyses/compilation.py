"""torch.compile in a trace: compiled graphs, graph breaks, recompiles and compile time."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer import trace_format as tf
from neuron_explorer.analyses.intervals import Union
from neuron_explorer.tables import assign_steps, num, text

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

GRAPH_COLUMNS = ["graph_id", "name", "ts", "dur", "spans", "step"]
EVENT_COLUMNS = ["id", "ts", "reason", "source", "step"]


def _events(trace: Trace, kind: str) -> pd.DataFrame:
    s = trace.table("slices")
    ev = s[s["kind"] == kind]
    ids = ev["id"].to_numpy()
    ts = ev["ts"].to_numpy(np.int64)
    return pd.DataFrame({"id": ids, "ts": ts,
                         "reason": text(trace.slice_args.column(tf.ARG_REASON, ids)),
                         "source": text(trace.slice_args.column(tf.ARG_SOURCE, ids)),
                         "step": assign_steps(ts, trace.steps)}, columns=EVENT_COLUMNS)


def compile_spans(trace: Trace) -> pd.DataFrame:
    """Compile slices on host tracks."""
    s = trace.table("slices")
    return s[s["kind"] == tf.CAT_COMPILE]


def compile_summary(trace: Trace) -> dict[str, pd.DataFrame]:
    """graphs (one row per graph id), graph_breaks, recompiles, totals (one row)."""
    spans = compile_spans(trace)
    ids = spans["id"].to_numpy()
    gid = num(trace.slice_args.column(tf.ARG_GRAPH_ID, ids), default=-1)
    frame = pd.DataFrame({"graph_id": gid, "name": spans["name"].to_numpy(),
                          "ts": spans["ts"].to_numpy(np.int64),
                          "end": (spans["ts"] + spans["dur"]).to_numpy(np.int64),
                          "depth": spans["depth"].to_numpy()})
    graphs = []
    for g, part in frame.groupby("graph_id", sort=True):
        u = Union(part["ts"].to_numpy(), part["end"].to_numpy())
        top = part.sort_values(["depth", "ts"]).iloc[0]
        graphs.append((int(g), str(top["name"]), int(part["ts"].min()), u.total, len(part),
                       int(assign_steps(np.array([part["ts"].min()]), trace.steps)[0])))
    graphs_df = pd.DataFrame(graphs, columns=GRAPH_COLUMNS)
    breaks = _events(trace, tf.CAT_GRAPH_BREAK)
    recompiles = _events(trace, tf.CAT_RECOMPILE)
    total = Union(frame["ts"].to_numpy(), frame["end"].to_numpy()).total
    totals = pd.DataFrame([{"compile_ns": total, "graphs": int((graphs_df["graph_id"] >= 0).sum()),
                            "graph_breaks": len(breaks), "recompiles": len(recompiles)}])
    return {"graphs": graphs_df, "graph_breaks": breaks, "recompiles": recompiles,
            "totals": totals}
