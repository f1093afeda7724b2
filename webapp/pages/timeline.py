"""Timeline: every track of the trace, zoomable, with the details and flows of a clicked slice.

The browser never holds the whole trace: each zoom or pan asks the server for the
visible window, which the timeline index answers with pixel-merged bars.
"""

from __future__ import annotations

import contextlib
import json
from typing import TYPE_CHECKING

import dash
import numpy as np
import pandas as pd
from dash import ALL, Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate
from neuron_explorer.plot.theme import category_colour
from neuron_explorer.plot.timeline import (
    NS_PER_US,
    WIDTH_PX,
    build_index,
    clamp_window,
    slice_args,
    slice_table,
    steps_window,
    timeline_figure,
)
from neuron_explorer.plot.timeline_index import SUMMARY_ID, TimelineIndex
from neuron_explorer.webapp import formatting as fmt
from neuron_explorer.webapp.callback_input import BadInputError, finite, int_or_default, text
from neuron_explorer.webapp.components import GRAPH_CONFIG, notice, page_title

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace
    from neuron_explorer.webapp.context import AppContext
    from neuron_explorer.webapp.trace_store import TraceStore

PATH = "/timeline"
TITLE = "Timeline"
MAX_LINKS = 24
ARG_ORDER = ["shapes", "dtypes", "flops", "hw_flops", "bytes", "module", "source", "phase", "step",
             "op_id", "kernel_id", "engine", "opcode", "device", "fallback", "graph_id", "kind",
             "reason"]


def timeline_index(store: TraceStore, name: str, fold_dma: bool = True) -> TimelineIndex:
    """The trace's timeline index, built on first use and kept with the trace."""
    return store.derived(name, f"timeline-index-{fold_dma}",
                         lambda trace: build_index(trace, fold_dma))


def critical_path(store: TraceStore, name: str) -> pd.DataFrame:
    """The trace's critical path (every analysed step), computed on first use and kept."""
    return store.derived(name, "critical-path", lambda trace: trace.critical_path())


def window_answer(store: TraceStore, name: str, t0: int, t1: int, selected: int | None,
                  fold_dma: bool = True, path: bool = False) -> tuple[dict, str]:
    """The figure for a window (with the critical path over it, when `path`) and the
    status line saying what it shows."""
    index = timeline_index(store, name, fold_dma)
    window = index.query(t0, t1, WIDTH_PX)
    partners = flow_partners(store.get(name), selected) if selected is not None else []
    figure = timeline_figure(index, window, selected, [p for p, _ in partners],
                             path=critical_path(store, name) if path else None)
    merged = int(window.count[window.ids == SUMMARY_ID].sum())
    status = (f"{fmt.duration(t1 - t0)} window · {window.n_bars:,} bars"
              + (f" ({merged:,} small slices merged)" if merged else "")
              + f" · {index.n_events:,} events in trace")
    return figure, status


def layout(trace: Trace, name: str, params: dict[str, str], ctx: AppContext) -> html.Div:
    fold = params.get("dma") != "all"
    index = timeline_index(ctx.store, name, fold)
    if not index.slice_rows and not index.counter_rows:
        return html.Div([page_title(TITLE, name),
                         notice("This trace has no slices or counters to draw.")])
    steps = steps_window(trace, index)
    t0, t1 = clamp_window(index, int_or_default(params.get("start"), steps[0]),
                          int_or_default(params.get("end"), steps[1]))
    selected = int_or_default(params.get("select"), None)
    path = params.get("path") == "1"
    figure, status = window_answer(ctx.store, name, t0, t1, selected, fold, path)
    dma_toggle = dcc.Checklist(
        id="timeline-dma", options=[{"label": " every DMA queue on its own row", "value": "all"}],
        value=[] if fold else ["all"], className="dma-toggle",
        style={} if (index.folded_dma_queues or not fold) else {"display": "none"})
    has_steps = steps != (index.start_ns, index.end_ns)
    path_toggle = dcc.Checklist(
        id="timeline-path", options=[{"label": " critical path", "value": "path"}],
        value=["path"] if path else [], className="dma-toggle",
        style={} if has_steps else {"display": "none"})
    details = slice_details(trace, index, selected) if selected is not None else _hint()
    return html.Div([
        page_title(TITLE, name),
        html.Div([
            html.Button("◀", id="timeline-pan-left", className="button",
                        title="Pan left (A or ←)"),
            html.Button("▶", id="timeline-pan-right", className="button",
                        title="Pan right (D or →)"),
            html.Button("Zoom in", id="timeline-zoom-in", className="button",
                        title="Zoom in (W or ↑)"),
            html.Button("Zoom out", id="timeline-zoom-out", className="button",
                        title="Zoom out (S or ↓)"),
            html.Button("Steps", id="timeline-steps", className="button",
                        title="The recorded steps", style={} if has_steps else {"display": "none"}),
            html.Button("Whole trace", id="timeline-reset", className="button"),
            dma_toggle,
            path_toggle,
            html.Span(status, id="timeline-status", className="timeline-status"),
        ], className="toolbar"),
        html.Div([
            dcc.Input(id="timeline-search", type="search", className="search", debounce=True,
                      placeholder="Find a slice by name (op, module, kernel)… Enter for the next"),
            html.Button("Previous", id="timeline-search-prev", className="button"),
            html.Button("Next", id="timeline-search-next", className="button"),
            html.Span(id="timeline-search-status", className="timeline-status"),
        ], className="toolbar timeline-search"),
        legend(index),
        dcc.Store(id="timeline-state", data={"trace": name, "t0": t0, "t1": t1,
                                             "selected": selected, "fold": fold, "path": path,
                                             "steps": list(steps), "search": "", "match": -1}),
        dcc.Store(id="timeline-relayout"),
        html.Div(dcc.Graph(id="timeline-graph", figure=figure,
                           config={**GRAPH_CONFIG, "scrollZoom": True}),
                 className="panel timeline-panel"),
        html.Div(details, id="timeline-details", className="panel details"),
    ])


