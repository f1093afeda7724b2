"""Engines: how busy each engine and DMA queue is over the recorded steps, and in each step."""

from __future__ import annotations

from typing import TYPE_CHECKING

import dash
from dash import html
from neuron_explorer.plot.engines import EngineUse, engine_use, per_step_figure, utilisation_figure
from neuron_explorer.webapp.components import graph, notice, page_title, section
from neuron_explorer.webapp.page_data import fetch

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace
    from neuron_explorer.webapp.context import AppContext

PATH = "/engines"
TITLE = "Engines"


def layout(trace: Trace, name: str, params: dict[str, str], ctx: AppContext) -> html.Div:
    data = fetch(lambda: engine_use(trace), "engine utilisation (it needs device engine events)")
    if data.value is None:
        return html.Div([page_title(TITLE, name),
                         section("Utilisation over time", notice(str(data.missing)))])
    use: EngineUse = data.value
    return html.Div([
        page_title(TITLE, name),
        section("Utilisation over time", graph(utilisation_figure(use), "engines-timeline"),
                subtitle="Share of each time bin an engine was executing, over the recorded steps"
                if use.over_steps else "Share of each time bin an engine was executing"),
        section("Utilisation per step", graph(per_step_figure(use), "engines-per-step"),
                subtitle="Share of each step an engine was executing") if use.over_steps
        else section("Mean utilisation", graph(per_step_figure(use), "engines-mean")),
    ])


def register(app: dash.Dash, ctx: AppContext) -> None:
    """No callbacks: the charts are static for a trace."""
