"""Memory: HBM in use over time and what holds it at the peak."""

from __future__ import annotations

from typing import Any

from dash import html
from neuron_explorer.webapp import formatting as fmt
from neuron_explorer.webapp.components import data_table, graph, metric, notice, page_title, section
from neuron_explorer.webapp.page_data import fetch
from neuron_explorer.webapp.timeline_figure import time_ticks

PATH = "/memory"
TITLE = "Memory"


def layout(trace: Any, name: str, params: dict, ctx: Any) -> html.Div:
    timeline = fetch(trace, "memory_timeline", "memory timeline (it needs HBM counters)")
    parts: list = [page_title(TITLE, name)]
    if not timeline.ok:
        parts.append(section("HBM in use", notice(timeline.missing)))
    else:
        df = timeline.value
        origin = int(df["ts"].min())
        lines = []
        for device, group in df.groupby("device", sort=True):
            lines.append({
                "type": "scatter", "mode": "lines", "name": f"device {device}",
                "x": ((group["ts"] - origin) / 1e3).tolist(), "y": (group["in_use_bytes"] / 2**20).tolist(),
                "line": {"shape": "hv", "width": 1.5}, "fill": "tozeroy",
                "hovertemplate": "%{y:.2f} MiB<extra>%{x:.1f} µs</extra>",
            })
        peak = df.loc[df["in_use_bytes"].idxmax()]
        figure = {"data": lines, "layout": {
            "xaxis": {"title": {"text": "time since first sample"}, "gridcolor": "#eceff3",
                  **time_ticks(origin, int(df["ts"].max()), origin)},
            "yaxis": {"title": {"text": "HBM in use (MiB)"}, "gridcolor": "#eceff3", "rangemode": "tozero"},
            "showlegend": len(lines) > 1,
        }}
        parts.append(html.Div([
            metric("peak HBM in use", fmt.size(peak["in_use_bytes"])),
            metric("reached at", fmt.duration(int(peak["ts"]) - origin), "after the first sample"),
        ], className="metrics"))
        parts.append(section("HBM in use", graph(figure, "memory-timeline", height=360)))
    holders = fetch(trace, "memory_at_peak", "record of what holds memory at the peak")
    body = data_table(holders.value, "memory-holders", page_size=15) if holders.ok else notice(holders.missing)
    parts.append(section("What holds the peak", body))
    return html.Div(parts)


def register(app, ctx) -> None:
    """No callbacks: the page is static for a trace."""