def legend(index: TimelineIndex) -> html.Div:
    """One swatch per category drawn, and the grey of merged bars."""
    items = [html.Span([html.Span(className="swatch", style={"background": category_colour(c)}), c],
                       className="legend-item") for c in index.categories]
    merged = html.Span(className="swatch", style={"background": category_colour("merged")})
    items.append(html.Span([merged, "merged (narrower than a pixel)"], className="legend-item"))
    return html.Div(items, id="timeline-legend", className="legend")


def _hint():
    return html.P("Drag to pan, scroll to zoom (or W/S, A/D and the arrow keys), click a slice "
                  "for its details and flows. "
                  "Grey bars merge slices narrower than a pixel: click one to zoom into it.",
                  className="hint")


def state_window(state: dict, index: TimelineIndex) -> tuple[int, int]:
    """The window the timeline state holds, checked and clamped to the trace."""
    return clamp_window(index, finite(state.get("t0"), "t0"), finite(state.get("t1"), "t1"))


def new_window(state: dict, index: TimelineIndex, trigger, relayout,
               click) -> tuple[int, int, int | None]:
    """The window and selection after one user action."""
    t0, t1 = state_window(state, index)
    selected = state.get("selected")
    selected = None if selected is None else int(finite(selected, "selected"))
    origin = index.start_ns
    span = t1 - t0
    if trigger == "timeline-zoom-in":
        return t0 + span // 4, t1 - span // 4, selected
    if trigger == "timeline-zoom-out":
        return t0 - span // 2, t1 + span // 2, selected
    if trigger == "timeline-reset":
        return index.start_ns, index.end_ns, selected
    if trigger in ("timeline-pan-left", "timeline-pan-right"):
        shift = span // 4 if trigger == "timeline-pan-right" else -(span // 4)
        return (*clamp_window(index, t0 + shift, t1 + shift), selected)
    if trigger == "timeline-steps":
        steps = state.get("steps") or [index.start_ns, index.end_ns]
        start, end = finite(steps[0], "steps"), finite(steps[1], "steps")
        return (*clamp_window(index, start, end), selected)
    if trigger in ("timeline-dma", "timeline-path"):
        return t0, t1, selected
    if trigger == "timeline-graph.relayoutData" and relayout:
        if relayout.get("xaxis.autorange"):
            return index.start_ns, index.end_ns, selected
        lo = relayout.get("xaxis.range[0]", (relayout.get("xaxis.range") or [None, None])[0])
        hi = relayout.get("xaxis.range[1]", (relayout.get("xaxis.range") or [None, None])[1])
        if lo is None or hi is None:
            raise PreventUpdate
        lo, hi = finite(lo, "xaxis.range[0]"), finite(hi, "xaxis.range[1]")
        return (*clamp_window(index, origin + lo * NS_PER_US, origin + hi * NS_PER_US), selected)
    if trigger == "timeline-graph.clickData" and click:
        points = click.get("points") if isinstance(click, dict) else None
        if not points or not isinstance(points[0], dict) or "customdata" not in points[0]:
            raise PreventUpdate  # a click that hit no bar
        point = points[0]
        slice_id = int(finite(point.get("customdata", SUMMARY_ID), "customdata"))
        if slice_id == SUMMARY_ID and "base" in point:
            base = finite(point["base"], "base")
            length = (finite(point.get("x"), "x") - base) * NS_PER_US  # x is the bar's end
            start = origin + base * NS_PER_US
            pad = max(length / 10, 1)
            return (*clamp_window(index, start - pad, start + length + pad), selected)
        return t0, t1, slice_id
    if isinstance(trigger, dict) and trigger.get("type") == "timeline-link":
        slice_id = int(finite(trigger.get("slice"), "slice"))
        row = index.row_of(slice_id)
        if row is None:
            return t0, t1, slice_id
        r = index.slice_rows[row]
        i = int(np.flatnonzero(r.ids == slice_id)[0])
        ts, end = int(r.ts[i]), int(r.end[i])
        if ts < t0 or end > t1:  # bring the target into view, keeping the zoom where it fits
            width = max(span, (end - ts) * 3)
            t0 = (ts + end) // 2 - width // 2
            t1 = t0 + width
        return t0, t1, slice_id
    raise PreventUpdate


