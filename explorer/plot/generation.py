"""Figures of generation (prefill and decode): when each token was ready and what it took,
and the KV cache as the allocator holds it, step by step."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
from neuron_explorer.plot.figures import empty_figure, new_figure
from neuron_explorer.plot.theme import GRID_COLOUR
from neuron_explorer.plot.timeline import time_ticks

if TYPE_CHECKING:
    import plotly.graph_objects as go

PHASE_COLOURS = {"prefill": "#f28e2b", "decode": "#4e79a7"}
NO_GENERATION = "no prefill or decode steps in this trace"


def token_figure(tokens: pd.DataFrame) -> go.Figure:
    """One bar per token at the time it was ready, as tall as the time it took: the first
    (the prefill's) is the time to first token, the others the time per output token."""
    if tokens.empty:
        return empty_figure(NO_GENERATION)
    origin = int(tokens["ready"].min() - tokens["gap_ns"].iloc[0])
    bars = [{
        "type": "bar", "name": phase, "marker": {"color": PHASE_COLOURS.get(phase, "#bab0ac")},
        "x": ((group["ready"] - origin) / 1e3).tolist(), "y": (group["gap_ns"] / 1e6).tolist(),
        "customdata": group[["generation", "token"]].to_numpy().tolist(),
        "hovertemplate": (f"{phase}: token %{{customdata[1]}} of generation "
                          "%{customdata[0]}<br>%{y:.3f} ms<extra></extra>"),
    } for phase, group in tokens.groupby("phase", sort=False)]
    return new_figure(bars, {
        "xaxis": {"title": {"text": "token ready, since the first prefill began"},
                  "gridcolor": GRID_COLOUR,
                  **time_ticks(origin, int(tokens["ready"].max()), origin)},
        "yaxis": {"title": {"text": "time it took (ms)"}, "gridcolor": GRID_COLOUR,
                  "rangemode": "tozero"},
        "bargap": 0.2, "showlegend": True,
    }, height=360)


def kv_cache_figure(held: pd.DataFrame) -> go.Figure:
    """Device memory held through each prefill and decode step over the prefill's, one
    line per generation: the KV cache growing by a token's keys and values a step."""
    if held.empty:
        return empty_figure("no memory events for the generation steps")
    origin = int(held["ts"].min())
    lines = [{
        "type": "scatter", "mode": "lines+markers", "name": f"generation {n}",
        "x": ((group["ts"] - origin) / 1e3).tolist(),
        "y": (group["held_bytes"] / 2**20).tolist(), "line": {"shape": "hv", "width": 1.5},
        "customdata": group["step"].tolist(),
        "hovertemplate": "step %{customdata}: %{y:.3f} MiB<extra></extra>",
    } for n, group in held.groupby("generation", sort=True)]
    return new_figure(lines, {
        "xaxis": {"title": {"text": "step start, since the first prefill"},
                  "gridcolor": GRID_COLOUR,
                  **time_ticks(origin, int(held["ts"].max()), origin)},
        "yaxis": {"title": {"text": "KV cache held (MiB)"}, "gridcolor": GRID_COLOUR,
                  "rangemode": "tozero"},
        "showlegend": len(lines) > 1,
    }, height=320)
