"""Figures of one trace's analyses: time breakdown, roofline, memory, op statistics.

Each function takes the analysis' table (or the trace) and returns a
`plotly.graph_objects.Figure`; the dashboard's pages and `trace.plot` both draw
through them. A figure with nothing to show carries a note saying why.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from neuron_explorer.plot.theme import FONT_FAMILY, GRID_COLOUR, MUTED_COLOUR, breakdown_colour
from neuron_explorer.plot.timeline import time_ticks

if TYPE_CHECKING:
    import plotly.graph_objects as go

BOUND_COLOURS = {"compute": "#f28e2b", "memory": "#4e79a7"}
ROOF_DTYPES = ("bfloat16", "float32")


def new_figure(data: list[dict], layout: dict, height: int | None = None) -> go.Figure:
    """A Figure with the project's look (fonts, white background, light grid)."""
    import plotly.graph_objects as go

    base: dict[str, Any] = {"font": {"family": FONT_FAMILY, "size": 12}, "paper_bgcolor": "#ffffff",
            "plot_bgcolor": "#ffffff", "margin": {"l": 60, "r": 20, "t": 30, "b": 50}}
    if height:
        base["height"] = height
    return go.Figure({"data": data, "layout": {**base, **layout}})


def empty_figure(note: str) -> go.Figure:
    """A figure with only a sentence saying why there is nothing to draw."""
    return new_figure([], {"xaxis": {"visible": False}, "yaxis": {"visible": False},
                           "annotations": [{"text": note, "showarrow": False, "xref": "paper",
                                            "yref": "paper", "x": 0.5, "y": 0.5}]}, height=200)


# --- breakdown ---------------------------------------------------------------------------------

def mean_per_step(breakdown: pd.DataFrame) -> pd.DataFrame:
    """side, category, ns: the breakdown's mean time per step."""
    n_steps = max(int(breakdown["step"].nunique()), 1) if len(breakdown) else 1
    return (breakdown.groupby(["side", "category"], sort=False)["ns"].sum().div(n_steps)
            .reset_index())


def breakdown_figure(breakdowns: Mapping[str, pd.DataFrame],
                     axis_title: str = "ms per step") -> go.Figure:
    """Mean time per step, host and device, stacked by category; one pair of bars per trace
    when several are given ({label: trace.breakdown()}), a single trace's bars named by side."""
    frames = [mean_per_step(df).assign(trace=label) for label, df in breakdowns.items() if len(df)]
    if not frames:
        return empty_figure("no time breakdown (the trace has no steps or no device activity)")
    df = pd.concat(frames, ignore_index=True)
    several = len(frames) > 1
    df["bar"] = (df["trace"] + " · " + df["side"]) if several else df["side"]
    bars = [{
        "type": "bar", "orientation": "h", "name": str(category),
        "y": group["bar"].tolist(), "x": (group["ns"] / 1e6).tolist(),
        "marker": {"color": breakdown_colour(str(category))},
        "hovertemplate": f"{category}: " + "%{x:.3f} ms<extra>%{y}</extra>",
    } for category, group in df.groupby("category", sort=False)]
    order = list(dict.fromkeys(df["bar"]))[::-1] if several else ["host", "device"]
    return new_figure(bars, {
        "barmode": "stack",
        "xaxis": {"title": {"text": axis_title}, "gridcolor": GRID_COLOUR},
        "yaxis": {"categoryorder": "array", "categoryarray": order},
        "legend": {"orientation": "h", "y": -0.35},
        "margin": {"l": 260 if several else 70, "r": 20, "t": 10, "b": 40},
    }, height=320 if several else 260)


# --- roofline ----------------------------------------------------------------------------------

def roofs(figures: dict | None) -> tuple[dict[str, float], float | None]:
    """Peak FLOP/s per dtype and memory bandwidth (bytes/s) from the trace's hardware figures."""
    if not isinstance(figures, dict):
        return {}, None
    peaks = figures.get("tensor_peak_flops") or {}
    peaks = {str(k): float(v) for k, v in peaks.items() if isinstance(v, (int, float)) and v > 0}
    bandwidth = figures.get("memory_bytes_per_s") or figures.get("hbm_bytes_per_s")
    return peaks, float(bandwidth) if bandwidth else None


def roofline_figure(roofline: pd.DataFrame, hardware_figures: dict | None) -> go.Figure:
    """Each op's arithmetic intensity against the FLOP rate it reached, marker area by its time,
    under the hardware's roofs (when the trace carries its figures)."""
    df = roofline[(roofline["intensity"] > 0) & (roofline["achieved_flops_per_s"] > 0)] \
        if len(roofline) else roofline
    if df.empty:
        return empty_figure("no op in this trace has both FLOPs and bytes")
    size = np.sqrt(df["dur"].to_numpy(dtype=float))
    size = 8 + 40 * size / max(size.max(), 1.0)
    data = [{
        "type": "scatter", "mode": "markers", "name": f"{bound}-bound",
        "x": group["intensity"].tolist(), "y": group["achieved_flops_per_s"].tolist(),
        "text": group["name"].astype(str).tolist(), "customdata": (group["dur"] / 1e3).tolist(),
        "marker": {"size": group["_size"].tolist(),
                   "color": BOUND_COLOURS.get(str(bound), "#9aa5b1"),
                   "opacity": 0.75, "line": {"width": 1, "color": "#ffffff"}},
        "hovertemplate": "%{text}<br>%{x:.3g} FLOP/byte · %{y:.3s}FLOP/s · "
                         "%{customdata:,.1f} µs<extra></extra>",
    } for bound, group in df.assign(_size=size).groupby("bound", sort=True)]
    data += roof_lines(hardware_figures, float(df["intensity"].min()) / 4,
                       float(df["intensity"].max()) * 4)
    return new_figure(data, {
        "xaxis": {"type": "log", "title": {"text": "arithmetic intensity (FLOP / HBM byte)"},
                  "gridcolor": GRID_COLOUR},
        "yaxis": {"type": "log", "title": {"text": "achieved FLOP/s"}, "gridcolor": GRID_COLOUR},
        "legend": {"orientation": "h", "y": 1.1},
    }, height=520)


