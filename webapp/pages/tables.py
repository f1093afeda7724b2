"""Tables of ops, modules and kernels: sort, filter, search, export CSV, open a row in the
timeline."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import dash
import pandas as pd
from dash import Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate
from neuron_explorer.webapp.callback_input import BadInputError
from neuron_explorer.webapp.components import data_table, notice, page_title, page_url, section
from neuron_explorer.webapp.page_data import fetch

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace
    from neuron_explorer.webapp.context import AppContext

PATH = "/tables"
TITLE = "Tables"

SORT_BY = ("share_of_step", "device_ns", "total_ns", "share", "count")
Table = Callable[["Trace"], pd.DataFrame]
# tab -> (statistics, label, instances, column matching the statistics' name)
TABLES: dict[str, tuple[Table, str, Table, str]] = {
    "ops": (lambda t: t.op_stats(), "ops", lambda t: t.ops, "name"),
    "modules": (lambda t: t.module_stats(), "modules", lambda t: t.modules, "module"),
    "kernels": (lambda t: t.kernel_stats(), "kernels", lambda t: t.kernels, "name"),
}


def layout(trace: Trace, name: str, params: dict[str, str], ctx: AppContext) -> html.Div:
    tab = params.get("tab") or "ops"
    tab = tab if tab in TABLES else "ops"
    return html.Div([
        page_title(TITLE, name),
        dcc.Store(id="tables-trace", data=name),
        dcc.Tabs(id="tables-tab", value=tab, children=[
            dcc.Tab(label=label.capitalize(), value=key) for key, (_, label, _, _) in TABLES.items()
        ], className="tabs"),
        html.Div(_tab_body(trace, tab), id="tables-body"),
    ])


def _tab_body(trace: Trace, tab: str) -> list:
    stats, label, _, _ = TABLES[tab]
    data = fetch(lambda: stats(trace), f"{label} statistics")
    if data.value is None:
        return [section(label.capitalize(), notice(str(data.missing)))]
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
                 children=html.Span("Select a row to open its longest call in the timeline.",
                                    className="hint")),
        data_table(df.reset_index(drop=True), "stats-table", page_size=20, selectable=True),
        subtitle="Filter with the boxes under the headers (a number keeps rows at or above it, "
                 "text keeps rows that contain it; the funnel beside a box picks another test)",
    ), dcc.Store(id="tables-kind", data=tab)]


def longest_instance(trace: Trace, tab: str, key: str) -> tuple[int, int, int] | None:
    """(slice id, ts, dur) of the longest occurrence of a stats row's name."""
    _, _, instances, column = TABLES[tab]
    df = instances(trace)
    if df.empty or column not in df.columns or "id" not in df.columns:
        return None
    hits = df[df[column].astype(str) == key]
    if hits.empty:
        return None
    best = hits.loc[hits["dur"].idxmax()]
    return int(best["id"]), int(best["ts"]), int(best["dur"])


def register(app: dash.Dash, ctx: AppContext) -> None:
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
        Output("stats-table", "filterModel"),
        Input("tables-search", "value"),
        State("tables-name-column", "data"),
        State("stats-table", "filterModel"),
        prevent_initial_call=True,
    )
    def search(query, column, model):
        """The search box filters the name column; the other columns' filters stay as set."""
        if not isinstance(query, str | None) or not isinstance(column, str):
            raise BadInputError("a search is a text over a named column")
        model = dict(model) if isinstance(model, dict) else {}
        model.pop(column, None)
        if query and query.strip():
            model[column] = {"filterType": "text", "type": "contains", "filter": query.strip()}
        return model

    @app.callback(
        Output("tables-selection", "children"),
        Input("stats-table", "selectedRows"),
        State("tables-kind", "data"),
        State("tables-trace", "data"),
        prevent_initial_call=True,
    )
    def show_selection(selected, tab, name):
        if not selected or not name:
            raise PreventUpdate
        if tab not in TABLES or not isinstance(selected, list) or not isinstance(selected[0], dict):
            raise BadInputError("a table selection needs a known tab and a row")
        row = selected[0]
        _, _, _, column = TABLES[tab]
        key = str(row.get(column, row.get("name", "")))
        found = longest_instance(ctx.store.get(name), tab, key)
        if found is None:
            return notice(f"No occurrence of {key} is on the timeline.", "warning")
        slice_id, ts, dur = found
        pad = max(dur, 1000)
        href = page_url("/timeline", name, start=ts - pad, end=ts + dur + pad, select=slice_id)
        return [html.Span(f"{key}: ", className="selection-name"),
                dcc.Link("Show the longest call in the timeline ▸", href=href,
                         id="tables-open-timeline")]