def focus(t0: int, t1: int, ts: int, end: int) -> tuple[int, int]:
    """A window showing [ts, end] at a zoom where it can be seen: the current one when the slice
    is in it and not lost in it, else centred on the slice, a few hundred times its width."""
    span, dur = t1 - t0, max(end - ts, 1)
    width = max(min(span, dur * 200), dur * 3, 1000)
    if t0 <= ts and end <= t1 and span <= width:
        return t0, t1
    t0 = (ts + end) // 2 - width // 2
    return t0, t0 + width


SEARCH_TRIGGERS = ("timeline-search", "timeline-search-next", "timeline-search-prev")


def search_step(state: dict, index: TimelineIndex, trigger: str,
                text: str | None) -> tuple[str, int, np.ndarray]:
    """(query, match position, matches) after Enter in the search box or Next/Previous."""
    query = text.strip() if isinstance(text, str) else ""
    matches = index.search(query[:200])
    previous = int(finite(state.get("match", -1), "match")) if state.get("search") == query else -1
    if not matches.size:
        return query, -1, matches
    if trigger == "timeline-search-prev":
        return query, (previous - 1) % matches.size if previous >= 0 else matches.size - 1, matches
    return query, (previous + 1) % matches.size, matches


# Only a pan or zoom of the x axis reaches the server. Plotly's own relayout events
# (autosize after the first draw) would otherwise start a request that supersedes a
# click still in flight, and Dash would drop that click's answer.
_X_RANGE_ONLY = """
function(relayout) {
    if (relayout && ("xaxis.range[0]" in relayout || "xaxis.range" in relayout
                     || "xaxis.autorange" in relayout)) {
        return relayout;
    }
    return window.dash_clientside.no_update;
}
"""


def register(app: dash.Dash, ctx: AppContext) -> None:
    app.clientside_callback(_X_RANGE_ONLY, Output("timeline-relayout", "data"),
                            Input("timeline-graph", "relayoutData"))

    @app.callback(
        Output("timeline-graph", "figure"),
        Output("timeline-state", "data"),
        Output("timeline-details", "children"),
        Output("timeline-status", "children"),
        Output("timeline-search-status", "children"),
        Input("timeline-relayout", "data"),
        Input("timeline-graph", "clickData"),
        Input("timeline-zoom-in", "n_clicks"),
        Input("timeline-zoom-out", "n_clicks"),
        Input("timeline-pan-left", "n_clicks"),
        Input("timeline-pan-right", "n_clicks"),
        Input("timeline-steps", "n_clicks"),
        Input("timeline-reset", "n_clicks"),
        Input("timeline-dma", "value"),
        Input("timeline-path", "value"),
        Input("timeline-search", "n_submit"),
        Input("timeline-search-next", "n_clicks"),
        Input("timeline-search-prev", "n_clicks"),
        Input({"type": "timeline-link", "slice": ALL}, "n_clicks"),
        State("timeline-search", "value"),
        State("timeline-state", "data"),
        prevent_initial_call=True,
    )
    def update(relayout, click, _zin, _zout, _left, _right, _steps, _reset, dma, path_on, _submit,
               _next, _prev, _links, search_text, state):
        triggered = dash.ctx.triggered
        trigger = dash.ctx.triggered_id
        toggles = ("timeline-dma", "timeline-path")
        if not state or not triggered or (trigger not in toggles
                                          and triggered[0].get("value") in (None, 0, [])):
            raise PreventUpdate
        if trigger == "timeline-graph":
            trigger = "timeline-graph.clickData"
        elif trigger == "timeline-relayout":
            trigger = "timeline-graph.relayoutData"
        if not isinstance(state, dict):
            raise BadInputError("timeline-state must be an object")
        name = text(state.get("trace"), "timeline-state.trace")
        fold = "all" not in (dma or [])
        path = "path" in (path_on or [])
        index = timeline_index(ctx.store, name, fold)
        old_selected = state.get("selected")
        selected: int | None
        query, match = state.get("search", ""), state.get("match", -1)
        search_status = dash.no_update
        if trigger in SEARCH_TRIGGERS:
            query, match, matches = search_step(state, index, trigger, search_text)
            if match < 0:
                message = f"No slice named like {query!r}" if query else ""
                return dash.no_update, {**state, "search": query, "match": -1}, dash.no_update, \
                    dash.no_update, message
            selected = int(matches[match])
            t0, t1 = state_window(state, index)
            t0, t1 = focus(t0, t1, *(index.slice_span(selected) or (t0, t1)))
            search_status = f"{match + 1:,} of {matches.size:,} matches"
        else:
            t0, t1, selected = new_window(state, index, trigger, relayout, click)
        t0, t1 = clamp_window(index, t0, t1)
        figure, status = window_answer(ctx.store, name, t0, t1, selected, fold, path)
        details = dash.no_update
        if selected != old_selected and selected is not None:
            details = slice_details(ctx.store.get(name), index, selected)
        new_state = {"trace": name, "t0": t0, "t1": t1, "selected": selected, "fold": fold,
                     "path": path, "steps": state.get("steps"), "search": query, "match": match}
        return figure, new_state, details, status, search_status


