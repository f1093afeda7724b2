"""Engines: how busy each engine and DMA queue is over the recorded steps, and in each step."""

from __future__ import annotations

from typing import Any

import pandas as pd
from dash import html
from neuron_explorer.webapp.components import graph, notice, page_title, section
from neuron_explorer.webapp.page_data import fetch, table
from neuron_explorer.webapp.theme import breakdown_colour
from neuron_explorer.webapp.timeline_figure import time_ticks

PATH = "/engines"
TITLE = "Engines"


BINS_OVER_STEPS = 1000


def layout(trace: Any, name: str, params: dict, ctx: Any) -> html.Div:
    steps = table(trace, "steps")
    window = _steps_window(steps)
    bin_ns = max((window[1] - window[0]) // BINS_OVER_STEPS, 1) if window else None
    data = fetch(trace, "engine_utilisation", "engine utilisation (it needs device engine events)", bin_ns)
    if not data.ok:
        return html.Div([page_title(TITLE, name), section("Utilisation over time", notice(data.missing))])
    df = data.value
    if window:  # the recorded steps, not the startup and exit around them
        df = df[(df["ts"] >= window[0]) & (df["ts"] < window[1])]
        if df.empty:
            df = data.value
    origin = int(df["ts"].min())
    several = "device" in df.columns and df["device"].nunique() > 1
    df = df.assign(_label=(df["device"].astype(str) + " · " + df["engine"].astype(str)) if several
                   else df["engine"].astype(str))
    over_time = []
    colours = {}
    for engine, group in df.groupby("_label", sort=True):
        colours[engine] = breakdown_colour(str(engine).rsplit(" · ", 1)[-1])
        over_time.append({
            "type": "scatter", "mode": "lines", "name": str(engine),
            "x": ((group["ts"] - origin) / 1e3).tolist(), "y": (group["utilisation"] * 100).tolist(),
            "line": {"shape": "hv", "width": 1.5, "color": colours[engine]},
            "hovertemplate": f"{engine}: " + "%{y:.1f}%<extra>%{x:.1f} µs</extra>",
        })
    timeline = {"data": over_time, "layout": {
        "xaxis": {"title": {"text": "time since the first step" if window else "time since first sample"},
                  "gridcolor": "#eceff3", **time_ticks(origin, int(df["ts"].max()), origin)},
        "yaxis": {"title": {"text": "busy (%)"}, "range": [0, 105], "gridcolor": "#eceff3"},
        "legend": {"orientation": "h", "y": 1.12},
    }}
    per_step = per_step_utilisation(df, steps, bin_ns) if bin_ns is not None else None
    return html.Div([
        page_title(TITLE, name),
        section("Utilisation over time", graph(timeline, "engines-timeline", height=380),
                subtitle="Share of each time bin an engine was executing, over the recorded steps"
                if window else "Share of each time bin an engine was executing"),
        section("Utilisation per step", _per_step_chart(per_step, colours),
                subtitle="Share of each step an engine was executing") if per_step is not None
        else section("Mean utilisation", _mean_chart(df, colours)),
    ])


def _steps_window(steps: pd.DataFrame) -> tuple[int, int] | None:
    if steps.empty or not {"ts", "dur"} <= set(steps.columns):
        return None
    return int(steps["ts"].min()), int((steps["ts"] + steps["dur"]).max())


def per_step_utilisation(df: pd.DataFrame, steps: pd.DataFrame, bin_ns: int) -> pd.DataFrame:
    """step, engine label, utilisation (0..1): the mean of the bins inside each step."""
    rows: list[dict] = []
    for _, step in steps.iterrows():
        lo, hi = int(step["ts"]), int(step["ts"] + step["dur"])
        inside = df[(df["ts"] >= lo) & (df["ts"] + bin_ns <= hi)]
        for label, group in inside.groupby("_label", sort=True):
            rows.append({"step": int(step["step"]) if "step" in step else len(rows),
                         "engine": str(label), "utilisation": float(group["utilisation"].mean())})
    return pd.DataFrame(rows, columns=["step", "engine", "utilisation"])


def _per_step_chart(per_step: pd.DataFrame, colours: dict):
    if per_step.empty:
        return notice("No engine ran during the recorded steps.")
    data = [{
        "type": "bar", "name": engine, "x": [f"step {s}" for s in group["step"]],
        "y": (group["utilisation"] * 100).tolist(), "marker": {"color": colours.get(engine, "#9aa5b1")},
        "hovertemplate": f"{engine}: " + "%{y:.1f}%<extra>%{x}</extra>",
    } for engine, group in per_step.groupby("engine", sort=True)]
    figure = {"data": data, "layout": {
        "barmode": "group", "yaxis": {"title": {"text": "busy (%)"}, "range": [0, 100], "gridcolor": "#eceff3"},
        "legend": {"orientation": "h", "y": 1.12}}}
    return graph(figure, "engines-per-step", height=320)


def _mean_chart(df: pd.DataFrame, colours: dict):
    means = df.groupby("_label", sort=True)["utilisation"].mean() * 100
    figure = {"data": [{
        "type": "bar", "x": means.index.tolist(), "y": means.tolist(),
        "marker": {"color": [colours.get(e, "#9aa5b1") for e in means.index]},
        "hovertemplate": "%{x}: %{y:.1f}%<extra></extra>",
    }], "layout": {"yaxis": {"title": {"text": "mean busy (%)"}, "range": [0, 100], "gridcolor": "#eceff3"}}}
    return graph(figure, "engines-mean", height=300)


def register(app, ctx) -> None:
    """No callbacks: the charts are static for a trace."""
