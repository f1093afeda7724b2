"""Roofline: each op's arithmetic intensity against the FLOP rate it reached, under the
preset's roof."""

from __future__ import annotations

from typing import TYPE_CHECKING

import dash
from dash import html
from neuron_explorer.plot.figures import roofline_figure, roofs
from neuron_explorer.webapp.components import graph, notice, page_title, section
from neuron_explorer.webapp.page_data import fetch

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace
    from neuron_explorer.webapp.context import AppContext

PATH = "/roofline"
TITLE = "Roofline"


def layout(trace: Trace, name: str, params: dict[str, str], ctx: AppContext) -> html.Div:
    data = fetch(trace.roofline, "per-op FLOPs and bytes (needed for a roofline)")
    if data.value is None:
        return html.Div([page_title(TITLE, name), section("Roofline", notice(str(data.missing)))])
    df = data.value
    if df[(df["intensity"] > 0) & (df["achieved_flops_per_s"] > 0)].empty:
        return html.Div([page_title(TITLE, name), section("Roofline", notice(
            "No op in this trace has both FLOPs and bytes."))])
    peaks, bandwidth = roofs(trace.hardware_figures)
    note = None if peaks and bandwidth else notice(
        "The trace carries no hardware figures, so the roof is not drawn.", "info")
    return html.Div([
        page_title(TITLE, name),
        section("Ops against the roofline", note,
                graph(roofline_figure(df, trace.hardware_figures), "roofline-graph"),
                subtitle="Marker area grows with the op's total time"),
    ])


def register(app: dash.Dash, ctx: AppContext) -> None:
    """No callbacks: the chart is static for a trace."""
