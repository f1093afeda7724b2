"""The timeline figure: a window of the level-of-detail index as compact Plotly traces.

`timeline_figure` turns one window query into a figure dict (typed arrays, one bar
trace per category, counter lines, the selection outlined); the dashboard sends it
as it is, `trace.plot.timeline()` wraps it in a `Figure` (or, in Jupyter with
ipywidgets, a `FigureWidget` that queries the index again on every zoom or pan).
"""

from __future__ import annotations

import base64
import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from neuron_explorer.plot.theme import (
    CRITICAL_PATH_COLOUR,
    FONT_FAMILY,
    GRID_COLOUR,
    SELECTION_COLOUR,
    category_colour,
)
from neuron_explorer.plot.timeline_index import SUMMARY_ID, TimelineIndex, WindowRows
from neuron_explorer.render import fmt_ns

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

ROW_PX = 22
NS_PER_US = 1000.0
WIDTH_PX = 1600  # pixel buckets per window: about the plot's width on a large screen
MAX_FLOW_LINES = 50


def typed_array(values: np.ndarray, dtype: str) -> dict:
    """Plotly.js typed-array spec: base64 bytes instead of a JSON list (several times smaller)."""
    arr = np.ascontiguousarray(values, dtype=dtype)
    return {"dtype": arr.dtype.str.lstrip("<|"), "bdata": base64.b64encode(arr.tobytes()).decode()}


def to_us(ns: np.ndarray | int, origin: int) -> np.ndarray:
    """Trace ns -> µs since the trace's first event (the x axis)."""
    return (np.asarray(ns, dtype=np.int64) - origin) / NS_PER_US


# --- the index of a trace ------------------------------------------------------------------

def slice_table(trace: Trace) -> pd.DataFrame:
    """The slices without their args (cheaper on large traces than `trace.slices`)."""
    return trace.table("slices")


def slice_args(trace: Trace, slice_id: int) -> dict[str, Any]:
    """One slice's args (the trace keeps them apart from the slice table)."""
    args = trace.slice_args.get(slice_id)
    return args if isinstance(args, dict) else {}


def build_index(trace: Trace, fold_dma: bool = True,
                tracks: list[str | int] | None = None) -> TimelineIndex:
    """The level-of-detail index of a trace, or of the tracks named (track names or ids)."""
    slices, track_table, counters = slice_table(trace), trace.tracks, trace.counters
    if tracks is not None:
        wanted = {str(t) for t in tracks}
        keep = track_table[track_table["name"].astype(str).isin(wanted)
                           | track_table["track_id"].astype(str).isin(wanted)]
        if keep.empty:
            from neuron_explorer.common.errors import NeuronExplorerError

            known = ", ".join(track_table["name"].astype(str).unique()[:20])
            raise NeuronExplorerError(f"no track named {', '.join(sorted(wanted))} in this trace; "
                                      f"tracks are {known}")
        ids = set(keep["track_id"])
        slices = slices[slices["track_id"].isin(ids)]
        counters = counters[counters["track_id"].isin(ids)] if "track_id" in counters else counters
        track_table = keep
    return TimelineIndex(slices, track_table, counters, fold_dma=fold_dma)


