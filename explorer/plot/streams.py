"""Figures of the device's queues (streams), HTA's views: how deep each queue ran, why
it stood idle, which kernel sequences repeat, and the device time of annotated regions."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
from neuron_explorer.plot.figures import empty_figure, new_figure
from neuron_explorer.plot.theme import GRID_COLOUR
from neuron_explorer.plot.timeline import time_ticks

if TYPE_CHECKING:
    import plotly.graph_objects as go

IDLE_COLOURS = {"host_wait": "#e15759", "kernel_wait": "#f28e2b", "other": "#76b7b2"}


def queue_length_figure(series: pd.DataFrame) -> go.Figure:
    """Each queue's length (work launched to it, not started) over time, one line each."""
    if series.empty:
        return empty_figure("no launched device work in this trace")
    origin = int(series["ts"].min())
    lines = [{
        "type": "scatter", "mode": "lines", "name": str(stream),
        "x": ((group["ts"] - origin) / 1e3).tolist(), "y": group["queue_length"].tolist(),
        "line": {"shape": "hv", "width": 1.5},
        "hovertemplate": f"{stream}: %{{y}} queued<extra>%{{x:.1f}} µs</extra>",
    } for stream, group in series.groupby("stream", sort=True)]
    return new_figure(lines, {
        "xaxis": {"title": {"text": "time since the first launch"}, "gridcolor": GRID_COLOUR,
                  **time_ticks(origin, int(series["ts"].max()), origin)},
        "yaxis": {"title": {"text": "kernels queued"}, "gridcolor": GRID_COLOUR,
                  "rangemode": "tozero"},
        "showlegend": len(lines) > 1,
    }, height=360)


def stream_idle_figure(idle: pd.DataFrame) -> go.Figure:
    """Each queue's idle time between kernels, stacked by HTA's category."""
    if idle.empty or not idle["idle_ns"].sum():
        return empty_figure("no idle time between kernels in this trace")
    streams = sorted(idle["stream"].unique().tolist())
    bars = []
    for category, colour in IDLE_COLOURS.items():
        rows = idle[idle["idle_category"] == category].set_index("stream")
        values = rows["idle_ns"].reindex(streams).fillna(0) / 1e6
        bars.append({"type": "bar", "orientation": "h", "name": category, "y": streams,
                     "x": values.tolist(), "marker": {"color": colour},
                     "hovertemplate": f"%{{y}} {category}: %{{x:.3f}} ms<extra></extra>"})
    return new_figure(bars, {
        "barmode": "stack",
        "xaxis": {"title": {"text": "idle between kernels (ms)"}, "gridcolor": GRID_COLOUR},
        "yaxis": {"automargin": True},
    }, height=max(220, 60 + 40 * len(streams)))


def ranked_bars(table: pd.DataFrame, label: str, value: str, note: str, axis: str,
                n: int = 15) -> go.Figure:
    """The `n` largest rows of `table` by `value` (ns), as horizontal bars named by
    `label`, largest on top."""
    if table.empty:
        return empty_figure(note)
    top = table.sort_values(value, ascending=False).head(n).iloc[::-1]
    names = [name if len(name) <= 70 else name[:67] + "..." for name in top[label].astype(str)]
    bar = {"type": "bar", "orientation": "h", "y": names, "x": (top[value] / 1e6).tolist(),
           "hovertext": top[label].astype(str).tolist(),
           "hovertemplate": "%{hovertext}: %{x:.3f} ms<extra></extra>"}
    return new_figure([bar], {"xaxis": {"title": {"text": axis}, "gridcolor": GRID_COLOUR},
                              "yaxis": {"automargin": True}},
                      height=max(220, 60 + 26 * len(names)))
