"""Turns a window query into a compact Plotly figure (typed arrays, one bar trace per category)."""

from __future__ import annotations

import base64
import math

import numpy as np
from neuron_explorer.webapp import formatting as fmt
from neuron_explorer.webapp.theme import category_colour
from neuron_explorer.webapp.timeline_index import SUMMARY_ID, TimelineIndex, WindowRows

ROW_PX = 22
NS_PER_US = 1000.0


def typed_array(values: np.ndarray, dtype: str) -> dict:
    """Plotly.js typed-array spec: base64 bytes instead of a JSON list (several times smaller)."""
    arr = np.ascontiguousarray(values, dtype=dtype)
    return {"dtype": arr.dtype.str.lstrip("<|"), "bdata": base64.b64encode(arr.tobytes()).decode()}


def to_us(ns: np.ndarray | float, origin: int) -> np.ndarray:
    """Trace ns -> µs since the trace's first event (the x axis)."""
    return (np.asarray(ns, dtype=np.int64) - origin) / NS_PER_US


def timeline_figure(
    index: TimelineIndex,
    window: WindowRows,
    selected: int | None = None,
    flow_partners: list[int] | None = None,
) -> dict:
    """A figure dict for dcc.Graph: bars per category, counter lines, the selection outlined."""
    origin = index.start_ns
    labels = index.labels
    traces: list[dict] = []
    cats = np.asarray(window.categories, dtype=object)
    names = np.asarray(window.names, dtype=object)
    # Bars narrower than a bucket are widened so every slice stays visible.
    end = np.maximum(window.end, window.start + int(window.bucket_ns))
    for cat in sorted(set(window.categories)):
        pick = np.flatnonzero(cats == cat)
        traces.append({
            "type": "bar",
            "orientation": "h",
            "name": cat,
            "base": typed_array(to_us(window.start[pick], origin), "f8"),
            "x": typed_array((end[pick] - window.start[pick]) / NS_PER_US, "f8"),
            "y": typed_array(window.row[pick], "i4"),
            # a plain list: Dash passes customdata of a clicked point only from plain arrays
            "customdata": window.ids[pick].tolist(),
            "text": names[pick].tolist(),
            "hovertext": [f"{n} · {fmt.duration(d)}" for n, d in zip(names[pick], window.end[pick] - window.start[pick], strict=True)],
            "textposition": "inside",
            "insidetextanchor": "start",
            "textfont": {"color": "#ffffff"},
            "hovertemplate": "%{hovertext}<extra>" + cat + "</extra>",
            "marker": {"color": category_colour(cat), "line": {"width": 0}},
            "width": 0.8,
            "showlegend": False,
        })
    for row, ts, values in window.counters:
        row_info = index.counter_rows[row - len(index.slice_rows)]
        y = row + 0.4 - 0.8 * values / row_info.vmax
        traces.append({
            "type": "scatter",
            "mode": "lines",
            "line": {"shape": "hv", "width": 1.5, "color": "#3b6ea8"},
            "x": typed_array(to_us(ts, origin), "f8"),
            "y": typed_array(y, "f8"),
            "customdata": typed_array(values, "f8"),
            "hovertemplate": f"{row_info.label}: " + "%{customdata:,.4~g}<extra></extra>",
            "showlegend": False,
        })
    shapes = _selection_shapes(index, window, selected, flow_partners or [])
    height = max(len(labels), 1) * ROW_PX + 80
    return {
        "data": traces,
        "layout": {
            "barmode": "overlay",
            "height": height,
            "margin": {"l": 190, "r": 20, "t": 30, "b": 40},
            "xaxis": {
                "range": [float(to_us(window.t0, origin)), float(to_us(window.t1, origin))],
                "title": {"text": "time since trace start"},
                **time_ticks(window.t0, window.t1, origin),
                "showgrid": True,
                "gridcolor": "#eceff3",
                "zeroline": False,
                "side": "top",
            },
            "yaxis": {
                "range": [len(labels) - 0.5, -0.5],
                "tickmode": "array",
                "tickvals": list(range(len(labels))),
                "ticktext": labels,
                "fixedrange": True,
                "showgrid": False,
                "automargin": False,
            },
            "dragmode": "pan",
            "uniformtext": {"minsize": 9, "mode": "hide"},
            "hovermode": "closest",
            "plot_bgcolor": "#ffffff",
            "paper_bgcolor": "#ffffff",
            "font": {"family": "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif", "size": 11},
            "shapes": shapes,
            "uirevision": "timeline",
        },
    }


def time_ticks(t0: int, t1: int, origin: int, target: int = 8) -> dict:
    """About `target` ticks at round times, labelled in the unit that reads best (2.221 s, 14.5 ms)."""
    span = max(t1 - t0, 1)
    raw = span / target
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.ceil((t0 - origin) / step) * step
    ticks = np.arange(first, t1 - origin + 1, step)
    unit, size = next((u, z) for u, z in (("s", 1e9), ("ms", 1e6), ("µs", 1e3), ("ns", 1.0)) if step / z >= 1e-3)
    decimals = max(0, math.ceil(-math.log10(step / size) - 1e-9))
    labels = [f"{t / size:,.{decimals}f} {unit}" for t in ticks]
    return {"tickmode": "array", "tickvals": (ticks / NS_PER_US).tolist(), "ticktext": labels}


def _selection_shapes(index: TimelineIndex, window: WindowRows, selected, partners) -> list[dict]:
    """Outline the selected slice and draw a line to each flow partner."""
    shapes: list[dict] = []
    if selected is None or selected == SUMMARY_ID:
        return shapes
    box = _slice_box(index, selected)
    if box is None:
        return shapes
    origin = index.start_ns
    row, ts, end = box
    x0, x1 = float(to_us(ts, origin)), float(to_us(max(end, ts + window.bucket_ns), origin))
    shapes.append({
        "type": "rect", "x0": x0, "x1": x1, "y0": row - 0.5, "y1": row + 0.5,
        "line": {"color": "#d62728", "width": 2}, "fillcolor": "rgba(0,0,0,0)",
    })
    for partner in partners[:50]:
        other = _slice_box(index, partner)
        if other is None:
            continue
        orow, ots, _ = other
        shapes.append({
            "type": "line", "x0": x0, "y0": row, "x1": float(to_us(ots, origin)), "y1": orow,
            "line": {"color": "#d62728", "width": 1, "dash": "dot"},
        })
    return shapes


def _slice_box(index: TimelineIndex, slice_id: int) -> tuple[int, int, int] | None:
    row = index.row_of(slice_id)
    if row is None:
        return None
    r = index.slice_rows[row]
    i = int(np.flatnonzero(r.ids == slice_id)[0])
    return row, int(r.ts[i]), int(r.end[i])
