"""Compile: torch.compile graphs, graph breaks, recompiles and the time spent compiling."""

from __future__ import annotations

from typing import Any

import pandas as pd
from dash import html
from neuron_explorer.webapp import formatting as fmt
from neuron_explorer.webapp.components import data_table, metric, notice, page_title, section
from neuron_explorer.webapp.page_data import fetch, table

PATH = "/compile"
TITLE = "Compile"
PARTS = [("graphs", "Compiled graphs"), ("graph_breaks", "Graph breaks"), ("recompiles", "Recompiles")]


def layout(trace: Any, name: str, params: dict, ctx: Any) -> html.Div:
    data = fetch(trace, "compile_summary", "torch.compile activity (the program ran in eager mode)")
    parts: list = [page_title(TITLE, name)]
    if not data.ok:
        parts.append(section("torch.compile", notice(data.missing)))
        return html.Div(parts)
    summary: dict = data.value
    if not any(isinstance(summary.get(k), pd.DataFrame) and not summary[k].empty for k, _ in PARTS):
        parts.append(section("torch.compile", notice(
            "No torch.compile activity in this trace: the program ran in eager mode.")))
        return html.Div(parts)
    parts.append(html.Div([
        metric("graphs", _count(summary.get("graphs"))),
        metric("graph breaks", _count(summary.get("graph_breaks"))),
        metric("recompiles", _count(summary.get("recompiles"))),
        metric("compile time", fmt.duration(compile_time_ns(trace, summary))),
    ], className="metrics"))
    for key, title in PARTS:
        df = summary.get(key)
        if isinstance(df, pd.DataFrame) and not df.empty:
            parts.append(section(title, data_table(df, f"compile-{key}", page_size=10)))
        else:
            parts.append(section(title, notice(f"No {title.lower()} in this trace.")))
    return html.Div(parts)


def _count(df) -> str:
    return f"{len(df):,}" if isinstance(df, pd.DataFrame) else "–"


def compile_time_ns(trace: Any, summary: dict) -> int:
    """The explorer's compile total, or the time of the outermost compile spans."""
    totals = summary.get("totals")
    if isinstance(totals, pd.DataFrame) and "compile_ns" in totals.columns and not totals.empty:
        return int(totals["compile_ns"].iloc[0])
    slices = getattr(trace, "base_slices", None)
    slices = slices if isinstance(slices, pd.DataFrame) else table(trace, "slices")
    if slices.empty:
        return 0
    spans = slices[slices["category"] == "compile"]
    if spans.empty:
        return 0
    outer = spans[~spans["parent_id"].isin(spans["id"])]
    return int(outer["dur"].sum())


def register(app, ctx) -> None:
    """No callbacks: the page is static for a trace."""
