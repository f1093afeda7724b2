"""Memory: HBM in use over time and what holds it at the peak."""

from __future__ import annotations

from typing import TYPE_CHECKING

import dash
import pandas as pd
from dash import html
from neuron_explorer.plot.figures import memory_figure
from neuron_explorer.webapp import formatting as fmt
from neuron_explorer.webapp.components import data_table, graph, metric, notice, page_title, section
from neuron_explorer.webapp.page_data import fetch

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace
    from neuron_explorer.webapp.context import AppContext

PATH = "/memory"
TITLE = "Memory"


def layout(trace: Trace, name: str, params: dict[str, str], ctx: AppContext) -> html.Div:
    timeline = fetch(trace.memory_timeline, "memory timeline (it needs HBM counters)")
    parts: list = [page_title(TITLE, name)]
    origin = None
    if timeline.value is None:
        parts.append(section("HBM in use", notice(str(timeline.missing))))
    else:
        df = timeline.value
        origin = int(df["ts"].min())
        peak = df.loc[df["in_use_bytes"].idxmax()]
        parts.append(html.Div([
            metric("peak HBM in use", fmt.size(peak["in_use_bytes"])),
            metric("reached at", fmt.duration(int(peak["ts"]) - origin), "after the first sample"),
        ], className="metrics"))
        parts.append(section("HBM in use", graph(memory_figure(df), "memory-timeline")))
    holders = fetch(trace.memory_at_peak, "record of what holds memory at the peak")
    body = data_table(_readable_holders(holders.value, origin), "memory-holders", page_size=15) \
        if holders.value is not None else notice(str(holders.missing))
    parts.append(section("What holds the peak", body))
    return html.Div(parts)


def _readable_holders(holders: pd.DataFrame, origin: int | None) -> pd.DataFrame:
    """The peak's time as on the chart above (after its first sample), not as a raw clock value."""
    if origin is None or "peak_ts" not in holders:
        return holders
    at = [fmt.duration(int(ts) - origin) for ts in holders["peak_ts"]]
    return holders.drop(columns="peak_ts").assign(peak_at=at)[
        ["peak_at" if c == "peak_ts" else c for c in holders.columns]]


def register(app: dash.Dash, ctx: AppContext) -> None:
    """No callbacks: the page is static for a trace."""
