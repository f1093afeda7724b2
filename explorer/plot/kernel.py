"""The Kernel figure: an NKI kernel's line profile (time per source line, by engine) next
to its engine timeline (each instruction of one run, coloured by the line that issued it).

`trace.plot.kernel(name)` and the dashboard's Kernel page both draw through `kernel_figure`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from neuron_explorer.analyses.kernel_lines import kernel_instructions
from neuron_explorer.common.engine_profile import ENGINE_COLUMNS
from neuron_explorer.common.intervals import Union
from neuron_explorer.plot.figures import new_figure
from neuron_explorer.plot.theme import BREAKDOWN_COLOURS, GRID_COLOUR

if TYPE_CHECKING:
    import plotly.graph_objects as go
    from neuron_explorer.trace import Trace

LINE_COLOURS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
                "#ff9da7", "#9c755f"]
OTHER_COLOUR = "#bab0ac"
TIMELINE_ROWS = list(reversed(ENGINE_COLUMNS))  # tensor on top, DMA at the bottom


def line_label(file: str, line: int, code: str) -> str:
    """'53  nisa.dma_copy(dst=lhsT_tile,' (the code cut to stay readable)."""
    text = code.strip()
    text = text if len(text) <= 48 else text[:47] + "…"
    return f"{line}  {text}" if text else f"{str(file).rsplit('/', 1)[-1]}:{line}"


def kernel_figure(trace: Trace, kernel: str, lines: pd.DataFrame) -> go.Figure:
    """Left: busy time per source line (`lines`, from `line_profile`), one bar per engine.
    Right: the first run's instructions on each engine over time, coloured by line (the
    lines with most time get their own colour, the rest share one)."""
    labels = [line_label(f, n, c) for f, n, c in
              zip(lines["file"], lines["line"], lines["code"], strict=True)]
    data: list[dict[str, Any]] = []
    for e in ENGINE_COLUMNS:
        us = (lines[f"{e}_ns"] / 1e3).tolist()
        if any(us):
            data.append({"type": "bar", "orientation": "h", "name": e, "legendgroup": "engines",
                         "x": us, "y": labels, "marker": {"color": BREAKDOWN_COLOURS[e]},
                         "xaxis": "x", "yaxis": "y",
                         "hovertemplate": f"{e}: " + "%{x:.2f} µs<extra>%{y}</extra>"})
    data.extend(_timeline(trace, kernel, lines, labels))
    height = max(380, 26 * len(labels) + 200)
    return new_figure(data, {
        "barmode": "stack", "hovermode": "closest",
        "xaxis": {"domain": [0, 0.42], "title": {"text": "engine time per line (µs)"},
                  "gridcolor": GRID_COLOUR},
        "yaxis": {"autorange": "reversed", "automargin": True, "tickfont": {"family": "monospace"}},
        "xaxis2": {"domain": [0.5, 1], "anchor": "y2",
                   "title": {"text": "time since the kernel's start (µs)"},
                   "gridcolor": GRID_COLOUR},
        "yaxis2": {"anchor": "x2", "categoryorder": "array", "categoryarray": TIMELINE_ROWS},
        "legend": {"orientation": "h", "y": -0.3, "yanchor": "top"},
        "margin": {"l": 20, "r": 20, "t": 30, "b": 40},
    }, height=height)


def _timeline(trace: Trace, kernel: str, lines: pd.DataFrame,
              labels: list[str]) -> list[dict[str, Any]]:
    """One scatter trace per coloured line: each (engine, line) pair's busy intervals as
    horizontal segments (adjacent instructions merged, so large kernels stay light)."""
    ins = kernel_instructions(trace, kernel)
    if not len(ins):
        return []
    origin = int(ins["ts"].min())
    label_of = dict(zip(lines["source"], labels, strict=True))
    ranked = lines.sort_values("total_ns", ascending=False)["source"].tolist()
    own = set(ranked[:len(LINE_COLOURS)])
    group = np.where(ins["source"].isin(own), ins["source"], "")
    out = []
    for i, source in enumerate([*[s for s in ranked if s in own], ""]):
        mine = ins[group == source]
        if not len(mine):
            continue
        xs: list[float | None] = []
        ys: list[str | None] = []
        for engine, rows in mine.groupby("engine", sort=False):
            u = Union(rows["ts"].to_numpy(), (rows["ts"] + rows["dur"]).to_numpy())
            start = (u.starts - origin) / 1e3
            end = (u.ends - origin) / 1e3
            for a, b in zip(start.tolist(), end.tolist(), strict=True):
                xs.extend((a, b, None))  # None: a gap between segments
            ys.extend([engine, engine, None] * len(start))
        name = label_of.get(source, source) if source else "other lines"
        colour = LINE_COLOURS[i] if source else OTHER_COLOUR
        # ticks at the ends as well: an instruction far shorter than a pixel still shows
        out.append({"type": "scatter", "mode": "lines+markers", "name": name,
                    "legendgroup": "lines", "x": xs, "y": ys, "xaxis": "x2", "yaxis": "y2",
                    "connectgaps": False, "line": {"width": 14, "color": colour},
                    "marker": {"symbol": "line-ns-open", "size": 14,
                               "line": {"width": 1.5, "color": colour}},
                    "hovertemplate": f"{name}<br>" + "%{y} at %{x:.2f} µs<extra></extra>"})
    return out
