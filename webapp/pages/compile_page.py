"""Compile: torch.compile graphs, graph breaks, recompiles and the time spent compiling."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import dash
import pandas as pd
from dash import html
from neuron_explorer.plot.timeline import slice_table
from neuron_explorer.webapp import formatting as fmt
from neuron_explorer.webapp.components import data_table, metric, notice, page_title, section
from neuron_explorer.webapp.page_data import fetch

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace
    from neuron_explorer.webapp.context import AppContext

PATH = "/compile"
TITLE = "Compile"
PARTS = [("graphs", "Compiled graphs"), ("graph_breaks", "Graph breaks"),
         ("recompiles", "Recompiles")]


def layout(trace: Trace, name: str, params: dict[str, str], ctx: AppContext) -> html.Div:
    data = fetch(trace.compile_summary, "torch.compile activity (the program ran in eager mode)")
    parts: list = [page_title(TITLE, name)]
    if data.value is None:
        parts.append(section("torch.compile", notice(str(data.missing))))
        return html.Div(parts)
    summary: dict = data.value
    if not any(isinstance(summary.get(k), pd.DataFrame) and not summary[k].empty for k, _ in PARTS):
        parts.append(section("torch.compile", notice(
            "No torch.compile activity in this trace: the program ran in eager mode.")))
        return html.Div(parts)
    graphs: Any = summary.get("graphs")
    real = graphs[graphs["graph_id"] >= 0] if _has(graphs, "graph_id") else graphs
    loose = graphs[graphs["graph_id"] < 0] if _has(graphs, "graph_id") else None
    parts.append(html.Div([
        metric("graphs", _count(real)),
        metric("graph breaks", _count(summary.get("graph_breaks"))),
        metric("recompiles", _count(summary.get("recompiles"))),
        metric("compile time", fmt.duration(compile_time_ns(trace, summary))),
    ], className="metrics"))
    origin = trace_start_ns(trace)
    shown = {"graphs": real, "graph_breaks": summary.get("graph_breaks"),
             "recompiles": summary.get("recompiles")}
    for key, title in PARTS:
        df = shown.get(key)
        if isinstance(df, pd.DataFrame) and not df.empty:
            table = data_table(readable(df, origin), f"compile-{key}", page_size=10)
            parts.append(section(title, table))
        else:
            parts.append(section(title, notice(f"No {title.lower()} in this trace.")))
    parts.append(section("What the graphs run", sections_table(trace)))
    if isinstance(loose, pd.DataFrame) and not loose.empty:
        ns = int(loose["dur"].sum())
        parts.append(notice(f"{fmt.duration(ns)} of compile work belongs to no graph (tracing "
                            "and set-up before a graph exists); it counts in the compile time, "
                            "not as a graph."))
    return html.Div(parts)


def sections_table(trace: Trace) -> Any:
    """Each graph's sections as the user wrote them (`LayerNorm`, `F.layer_norm`) beside the
    aten ops they became; a notice when the trace has no program instructions."""
    from neuron_explorer.analyses.compiled_sections import compiled_sections

    data = fetch(lambda: compiled_sections(trace), "compiled graphs' instructions")
    df = data.value
    if not isinstance(df, pd.DataFrame) or df.empty:
        return notice("The compiled graphs' instructions are not in this trace "
                      "(record with --level engine to see what each graph runs).")
    shown = pd.DataFrame({
        "graph": df["graph"],
        "as written": df["written"].replace("", "–"),
        "aten ops": df["ops"].str.replace("+", " + ", regex=False),
        "section": df["section"],
        "module": df["module"],
        "source": df["source"],
        "runs": df["runs"],
        "engine time per run (ms)": (df["engine_ns"] / 1e6).round(4),
    })
    return data_table(shown, "compile-sections", page_size=15)


def _has(df, column: str) -> bool:
    return isinstance(df, pd.DataFrame) and column in df.columns


def trace_start_ns(trace: Trace) -> int:
    slices = slice_table(trace)
    return int(slices["ts"].min()) if not slices.empty else 0


def readable(df: pd.DataFrame, origin: int) -> pd.DataFrame:
    """ns columns as a person reads them: start in s since the trace's start, durations in ms."""
    out = df.drop(columns=[c for c in ("id",) if c in df.columns])
    if "ts" in out.columns:
        out = out.assign(ts=(out["ts"] - origin) / 1e9).rename(columns={"ts": "at (s)"})
    if "dur" in out.columns:
        out = out.assign(dur=out["dur"] / 1e6).rename(columns={"dur": "compile (ms)"})
    return out


def _count(df) -> str:
    return f"{len(df):,}" if isinstance(df, pd.DataFrame) else "–"


def compile_time_ns(trace: Trace, summary: dict) -> int:
    """The explorer's compile total, or the time of the outermost compile spans."""
    totals = summary.get("totals")
    if isinstance(totals, pd.DataFrame) and "compile_ns" in totals.columns and not totals.empty:
        return int(totals["compile_ns"].iloc[0])
    slices = slice_table(trace)
    if slices.empty:
        return 0
    spans = slices[slices["category"] == "compile"]
    if spans.empty:
        return 0
    outer = spans[~spans["parent_id"].isin(spans["id"])]
    return int(outer["dur"].sum())


def register(app: dash.Dash, ctx: AppContext) -> None:
    """No callbacks: the page is static for a trace."""
