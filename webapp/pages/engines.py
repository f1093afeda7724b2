"""Engines: how busy each engine and DMA queue is over time, and on average."""

from __future__ import annotations

from typing import Any

from dash import html
from neuron_explorer.webapp.components import graph, notice, page_title, section
from neuron_explorer.webapp.page_data import fetch
from neuron_explorer.webapp.theme import breakdown_colour
from neuron_explorer.webapp.timeline_figure import time_ticks

PATH = "/engines"
TITLE = "Engines"


def layout(trace: Any, name: str, params: dict, ctx: Any) -> html.Div:
    data = fetch(trace, "engine_utilisation", "engine utilisation (it needs device engine events)")
    if not data.ok:
        return html.Div([page_title(TITLE, name), section("Utilisation over time", notice(data.missing))])
    df = data.value
    origin = int(df["ts"].min())
    several = "device" in df.columns and df["device"].nunique() > 1
    df = df.assign(_label=(df["device"].astype(str) + " · " + df["engine"].astype(str)) if several
                   else df["engine"].astype(str))
    over_time, means = [], []
    for engine, group in df.groupby("_label", sort=True):
        colour = breakdown_colour(str(engine).rsplit(" · ", 1)[-1])
        over_time.append({
            "type": "scatter", "mode": "lines", "name": str(engine),
            "x": ((group["ts"] - origin) / 1e3).tolist(), "y": (group["utilisation"] * 100).tolist(),
            "line": {"shape": "hv", "width": 1.5, "color": colour},
            "hovertemplate": f"{engine}: " + "%{y:.1f}%<extra>%{x:.1f} µs</extra>",
        })
        means.append((str(engine), float(group["utilisation"].mean()) * 100, colour))
    timeline = {"data": over_time, "layout": {
        "xaxis": {"title": {"text": "time since first sample"}, "gridcolor": "#eceff3",
                  **time_ticks(origin, int(df["ts"].max()), origin)},
        "yaxis": {"title": {"text": "busy (%)"}, "range": [0, 105], "gridcolor": "#eceff3"},
        "legend": {"orientation": "h", "y": 1.12},
    }}
    average = {"data": [{
        "type": "bar", "x": [m[0] for m in means], "y": [m[1] for m in means],
        "marker": {"color": [m[2] for m in means]}, "hovertemplate": "%{x}: %{y:.1f}%<extra></extra>",
    }], "layout": {"yaxis": {"title": {"text": "mean busy (%)"}, "range": [0, 100], "gridcolor": "#eceff3"}}}
    return html.Div([
        page_title(TITLE, name),
        section("Utilisation over time", graph(timeline, "engines-timeline", height=380),
                subtitle="Share of each time bin an engine was executing"),
        section("Mean utilisation", graph(average, "engines-mean", height=300)),
    ])


def register(app, ctx) -> None:
    """No callbacks: the charts are static for a trace."""
