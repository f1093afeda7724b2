"""Building blocks every page uses: metric cards, notices, sections, sortable tables."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import numpy as np
import pandas as pd
from dash import dash_table, dcc, html

if TYPE_CHECKING:
    import plotly.graph_objects as go

GRAPH_CONFIG = {"displaylogo": False, "responsive": True, "modeBarButtonsToRemove": ["lasso2d", "select2d"]}


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
    children = [html.Div(value, className="metric-value"), html.Div(label, className="metric-label")]
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
    """Columns a DataTable can show: numbers stay numbers, everything else becomes text."""
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
            out[col] = s.map(lambda v: "" if v is None or (isinstance(v, float) and np.isnan(v)) else str(v))
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


def data_table(df: pd.DataFrame, table_id, page_size: int = 20, selectable: bool = False, **kwargs):
    """A sortable, filterable DataTable that exports CSV; numbers keep a numeric type for sorting."""
    clean = _jsonable(_ns_as_us(df))
    columns = []
    for col in clean.columns:
        spec: dict[str, Any] = {"name": _header(str(col)), "id": str(col)}
        if pd.api.types.is_numeric_dtype(clean[col]):
            spec["type"] = "numeric"
            if str(col).endswith(_US_SUFFIX):
                spec["format"] = {"specifier": ",.1f"}
            elif "share" in str(col):
                spec["format"] = {"specifier": ".2~%"}
            elif pd.api.types.is_float_dtype(clean[col]):
                spec["format"] = {"specifier": ",.4~r"}
            else:
                spec["format"] = {"specifier": ","}
        columns.append(spec)
    records = clean.astype(object).where(clean.notna(), None).to_dict("records")
    return dash_table.DataTable(
        id=table_id,
        columns=columns,
        data=records,
        sort_action="native",
        filter_action="native",
        page_action="native",
        page_size=page_size,
        export_format="csv",
        export_headers="display",
        row_selectable="single" if selectable else False,
        style_table={"overflowX": "auto"},
        style_cell={
            "fontFamily": "inherit", "fontSize": "13px", "padding": "6px 10px",
            "textAlign": "left", "maxWidth": "420px", "overflow": "hidden", "textOverflow": "ellipsis",
        },
        style_header={"backgroundColor": "#f3f5f8", "fontWeight": "600", "borderBottom": "1px solid #d5dae0"},
        style_data={"borderBottom": "1px solid #eceff3"},
        style_filter={"backgroundColor": "#fbfcfd"},
        **kwargs,
    )


def graph(figure: go.Figure, graph_id: str | None = None, **kwargs: Any) -> dcc.Graph:
    """A figure of `neuron_explorer.plot` (which gives it the app's look) with a trimmed mode bar."""
    extra = {"id": graph_id} if graph_id else {}
    return dcc.Graph(figure=figure, config=GRAPH_CONFIG, **extra, **kwargs)