def roof_lines(hardware_figures: dict | None, lo: float, hi: float) -> list[dict]:
    """The memory slope and compute roof per dtype (BF16 solid, FP32 dotted)."""
    peaks, bandwidth = roofs(hardware_figures)
    if not peaks or not bandwidth:
        return []
    lines = []
    for dtype, peak in sorted(peaks.items(), key=lambda kv: -kv[1]):
        if dtype not in ROOF_DTYPES:
            continue
        ridge = peak / bandwidth
        xs = [min(lo, ridge / 10), ridge, max(hi, ridge * 10)]
        lines.append({
            "type": "scatter", "mode": "lines", "name": f"roof ({dtype})",
            "x": xs, "y": [xs[0] * bandwidth, peak, peak],
            "line": {"color": MUTED_COLOUR, "width": 1.5,
                     "dash": "solid" if dtype == "bfloat16" else "dot"},
            "hoverinfo": "skip",
        })
    return lines


# --- memory ------------------------------------------------------------------------------------

def memory_figure(memory_timeline: pd.DataFrame) -> go.Figure:
    """Device memory in use over time, one line per device."""
    df = memory_timeline
    if df.empty:
        return empty_figure("no memory timeline (it needs HBM counters)")
    origin = int(df["ts"].min())
    lines = [{
        "type": "scatter", "mode": "lines", "name": f"device {device}",
        "x": ((group["ts"] - origin) / 1e3).tolist(), "y": (group["in_use_bytes"] / 2**20).tolist(),
        "line": {"shape": "hv", "width": 1.5}, "fill": "tozeroy",
        "hovertemplate": "%{y:.2f} MiB<extra>%{x:.1f} µs</extra>",
    } for device, group in df.groupby("device", sort=True)]
    return new_figure(lines, {
        "xaxis": {"title": {"text": "time since first sample"}, "gridcolor": GRID_COLOUR,
                  **time_ticks(origin, int(df["ts"].max()), origin)},
        "yaxis": {"title": {"text": "HBM in use (MiB)"}, "gridcolor": GRID_COLOUR,
                  "rangemode": "tozero"},
        "showlegend": len(lines) > 1,
    }, height=360)


# --- counters ----------------------------------------------------------------------------------

def counters_figure(counters: pd.DataFrame) -> go.Figure:
    """Every counter series over time (`counter_series`: series, track_id, device, ts,
    value), each as a share of its own peak (their units differ: bytes, percent, GB/s,
    instructions); the hover gives the value itself."""
    if counters.empty:
        return empty_figure("no counters in this trace")
    origin = int(counters["ts"].min())
    lines = []
    for (name, _, _), group in counters.groupby(["series", "device", "track_id"], sort=True):
        group = group.sort_values("ts", kind="stable")
        peak = float(group["value"].abs().max()) or 1.0
        lines.append({
            "type": "scatter", "mode": "lines", "name": str(name),
            "x": ((group["ts"] - origin) / 1e3).tolist(),
            "y": (group["value"] / peak * 100).tolist(),
            "customdata": group["value"].tolist(), "line": {"shape": "hv", "width": 1.5},
            "hovertemplate": f"{name}: %{{customdata:.4g}}<extra>%{{x:.1f}} µs</extra>"})
    return new_figure(lines, {
        "xaxis": {"title": {"text": "time since first sample"}, "gridcolor": GRID_COLOUR,
                  **time_ticks(origin, int(counters["ts"].max()), origin)},
        "yaxis": {"title": {"text": "share of the series' peak (%)"}, "gridcolor": GRID_COLOUR,
                  "rangemode": "tozero"},
        "showlegend": True,
    }, height=360)


# --- op statistics -----------------------------------------------------------------------------

def op_stats_figure(op_stats: pd.DataFrame, n: int = 20) -> go.Figure:
    """The `n` ops with the most time: device time (and host time where recorded), longest
    on top."""
    if op_stats.empty:
        return empty_figure("no ops in this trace")
    key = "device_ns" if "device_ns" in op_stats and op_stats["device_ns"].sum() > 0 else "host_ns"
    top = op_stats.sort_values(key, ascending=False).head(n).iloc[::-1]
    names = top["name"].astype(str).tolist()
    data = []
    for column, label, colour in (("device_ns", "device", breakdown_colour("tensor")),
                                  ("host_ns", "host", breakdown_colour("op_dispatch"))):
        if column in top and top[column].sum() > 0:
            data.append({"type": "bar", "orientation": "h", "name": label, "y": names,
                         "x": (top[column] / 1e6).tolist(), "marker": {"color": colour},
                         "customdata": top["count"].tolist() if "count" in top else None,
                         "hovertemplate": f"%{{y}}: %{{x:.3f}} ms {label} · %{{customdata}} calls"
                                          "<extra></extra>"})
    return new_figure(data, {
        "barmode": "group",
        "xaxis": {"title": {"text": "total time (ms)"}, "gridcolor": GRID_COLOUR},
        "yaxis": {"automargin": True},
        "legend": {"orientation": "h", "y": 1.05},
        "margin": {"l": 200, "r": 20, "t": 30, "b": 50},
    }, height=max(260, 22 * len(names) + 120))