def flow_partners(trace: Trace, slice_id: int) -> list[tuple[int, str]]:
    """Slices linked to this one: flows out and in, and a kernel's instructions."""
    flows = trace.flows
    out: list[tuple[int, str]] = []
    if not flows.empty:
        out += [(int(i), "leads to") for i in flows.loc[flows["src_id"] == slice_id, "dst_id"]]
        out += [(int(i), "comes from") for i in flows.loc[flows["dst_id"] == slice_id, "src_id"]]
    return out


def slice_details(trace: Trace, index: TimelineIndex, slice_id: int) -> list:
    """The details panel of one slice: its fields, arguments and linked slices."""
    slices = slice_table(trace)
    pos = index.table_position(slice_id)
    if pos is None:
        return [notice(f"No slice with id {slice_id} in this trace.", "warning")]
    s = slices.iloc[pos]
    row = index.row_of(slice_id)
    track = ""
    if row is not None:
        r = index.slice_rows[row]
        track = r.label + (f" (depth {r.depth})" if r.depth else "")
    fields = [
        ("name", str(s["name"])), ("category", str(s["category"])), ("track", track),
        ("start", f"{(int(s['ts']) - index.start_ns) / NS_PER_US:,.3f} µs since trace start"),
        ("duration", fmt.duration(int(s["dur"]))),
    ]
    args = slice_args(trace, slice_id)
    for key in ARG_ORDER + sorted(k for k in args if k not in ARG_ORDER):
        if key in args and args[key] is not None:
            fields.append((key, _format_arg(key, args[key])))
    rows = [html.Tr([html.Th(k), html.Td(v)]) for k, v in fields]
    parts = [html.H2(str(s["name"])),
             html.Table(html.Tbody(rows), className="kv", id="slice-fields")]
    links = _linked(trace, slices, index, slice_id, s)
    if links:
        parts.append(html.H3("Linked slices"))
        parts.append(html.Div(links, className="links"))
    return parts


def _linked(trace: Trace, slices: pd.DataFrame, index: TimelineIndex, slice_id: int, s) -> list:
    partners = flow_partners(trace, slice_id)
    parent = s.get("parent_id")
    if parent is not None and not pd.isna(parent) and int(parent) >= 0:
        partners.append((int(parent), "inside"))
    seen: set[int] = set()
    buttons: list[html.Button] = []
    for other, relation in partners:
        if other in seen or len(buttons) >= MAX_LINKS:
            continue
        seen.add(other)
        pos = index.table_position(other)
        if pos is None:
            continue
        o = slices.iloc[pos]
        label = f"{relation} {o['category']}: {o['name']} ({fmt.duration(int(o['dur']))})"
        buttons.append(html.Button(label, id={"type": "timeline-link", "slice": int(other)},
                                   className="link-button"))
    return buttons


def _format_arg(key: str, value) -> str:
    if key in ("flops", "hw_flops") and isinstance(value, (int, float)):
        number, _, prefix = fmt.count(value).partition(" ")
        return f"{number} {prefix}FLOP ({int(value):,})"
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    if (key == "bytes" or key.endswith("_bytes")) and numeric:
        return f"{fmt.size(value)} ({int(value):,})"
    if key.endswith("_ns") and numeric:
        return fmt.duration(value)
    if key.endswith("_ns") and isinstance(value, str) and value.startswith("{"):
        with contextlib.suppress(ValueError):
            value = json.loads(value)  # engine_busy_ns is stored as a JSON object
    if key.endswith("_ns") and isinstance(value, dict):  # per engine
        busy = [f"{k} {fmt.duration(v)}" for k, v in value.items()
                if isinstance(v, (int, float)) and v]
        return " · ".join(busy) or "none"
    return str(value)
