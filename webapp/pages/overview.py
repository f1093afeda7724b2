"""Overview: the hardware, step time, where the time goes, utilisation, and the ranked findings."""

from __future__ import annotations

from typing import Any

import pandas as pd
from dash import Input, Output, dcc, html
from dash.exceptions import PreventUpdate
from neuron_explorer.webapp import formatting as fmt
from neuron_explorer.webapp.components import graph, metric, notice, page_title, page_url, section
from neuron_explorer.webapp.page_data import fetch
from neuron_explorer.webapp.theme import breakdown_colour

PATH = "/"
TITLE = "Overview"

def layout(trace: Any, name: str, params: dict, ctx: Any) -> html.Div:
    summary = fetch(trace, "summary", "summary")
    s = summary.value if summary.ok else {}
    return html.Div([
        page_title(TITLE, name),
        html.Div(_metrics(s), className="metrics"),
        None if summary.ok else notice(summary.missing, "warning"),
        html.Div([
            section("Where the time goes", _breakdown(trace),
                    subtitle="Mean time per step on the device and on the host"),
        ], className="row"),
        section("Findings",
                dcc.Loading(html.Div(html.P("Looking for bottlenecks…", className="hint"),
                                     id="overview-findings"), type="dot"),
                dcc.Store(id="overview-trace", data=name),
                subtitle="Bottlenecks ranked by the time they cost; each links to its evidence"),
    ])


def _metrics(s: dict) -> list:
    hardware = s.get("hardware") or "unknown"
    source = s.get("source_format")
    return [
        metric("hardware", str(hardware), str(source) if source else None),
        metric("steps", fmt.count(s.get("n_steps")) if s.get("n_steps") is not None else "–"),
        metric("step time", fmt.duration(s.get("step_time_ns")), "median per step"),
        metric("trace length", fmt.duration(s.get("total_ns"))),
        metric("MFU", fmt.share(s.get("mfu")), "model FLOPs / peak"),
        metric("MBU", fmt.share(s.get("mbu")), "HBM bytes / peak bandwidth"),
        metric("device busy", fmt.share(s.get("device_busy_share"))),
    ]


def _breakdown(trace: Any):
    data = fetch(trace, "breakdown", "time breakdown")
    if not data.ok:
        return notice(data.missing)
    df: pd.DataFrame = data.value
    n_steps = max(int(df["step"].nunique()), 1)
    mean = df.groupby(["side", "category"], sort=False)["ns"].sum().div(n_steps).reset_index()
    traces = []
    for category, group in mean.groupby("category", sort=False):
        traces.append({
            "type": "bar", "orientation": "h", "name": str(category),
            "y": group["side"].tolist(), "x": (group["ns"] / 1e6).tolist(),
            "marker": {"color": breakdown_colour(category)},
            "hovertemplate": f"{category}: " + "%{x:.3f} ms<extra>%{y}</extra>",
        })
    figure = {
        "data": traces,
        "layout": {
            "barmode": "stack",
            "xaxis": {"title": {"text": "ms per step"}, "gridcolor": "#eceff3"},
            "yaxis": {"categoryorder": "array", "categoryarray": ["host", "device"]},
            "legend": {"orientation": "h", "y": -0.35},
            "margin": {"l": 70, "r": 20, "t": 10, "b": 40},
        },
    }
    return graph(figure, "overview-breakdown", height=260)


def findings(trace: Any, name: str):
    """The findings as cards, worst first (filled in after the rest of the page: rules take longest)."""
    data = fetch(trace, "bottlenecks", "findings")
    if not data.ok:
        return notice(data.missing if "Could not" in data.missing else "No bottlenecks found in this trace.")
    findings = sorted(data.value, key=lambda f: -(getattr(f, "time_lost_ns", 0) or 0))
    return html.Div([_finding_card(f, i, name) for i, f in enumerate(findings)], className="findings")


def _finding_card(finding: Any, rank: int, name: str) -> html.Div:
    severity = str(getattr(finding, "severity", "info")).lower()
    evidence = list(getattr(finding, "evidence", None) or [])
    link = None
    if evidence:
        first = evidence[0]
        ts, dur = int(first.get("ts", 0)), int(first.get("dur", 0))
        pad = max(dur // 2, 1000)
        ids = first.get("slice_ids") or []
        href = page_url("/timeline", name, start=ts - pad, end=ts + dur + pad,
                        select=int(ids[0]) if len(ids) else None)
        link = dcc.Link(f"Show in timeline ({len(evidence)} place{'s' if len(evidence) != 1 else ''}) ▸",
                        href=href, className="finding-link", id={"type": "finding-link", "rank": rank})
    share = getattr(finding, "share_of_step", None)
    return html.Div([
        html.Div([
            html.Span(severity, className=f"badge badge-{severity}"),
            html.H3(str(getattr(finding, "title", "finding"))),
            html.Div([
                html.Span(fmt.duration(getattr(finding, "time_lost_ns", None)), className="lost"),
                html.Span(f" lost · {fmt.share(share)} of step" if share is not None else " lost"),
            ], className="finding-cost"),
        ], className="finding-head"),
        html.P(str(getattr(finding, "explanation", "")), className="finding-explanation"),
        html.P([html.Strong("Recommendation: "), str(getattr(finding, "recommendation", ""))],
               className="finding-recommendation"),
        html.Div([
            html.Span(f"rule {getattr(finding, 'rule_id', '?')}", className="rule-id"),
            link,
        ], className="finding-foot"),
    ], className=f"finding finding-{severity}")


def register(app, ctx) -> None:
    @app.callback(Output("overview-findings", "children"), Input("overview-trace", "data"))
    def show_findings(name):
        if not name:
            raise PreventUpdate
        return findings(ctx.store.get(name), name)