def steps_window(trace: Trace, index: TimelineIndex) -> tuple[int, int]:
    """The recorded steps with a little margin (the whole trace when it has no steps): startup
    and exit-time work would otherwise fill most of the first view."""
    steps = trace.steps
    if steps.empty or not {"ts", "dur"} <= set(steps.columns):
        return index.start_ns, index.end_ns
    lo = int(steps["ts"].min())
    hi = int((steps["ts"] + steps["dur"]).max())
    pad = max((hi - lo) // 50, 1)
    return max(lo - pad, index.start_ns), min(hi + pad, index.end_ns)


def clamp_window(index: TimelineIndex, t0: float, t1: float) -> tuple[int, int]:
    """A window in ns, at least 1 ns wide and within three trace lengths of the trace."""
    total = max(index.end_ns - index.start_ns, 1)
    lo_limit, hi_limit = index.start_ns - total, index.end_ns + total
    t0 = int(min(max(t0, lo_limit), hi_limit - 1))
    t1 = int(min(max(t1, t0 + 1), hi_limit))
    return t0, t1


# --- one window as a figure ------------------------------------------------------------------

def timeline_figure(
    index: TimelineIndex,
    window: WindowRows,
    selected: int | None = None,
    flow_partners: list[int] | None = None,
    path: pd.DataFrame | None = None,
) -> dict:
    """A figure dict for dcc.Graph or go.Figure: bars per category, counter lines, the
    selection, and the critical path (`Trace.critical_path()` rows) when given."""
    traces = slice_bars(window, index.start_ns) + counter_lines(index, window)
    if path is not None:
        traces += critical_path_line(index, window, path)
    shapes = selection_shapes(index, window, selected, flow_partners or [])
    return {"data": traces, "layout": timeline_layout(index, window, shapes)}


def critical_path_line(index: TimelineIndex, window: WindowRows, path: pd.DataFrame) -> list[dict]:
    """The critical path's segments in the window as one thick line along the top of each
    segment's track (its first row), joined across tracks where the path moves from one
    to another (a sync, a launch, a dependency)."""
    first_row: dict[int, int] = {}
    for i, row in enumerate(index.slice_rows):
        first_row.setdefault(int(row.track_id), i)
    ts = path["ts"].to_numpy(np.int64)
    end = ts + path["dur"].to_numpy(np.int64)
    seen = (end > window.t0) & (ts < window.t1) & path["track"].isin(list(first_row)).to_numpy()
    if not seen.any():
        return []
    part = path[seen]
    rows = np.array([first_row[int(t)] for t in part["track"]], np.float64) - 0.45
    x0, x1 = to_us(ts[seen], index.start_ns), to_us(end[seen], index.start_ns)
    # points in time order: each segment from its start to its end, the next one joined on
    xs = np.column_stack([x0, x1]).ravel()
    ys = np.repeat(rows, 2)
    text = [f"critical path: {n} ({c}) · {fmt_ns(d)}"
            for n, c, d in zip(part["name"], part["category"], part["dur"], strict=True)]
    return [{
        "type": "scatter",
        "mode": "lines",
        "name": "critical path",
        "x": typed_array(xs, "f8"),
        "y": typed_array(ys, "f8"),
        "text": [t for t in text for _ in (0, 1)],
        "hovertemplate": "%{text}<extra></extra>",
        "line": {"color": CRITICAL_PATH_COLOUR, "width": 4},
        "showlegend": False,
    }]


def slice_bars(window: WindowRows, origin: int) -> list[dict]:
    """One horizontal bar trace per category; bars narrower than a bucket are widened so every
    slice stays visible."""
    cats = np.asarray(window.categories, dtype=object)
    names = np.asarray(window.names, dtype=object)
    end = np.maximum(window.end, window.start + int(window.bucket_ns))
    bars = []
    for cat in sorted(set(window.categories)):
        pick = np.flatnonzero(cats == cat)
        real = window.end[pick] - window.start[pick]
        bars.append({
            "type": "bar",
            "orientation": "h",
            "name": cat,
            "base": typed_array(to_us(window.start[pick], origin), "f8"),
            "x": typed_array((end[pick] - window.start[pick]) / NS_PER_US, "f8"),
            "y": typed_array(window.row[pick], "i4"),
            # a plain list: Dash passes customdata of a clicked point only from plain arrays
            "customdata": window.ids[pick].tolist(),
            "text": names[pick].tolist(),
            "hovertext": [f"{n} · {fmt_ns(d)}" for n, d in zip(names[pick], real, strict=True)],
            "textposition": "inside",
            "insidetextanchor": "start",
            "textfont": {"color": "#ffffff"},
            "hovertemplate": "%{hovertext}<extra>" + cat + "</extra>",
            "marker": {"color": category_colour(cat), "line": {"width": 0}},
            "width": 0.8,
            "showlegend": False,
        })
    return bars


def counter_lines(index: TimelineIndex, window: WindowRows) -> list[dict]:
    """Each counter row as a step line scaled into its row (the maximum per pixel)."""
    lines = []
    for row, ts, values in window.counters:
        row_info = index.counter_rows[row - len(index.slice_rows)]
        y = row + 0.4 - 0.8 * values / row_info.vmax
        lines.append({
            "type": "scatter",
            "mode": "lines",
            "line": {"shape": "hv", "width": 1.5, "color": "#3b6ea8"},
            "x": typed_array(to_us(ts, index.start_ns), "f8"),
            "y": typed_array(y, "f8"),
            "customdata": typed_array(values, "f8"),
            "hovertemplate": f"{row_info.label}: " + "%{customdata:,.4~g}<extra></extra>",
            "showlegend": False,
        })
    return lines


def timeline_layout(index: TimelineIndex, window: WindowRows, shapes: list[dict]) -> dict:
    """Rows top to bottom, a time axis on top in round units, pan by dragging."""
    labels = index.labels
    origin = index.start_ns
    return {
        "barmode": "overlay",
        "height": max(len(labels), 1) * ROW_PX + 80,
        "margin": {"l": 190, "r": 20, "t": 30, "b": 40},
        "xaxis": {
            "range": [float(to_us(window.t0, origin)), float(to_us(window.t1, origin))],
            "title": {"text": "time since trace start"},
            **time_ticks(window.t0, window.t1, origin),
            "showgrid": True,
            "gridcolor": GRID_COLOUR,
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
        "font": {"family": FONT_FAMILY, "size": 11},
        "shapes": shapes,
        "uirevision": "timeline",
    }


def time_ticks(t0: int, t1: int, origin: int, target: int = 8) -> dict:
    """About `target` ticks at round times, labelled in the unit that reads best
    (2.221 s, 14.5 ms)."""
    span = max(t1 - t0, 1)
    raw = span / target
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.ceil((t0 - origin) / step) * step
    ticks = np.arange(first, t1 - origin + 1, step)
    unit, size = next((u, z) for u, z in (("s", 1e9), ("ms", 1e6), ("µs", 1e3), ("ns", 1.0))
                      if step / z >= 1e-3)
    decimals = max(0, math.ceil(-math.log10(step / size) - 1e-9))
    labels = [f"{t / size:,.{decimals}f} {unit}" for t in ticks]
    return {"tickmode": "array", "tickvals": (ticks / NS_PER_US).tolist(), "ticktext": labels}


def selection_shapes(index: TimelineIndex, window: WindowRows, selected: int | None,
                     partners: list[int]) -> list[dict]:
    """Outline the selected slice and draw a line to each flow partner."""
    if selected is None or selected == SUMMARY_ID:
        return []
    box = _slice_box(index, selected)
    if box is None:
        return []
    origin = index.start_ns
    row, ts, end = box
    x0 = float(to_us(int(ts), origin))
    x1 = float(to_us(int(max(end, ts + window.bucket_ns)), origin))
    shapes = [{
        "type": "rect", "x0": x0, "x1": x1, "y0": row - 0.5, "y1": row + 0.5,
        "line": {"color": SELECTION_COLOUR, "width": 2}, "fillcolor": "rgba(0,0,0,0)",
    }]
    for partner in partners[:MAX_FLOW_LINES]:
        other = _slice_box(index, partner)
        if other is None:
            continue
        orow, ots, _ = other
        shapes.append({
            "type": "line", "x0": x0, "y0": row, "x1": float(to_us(ots, origin)), "y1": orow,
            "line": {"color": SELECTION_COLOUR, "width": 1, "dash": "dot"},
        })
    return shapes


def _slice_box(index: TimelineIndex, slice_id: int) -> tuple[int, int, int] | None:
    row = index.row_of(slice_id)
    if row is None:
        return None
    r = index.slice_rows[row]
    i = int(np.flatnonzero(r.ids == slice_id)[0])
    return row, int(r.ts[i]), int(r.end[i])


# --- trace.plot.timeline() -------------------------------------------------------------------

def widgets_available() -> bool:
    """Whether plotly's FigureWidget can be made here (it needs ipywidgets and anywidget)."""
    try:
        import anywidget  # noqa: F401
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True


def in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (where a widget can be shown)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and hasattr(shell, "kernel")


def timeline(index: TimelineIndex, t0: int, t1: int, interactive: bool | None = None,
             width_px: int = WIDTH_PX, path: pd.DataFrame | None = None) -> Any:
    """A Figure of [t0, t1], with the critical path `path` drawn over it when given; with
    `interactive` (default: in Jupyter when ipywidgets and anywidget are installed) a
    FigureWidget that queries the index again on zoom and pan."""
    import plotly.graph_objects as go

    t0, t1 = clamp_window(index, t0, t1)
    figure = timeline_figure(index, index.query(t0, t1, width_px), path=path)
    if interactive is None:
        interactive = in_notebook() and widgets_available()
    if not interactive:
        return go.Figure(figure)
    if not widgets_available():
        from neuron_explorer.common.errors import NeuronExplorerError

        raise NeuronExplorerError("an interactive timeline needs ipywidgets and anywidget: "
                                  "pip install ipywidgets anywidget (or pass interactive=False)")
    widget = go.FigureWidget(figure)
    follow_zoom(widget, index, width_px, path)
    return widget


def follow_zoom(widget: Any, index: TimelineIndex, width_px: int = WIDTH_PX,
                path: pd.DataFrame | None = None) -> None:
    """On each change of the x range, draw the new window from the index (as the dashboard does)."""
    def redraw(_layout: Any, x_range: Any) -> None:
        if not x_range or x_range[0] is None or x_range[1] is None:
            return
        origin = index.start_ns
        t0, t1 = clamp_window(index, origin + x_range[0] * NS_PER_US,
                              origin + x_range[1] * NS_PER_US)
        redraw_window(widget, index, index.query(t0, t1, width_px), path)

    widget.layout.xaxis.on_change(redraw, "range")


def redraw_window(widget: Any, index: TimelineIndex, window: WindowRows,
                  path: pd.DataFrame | None = None) -> None:
    """Replace the widget's traces and ticks by those of `window`, keeping its x range."""
    figure = timeline_figure(index, window, path=path)
    ticks = figure["layout"]["xaxis"]
    with widget.batch_update():
        widget.data = ()
        widget.add_traces(figure["data"])
        widget.layout.xaxis.tickvals = ticks["tickvals"]
        widget.layout.xaxis.ticktext = ticks["ticktext"]
