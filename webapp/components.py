"""Building blocks every page uses: metric cards, notices, sections, sortable tables."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import dash_ag_grid as dag
import numpy as np
import pandas as pd
from dash import dcc, html

if TYPE_CHECKING:
    import plotly.graph_objects as go

GRAPH_CONFIG = {"displaylogo": False, "responsive": True,
                "modeBarButtonsToRemove": ["lasso2d", "select2d"]}


def page_url(path: str, trace: str | None, **params) -> str:
    """A link to a page of the app for a trace, with extra query parameters."""
    query = {"trace": trace} if trace else {}
    query.update({k: v for k, v in params.items() if v is not None})
    return path + ("?" + urlencode(query) if query else "")


def notice(message: str, kind: str = "info") -> html.Div:
    """A quiet box saying why something is not shown (kind: info, warning, error)."""
    return html.Div(message, className=f"notice notice-{kind}")


def metric(label: str, value: str, hint: str | None = None) -> html.Div:
    """One figure in a card: a big value over a small label."""
    children = [html.Div(value, className="metric-value"),
                html.Div(label, className="metric-label")]
    if hint:
        children.append(html.Div(hint, className="metric-hint"))
    return html.Div(children, className="metric")


def section(title: str, *children, subtitle: str | None = None) -> html.Section:
    """A titled white panel."""
    head = [html.H2(title)]
    if subtitle:
        head.append(html.P(subtitle, className="section-subtitle"))
    return html.Section(head + list(children), className="panel")


def page_title(title: str, subtitle: str | None = None) -> html.Div:
    return html.Div(
        [html.H1(title)] + ([html.P(subtitle, className="page-subtitle")] if subtitle else []),
        className="page-title",
    )


def _jsonable(df: pd.DataFrame) -> pd.DataFrame:
    """Columns the grid can show: numbers stay numbers, everything else becomes text."""
    out = pd.DataFrame(index=df.index)
    for col in df.columns:
        s = df[col]
        if pd.api.types.is_bool_dtype(s):
            out[col] = s.astype(str)
        elif pd.api.types.is_integer_dtype(s):
            out[col] = s.astype("int64")
        elif pd.api.types.is_float_dtype(s):
            out[col] = s.astype("float64").round(6).replace([np.inf, -np.inf], np.nan)
        else:
            out[col] = s.map(lambda v: "" if v is None or (isinstance(v, float) and np.isnan(v))
                             else str(v))
    return out


_US_SUFFIX = "_us"


def _ns_as_us(df: pd.DataFrame) -> pd.DataFrame:
    """Durations in ns (`*_ns` numeric columns) as µs: 12,345,678 ns reads as 12,345.7 µs,
    and the filter boxes take µs, as the header says."""
    ns = [c for c in df.columns if str(c).endswith("_ns") and pd.api.types.is_numeric_dtype(df[c])
          and not pd.api.types.is_bool_dtype(df[c])]
    if not ns:
        return df
    return df.assign(**{c: df[c] / 1000.0 for c in ns}).rename(
        columns={c: str(c)[:-3] + _US_SUFFIX for c in ns})


def _header(column: str) -> str:
    """'device_us' -> 'device (µs)'."""
    return column[:-len(_US_SUFFIX)] + " (µs)" if column.endswith(_US_SUFFIX) else column


# d3-format specifiers (the grid formats numbers in the browser with d3-format).
_US_FORMAT, _SHARE_FORMAT, _FLOAT_FORMAT, _INT_FORMAT = ",.1f", ".2~%", ",.4~r", ","


def _number_format(column: str, values: pd.Series) -> str:
    if column.endswith(_US_SUFFIX):
        return _US_FORMAT
    if "share" in column:
        return _SHARE_FORMAT
    return _FLOAT_FORMAT if pd.api.types.is_float_dtype(values) else _INT_FORMAT


def _column_def(column: str, values: pd.Series) -> dict[str, Any]:
    spec: dict[str, Any] = {"field": column, "headerName": _header(column)}
    if pd.api.types.is_numeric_dtype(values):
        specifier = _number_format(column, values)
        # A missing figure stays blank: d3.format would print null as 0.
        spec.update(cellDataType="number", filter="agNumberColumnFilter", type="rightAligned",
                    valueFormatter={"function": f"params.value == null ? '' : "
                                                f"d3.format('{specifier}')(params.value)"},
                    # the box under the header keeps rows at or above the number typed
                    filterParams={"defaultOption": "greaterThanOrEqual"})
    else:
        spec.update(cellDataType="text", filter="agTextColumnFilter", tooltipField=column)
    return spec


# The grid's look, close to the page's panels; fonts come from the page (nothing is fetched).
_THEME = ("themeQuartz.withParams({fontFamily: 'inherit', fontSize: 13, spacing: 6,"
          " headerBackgroundColor: '#f3f5f8', headerFontWeight: 600, wrapperBorderRadius: 6})")


def data_table(df: pd.DataFrame, table_id: str, page_size: int = 20,
               selectable: bool = False) -> html.Div:
    """A paged grid that sorts, filters (a box under each header) and exports CSV (the Export
    button, assets/grid_export.js); numbers keep a numeric type for sorting and filtering.
    `selectable`: a row can be picked (the grid's `selectedRows`)."""
    clean = _jsonable(_ns_as_us(df))
    records = clean.astype(object).where(clean.notna(), None).to_dict("records")
    options: dict[str, Any] = {
        "theme": {"function": _THEME},
        "pagination": True,
        "paginationPageSize": page_size,
        "paginationPageSizeSelector": False,
        "domLayout": "autoHeight",  # as tall as its page: no scroll box inside the page
        "suppressFieldDotNotation": True,  # a '.' in a column name is not a nested field
        "tooltipShowMode": "whenTruncated",  # long names are cut with an ellipsis
        "tooltipShowDelay": 300,
        "enableCellTextSelection": True,
    }
    if selectable:
        options["rowSelection"] = {"mode": "singleRow", "checkboxes": True,
                                   "enableClickSelection": True}
    grid = dag.AgGrid(
        id=table_id,
        columnDefs=[_column_def(str(col), clean[col]) for col in clean.columns],
        rowData=records,
        defaultColDef={"sortable": True, "floatingFilter": True, "resizable": True,
                       "minWidth": 90, "maxWidth": 420,
                       "useValueFormatterForExport": False},  # CSV keeps full numbers
        columnSize="autoSize",
        dashGridOptions=options,
        style={"height": None},  # domLayout sets the height
    )
    export = html.Button("Export CSV", className="grid-export", **{"data-grid": table_id})
    return html.Div([export, grid], className="data-grid")


def graph(figure: go.Figure, graph_id: str | None = None, **kwargs: Any) -> dcc.Graph:
    """A figure of `neuron_explorer.plot` (which gives it the app's look) with a trimmed mode
    bar."""
    extra = {"id": graph_id} if graph_id else {}
    return dcc.Graph(figure=figure, config=GRAPH_CONFIG, **extra, **kwargs)
