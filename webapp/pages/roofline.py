"""Roofline: each op's arithmetic intensity against the FLOP rate it reached, under the preset's roof."""

from __future__ import annotations

from typing import Any

import numpy as np
from dash import html
from neuron_explorer.webapp.components import graph, notice, page_title, section
from neuron_explorer.webapp.page_data import fetch

PATH = "/roofline"
TITLE = "Roofline"
BOUND_COLOURS = {"compute": "#f28e2b", "memory": "#4e79a7"}


def roofs(figures: dict | None) -> tuple[dict[str, float], float | None]:
    """Peak FLOP/s per dtype and the memory bandwidth (bytes/s) from the trace's hardware figures."""
    if not isinstance(figures, dict):
        return {}, None
    peaks = figures.get("tensor_peak_flops") or {}
    peaks = {str(k): float(v) for k, v in peaks.items() if isinstance(v, (int, float)) and v > 0}
    bandwidth = figures.get("memory_bytes_per_s") or figures.get("hbm_bytes_per_s")
    return peaks, float(bandwidth) if bandwidth else None


def layout(trace: Any, name: str, params: dict, ctx: Any) -> html.Div:
    data = fetch(trace, "roofline", "per-op FLOPs and bytes (needed for a roofline)")
    if not data.ok:
        return html.Div([page_title(TITLE, name), section("Roofline", notice(data.missing))])
    df = data.value
    df = df[(df["intensity"] > 0) & (df["achieved_flops_per_s"] > 0)]
    if df.empty:
        return html.Div([page_title(TITLE, name), section("Roofline", notice("No op in this trace has both FLOPs and bytes."))])
    size = np.sqrt(df["dur"].to_numpy(dtype=float))
    size = 8 + 40 * size / max(size.max(), 1.0)
    traces = []
    for bound, group in df.assign(_size=size).groupby("bound", sort=True):
        traces.append({
            "type": "scatter", "mode": "markers", "name": f"{bound}-bound",
            "x": group["intensity"].tolist(), "y": group["achieved_flops_per_s"].tolist(),
            "text": group["name"].astype(str).tolist(), "customdata": (group["dur"] / 1e3).tolist(),
            "marker": {"size": group["_size"].tolist(), "color": BOUND_COLOURS.get(str(bound), "#9aa5b1"),
                       "opacity": 0.75, "line": {"width": 1, "color": "#ffffff"}},
            "hovertemplate": "%{text}<br>%{x:.3g} FLOP/byte · %{y:.3s}FLOP/s · %{customdata:,.1f} µs<extra></extra>",
        })
    peaks, bandwidth = roofs(getattr(trace, "hardware_figures", None))
    lo = float(df["intensity"].min()) / 4
    hi = float(df["intensity"].max()) * 4
    if peaks and bandwidth:
        for dtype, peak in sorted(peaks.items(), key=lambda kv: -kv[1]):
            if dtype not in ("bfloat16", "float32"):
                continue
            ridge = peak / bandwidth
            xs = [min(lo, ridge / 10), ridge, max(hi, ridge * 10)]
            traces.append({
                "type": "scatter", "mode": "lines", "name": f"roof ({dtype})",
                "x": xs, "y": [x * bandwidth for x in xs[:1]] + [peak, peak],
                "line": {"color": "#5b6770", "width": 1.5, "dash": "solid" if dtype == "bfloat16" else "dot"},
                "hoverinfo": "skip",
            })
    note = None if peaks and bandwidth else notice(
        "The trace carries no hardware figures, so the roof is not drawn.", "info")
    figure = {"data": traces, "layout": {
        "xaxis": {"type": "log", "title": {"text": "arithmetic intensity (FLOP / HBM byte)"}, "gridcolor": "#eceff3"},
        "yaxis": {"type": "log", "title": {"text": "achieved FLOP/s"}, "gridcolor": "#eceff3"},
        "legend": {"orientation": "h", "y": 1.1},
    }}
    return html.Div([
        page_title(TITLE, name),
        section("Ops against the roofline", note, graph(figure, "roofline-graph", height=520),
                subtitle="Marker area grows with the op's total time"),
    ])


def register(app, ctx) -> None:
    """No callbacks: the chart is static for a trace."""
