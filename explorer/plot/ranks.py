"""Figures of a distributed run: step time per rank, communication per rank, and the ranks'
collectives on one time axis (`run.plot`, and the dashboard's Ranks page)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
from neuron_explorer.analyses.ranks import step_collectives
from neuron_explorer.plot.figures import new_figure
from neuron_explorer.plot.timeline import time_ticks
from neuron_explorer.render import fmt_ns

if TYPE_CHECKING:
    import plotly.graph_objects as go
    from neuron_explorer.runs.run import Run

WAIT_COLOUR, TRANSFER_COLOUR, OVERLAP_COLOUR = "#d9534f", "#4a7bd0", "#5cb85c"
LINK_COLOUR = "rgba(90, 90, 90, 0.35)"
MAX_LINKED_CALLS = 200  # calls drawn on the aligned timeline: enough to read, fast to send


def step_times_figure(run: Run) -> go.Figure:
    """Each step of each rank as a heat-map cell (ms): a slow rank shows as a row."""
    st = run.step_times()
    return new_figure([{
        "type": "heatmap", "z": (st.to_numpy() / 1e6).tolist(),
        "x": [str(c) for c in st.columns], "y": [f"rank {r}" for r in st.index],
        "colorscale": "Blues", "colorbar": {"title": {"text": "ms"}},
        "hovertemplate": "%{y}, step %{x}: %{z:.3f} ms<extra></extra>",
    }], {"xaxis": {"title": {"text": "step"}, "type": "category"},
         "yaxis": {"autorange": "reversed"}}, height=320)


def communication_figure(run: Run) -> go.Figure:
    """Per rank: communication hidden under compute, moving data with nothing else to do,
    and waiting for the last rank to arrive."""
    comm = run.communication().groupby("rank")[["overlap_ns", "exposed_transfer_ns"]].sum()
    coll = step_collectives(run)
    wait = coll.groupby("rank")["wait_ns"].sum() if len(coll) else pd.Series(dtype=float)
    ranks = [f"rank {r}" for r in comm.index]
    bars = [("overlapped with compute", comm["overlap_ns"], OVERLAP_COLOUR),
            ("moving data, not hidden", comm["exposed_transfer_ns"], TRANSFER_COLOUR),
            ("waiting for the last rank", wait.reindex(comm.index).fillna(0), WAIT_COLOUR)]
    return new_figure([{"type": "bar", "name": label, "x": ranks, "y": (values / 1e6).tolist(),
                        "marker": {"color": colour},
                        "hovertemplate": f"%{{x}} {label}: %{{y:.3f}} ms<extra></extra>"}
                       for label, values, colour in bars],
                      {"barmode": "group", "yaxis": {"title": {"text": "ms"}},
                       "legend": {"orientation": "h", "y": 1.15}}, height=320)


def collectives_figure(run: Run) -> go.Figure:
    """Each rank's collectives in the first calls of the run, wait and transfer apart,
    with a line through each call's arrivals on every rank."""
    height = 120 + 40 * len(run)
    coll = step_collectives(run)
    if not len(coll):
        return new_figure([], {"annotations": [{"text": "no collectives in this run",
                                                "showarrow": False}]},
                          height=height)
    first_calls = coll.drop_duplicates(["group", "collective", "seq"]).sort_values("arrival")
    shown = first_calls.head(MAX_LINKED_CALLS)[["group", "collective", "seq"]]
    calls = coll.merge(shown, on=["group", "collective", "seq"])
    origin = int(calls["arrival"].min())
    end = int((calls["ts"] + calls["dur"]).max())
    y = {r: i for i, r in enumerate(run.ranks)}
    wait = calls["wait_ns"].clip(lower=0)
    start = calls["last_arrival"].where(calls["wait_ns"] > 0, calls["arrival"])
    data = [
        _bars(calls["arrival"], wait, calls["rank"].map(y), origin, WAIT_COLOUR, "waiting", calls),
        _bars(start, calls["ts"] + calls["dur"] - start, calls["rank"].map(y), origin,
              TRANSFER_COLOUR, "moving data", calls),
        _same_call_lines(calls, y, origin),
    ]
    return new_figure(data, {
        "barmode": "overlay", "bargap": 0.35,
        "xaxis": {"title": {"text": "time since the first call"},
                  **time_ticks(origin, end, origin)},
        "yaxis": {"tickvals": list(y.values()), "ticktext": [f"rank {r}" for r in y],
                  "autorange": "reversed"},
        "legend": {"orientation": "h", "y": 1.2}}, height=height)


def _same_call_lines(calls: pd.DataFrame, y: dict[int, int], origin: int) -> dict:
    xs: list[float | None] = []
    ys: list[float | None] = []
    for _, rows in calls.sort_values("rank").groupby(["group", "collective", "seq"]):
        if len(rows) > 1:
            xs += ((rows["arrival"] - origin) / 1e3).tolist() + [None]
            ys += rows["rank"].map(y).tolist() + [None]
    return {"type": "scatter", "mode": "lines", "x": xs, "y": ys, "name": "same call",
            "line": {"color": LINK_COLOUR, "width": 1}, "hoverinfo": "skip"}


def _bars(start: pd.Series, length: pd.Series, row: pd.Series, origin: int, colour: str,
          label: str, calls: pd.DataFrame) -> dict:
    text = [f"rank {r}: {c} #{s}, {b / 2**20:.2f} MiB, {label} {fmt_ns(n)}"
            for r, c, s, b, n in zip(calls["rank"], calls["collective"], calls["seq"],
                                     calls["bytes"], length, strict=True)]
    return {"type": "bar", "orientation": "h", "name": label, "y": row.tolist(),
            "x": (length / 1e3).tolist(), "base": ((start - origin) / 1e3).tolist(),
            "marker": {"color": colour}, "hovertext": text, "hoverinfo": "text", "width": 0.6}
