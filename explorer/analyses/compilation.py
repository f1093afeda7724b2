"""torch.compile in a trace: compiled graphs, graph breaks, recompiles and compile time."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer.common import trace_format as tf
from neuron_explorer.common.intervals import Union
from neuron_explorer.tables import assign_steps, num, text

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

GRAPH_COLUMNS = ["graph_id", "name", "ts", "dur", "spans", "step"]
EVENT_COLUMNS = ["id", "ts", "reason", "source", "step", "within", "hint"]


def _events(trace: Trace, kind: str) -> pd.DataFrame:
    s = trace.table("slices")
    ev = s[s["kind"] == kind]
    ids = ev["id"].to_numpy()
    ts = ev["ts"].to_numpy(np.int64)
    return pd.DataFrame({"id": ids, "ts": ts,
                         "reason": text(trace.slice_args.column(tf.ARG_REASON, ids)),
                         "source": text(trace.slice_args.column(tf.ARG_SOURCE, ids)),
                         "step": assign_steps(ts, trace.steps),
                         "within": text(trace.slice_args.column(tf.ARG_WITHIN, ids)),
                         "hint": text(trace.slice_args.column(tf.ARG_HINT, ids))},
                        columns=EVENT_COLUMNS)


def compile_spans(trace: Trace) -> pd.DataFrame:
    """Compile slices on host tracks."""
    s = trace.table("slices")
    return s[s["kind"] == tf.CAT_COMPILE]


def compiling_alone(trace: Trace, spans: pd.DataFrame) -> Union:
    """What compiling itself took of the compile slices `spans`: their time less the
    program's own ops run inside them. A frame's first call runs inside the span that
    compiles it, and with it the frame's eager parts: an optimizer creating its state at
    its first step, between the graphs Dynamo breaks around it, is work the program does
    compiled or not (120 such ops were 4.44 ms of a modelled run's "compile time"). On the
    modelled host clock compiling costs nothing: the spans hold the program's work alone
    (those ops, and the modelled Python between them)."""
    from neuron_explorer.analyses.levels import modelled_host_clock

    ts = spans["ts"].to_numpy(np.int64)
    end = ts + spans["dur"].to_numpy(np.int64)
    if modelled_host_clock(trace) or not len(ts):
        return Union(np.zeros(0, np.int64), np.zeros(0, np.int64))
    # the ops within the spans' reach only (every summary asks, a trace holds millions)
    op_ts = trace.ops["ts"].to_numpy(np.int64)
    op_end = op_ts + trace.ops["dur"].to_numpy(np.int64)
    near = (op_ts < end.max()) & (op_end > ts.min())
    return Union(ts, end).minus(Union(op_ts[near], op_end[near]))


def compile_summary(trace: Trace) -> dict[str, pd.DataFrame]:
    """graphs (one row per graph id), kernels (one row per NKI kernel signature compiled:
    name, ts, dur, step), graph_breaks, recompiles, totals (one row: compile time, graphs,
    kernels, graph breaks, recompiles)."""
    spans = compile_spans(trace)
    ids = spans["id"].to_numpy()
    gid = num(trace.slice_args.column(tf.ARG_GRAPH_ID, ids), default=-1)
    frame = pd.DataFrame({"graph_id": gid, "name": spans["name"].to_numpy(),
                          "ts": spans["ts"].to_numpy(np.int64),
                          "end": (spans["ts"] + spans["dur"]).to_numpy(np.int64),
                          "depth": spans["depth"].to_numpy()})
    kernel_names = text(trace.slice_args.column(tf.ARG_NKI_KERNEL, ids))
    is_kernel = kernel_names != ""
    kernels_df = frame[is_kernel][["name", "ts"]].assign(
        dur=(frame["end"] - frame["ts"])[is_kernel],
        step=assign_steps(frame["ts"].to_numpy()[is_kernel], trace.steps)).reset_index(drop=True)
    graphs = []
    for g, part in frame[~is_kernel].groupby("graph_id", sort=True):
        u = Union(part["ts"].to_numpy(), part["end"].to_numpy())
        top = part.sort_values(["depth", "ts"]).iloc[0]
        graphs.append((int(g), str(top["name"]), int(part["ts"].min()), u.total, len(part),
                       int(assign_steps(np.array([part["ts"].min()]), trace.steps)[0])))
    graphs_df = pd.DataFrame(graphs, columns=GRAPH_COLUMNS)
    breaks = _events(trace, tf.CAT_GRAPH_BREAK)
    recompiles = _events(trace, tf.CAT_RECOMPILE)
    # compiling alone: the program's own work inside the spans is not compile time
    totals = pd.DataFrame([{"compile_ns": compiling_alone(trace, spans).total,
                            "graphs": int((graphs_df["graph_id"] >= 0).sum()),
                            "kernels": len(kernels_df),
                            "graph_breaks": len(breaks), "recompiles": len(recompiles)}])
    return {"graphs": graphs_df, "kernels": kernels_df, "graph_breaks": breaks,
            "recompiles": recompiles, "totals": totals}


def compiled_what(totals: pd.Series) -> str:
    """What compiled, from a totals row: "3 graphs", "1 NKI kernel", "2 graphs and 1 NKI
    kernel" (kernel signatures: each new shape of a kernel compiles again)."""
    graphs, kernels = int(totals["graphs"]), int(totals.get("kernels", 0))
    parts = [f"{graphs} graph{'s' if graphs != 1 else ''}"] if graphs or not kernels else []
    if kernels:
        parts.append(f"{kernels} NKI kernel{'s' if kernels != 1 else ''}")
    return " and ".join(parts)
