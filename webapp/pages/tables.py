"""Tables of ops, modules and kernels: sort, filter, search, export CSV, open a row in the timeline."""

from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate
from neuron_explorer.webapp.callback_input import BadInputError, finite
from neuron_explorer.webapp.components import data_table, notice, page_title, page_url, section
from neuron_explorer.webapp.page_data import fetch, table

PATH = "/tables"
TITLE = "Tables"

# tab -> (stats method, label, instance table, column matching the stats' name)
SORT_BY = ("share_of_step", "device_ns", "total_ns", "share", "count")
TABLES = {
    "ops": ("op_stats", "ops", "ops", "name"),
    "modules": ("module_stats", "modules", "modules", "module"),
    "kernels": ("kernel_stats", "kernels", "kernels", "name"),
}


def layout(trace: Any, name: str, params: dict, ctx: Any) -> html.Div:
    tab = str(params["tab"]) if params.get("tab") in TABLES else "ops"
    return html.Div([
        page_title(TITLE, name),
        dcc.Store(id="tables-trace", data=name),
        dcc.Tabs(id="tables-tab", value=tab, children=[
            dcc.Tab(label=label.capitalize(), value=key) for key, (_, label, _, _) in TABLES.items()
        ], className="tabs"),
        html.Div(_tab_body(trace, tab), id="tables-body"),
    ])


def _tab_body(trace: Any, tab: str) -> list:
    method, label, _, _ = TABLES[tab]
    data = fetch(trace, method, f"{label} statistics")
    if not data.ok:
        return [section(label.capitalize(), notice(data.missing))]
    df = data.value
    for column in SORT_BY:
        if column in df.columns:
            df = df.sort_values(column, ascending=False)
            break
    name_column = "module" if "module" in df.columns and "name" not in df.columns else "name"
    return [section(
        f"{label.capitalize()} ({len(df):,})",
        dcc.Input(id="tables-search", type="search", debounce=True, className="search",
                  placeholder=f"Search {label} by name…"),
        dcc.Store(id="tables-name-column", data=name_column),
        html.Div(id="tables-selection", className="selection-bar",
                 children=html.Span("Select a row to open its longest call in the timeline.", className="hint")),
        data_table(df.reset_index(drop=True), "stats-table", page_size=20, selectable=True),
        subtitle="Filter with the boxes under the headers (e.g. >1000, contains text); Export writes CSV",
    ), dcc.Store(id="tables-kind", data=tab)]


def longest_instance(trace: Any, tab: str, key: str) -> tuple[int, int, int] | None:
    """(slice id, ts, dur) of the longest occurrence of a stats row's name."""
    _, _, instance_table, column = TABLES[tab]
    df = table(trace, instance_table)
    if df.empty or column not in df.columns or "id" not in df.columns:
        return None
    hits = df[df[column].astype(str) == key]
    if hits.empty:
        return None
    best = hits.loc[hits["dur"].idxmax()]
    return int(best["id"]), int(best["ts"]), int(best["dur"])


def register(app: dash.Dash, ctx) -> None:
    @app.callback(
        Output("tables-body", "children"),
        Input("tables-tab", "value"),
        State("tables-trace", "data"),
        prevent_initial_call=True,
    )
    def switch_tab(tab, name):
        if not name or tab not in TABLES:
            raise PreventUpdate
        return _tab_body(ctx.store.get(name), tab)

    @app.callback(
        Output("stats-table", "filter_query"),
        Input("tables-search", "value"),
        State("tables-name-column", "data"),
        prevent_initial_call=True,
    )
    def search(text, column):
        """The search box filters the name column (the per-column boxes stay available)."""
        text = (text or "").strip().replace('"', "")
        return f'{{{column}}} icontains "{text}"' if text else ""

    @app.callback(
        Output("tables-selection", "children"),
        Input("stats-table", "selected_rows"),
        State("stats-table", "data"),
        State("tables-kind", "data"),
        State("tables-trace", "data"),
        prevent_initial_call=True,
    )
    def show_selection(selected, rows, tab, name):
        if not selected or not rows or not name:
            raise PreventUpdate
        if tab not in TABLES or not isinstance(rows, list) or not isinstance(selected, list):
            raise BadInputError("a table selection needs a known tab and a list of rows")
        position = int(finite(selected[0], "selected row"))
        if not 0 <= position < len(rows) or not isinstance(rows[position], dict):
            raise BadInputError(f"no row {position} in this table")
        _, _, _, column = TABLES[tab]
        row = rows[position]
        key = str(row.get(column, row.get("name", "")))
        found = longest_instance(ctx.store.get(name), tab, key)
        if found is None:
            return notice(f"No occurrence of {key} is on the timeline.", "warning")
        slice_id, ts, dur = found
        pad = max(dur, 1000)
        href = page_url("/timeline", name, start=ts - pad, end=ts + dur + pad, select=slice_id)
        return [html.Span(f"{key}: ", className="selection-name"),
                dcc.Link("Show the longest call in the timeline ▸", href=href, id="tables-open-timeline")]
