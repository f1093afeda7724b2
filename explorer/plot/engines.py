"""Engine figures: how busy each engine and DMA queue is over the recorded steps, and per step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd
from neuron_explorer.analyses.steady_state import completed_steps
from neuron_explorer.plot.figures import empty_figure, new_figure
from neuron_explorer.plot.theme import GRID_COLOUR, breakdown_colour
from neuron_explorer.plot.timeline import time_ticks

if TYPE_CHECKING:
    import plotly.graph_objects as go
    from neuron_explorer.trace import Trace

BINS_OVER_STEPS = 1000


@dataclass
class EngineUse:
    """Engine utilisation bins over the window drawn, each labelled by engine (and device)."""

    bins: pd.DataFrame  # ts, engine, utilisation, label
    bin_ns: int | None
    over_steps: bool  # the window is the recorded steps (not the whole trace)
    steps: pd.DataFrame

    @property
    def colours(self) -> dict[str, str]:
        return {label: breakdown_colour(str(label).rsplit(" · ", 1)[-1])
                for label in sorted(self.bins["label"].unique())}


def steps_span(steps: pd.DataFrame) -> tuple[int, int] | None:
    """[first step's start, last step's end], or None for a trace without steps."""
    if steps.empty or not {"ts", "dur"} <= set(steps.columns):
        return None
    return int(steps["ts"].min()), int((steps["ts"] + steps["dur"]).max())


def engine_use(trace: Trace, step: int | None = None) -> EngineUse | None:
    """Utilisation in about BINS_OVER_STEPS bins over the recorded steps (or one step), or
    None when the trace has no engine events."""
    steps = trace.steps if step is not None else completed_steps(trace)
    if step is not None and "step" in steps:
        steps = steps[steps["step"] == step]
        if steps.empty:
            from neuron_explorer.common.errors import NeuronExplorerError

            raise NeuronExplorerError(f"no step {step} in this trace; steps are "
                                      f"{', '.join(str(s) for s in trace.steps['step'].head(20))}")
    window = steps_span(steps)
    bin_ns = max((window[1] - window[0]) // BINS_OVER_STEPS, 1) if window else None
    every = trace.engine_utilisation(bin_ns)
    if every.empty:
        return None
    df = every
    if window:  # the recorded steps, not the startup and exit around them
        df = every[(every["ts"] >= window[0]) & (every["ts"] < window[1])]
        if df.empty:
            df = every
    several = "device" in df.columns and df["device"].nunique() > 1
    label = ((df["device"].astype(str) + " · " + df["engine"].astype(str)) if several
             else df["engine"].astype(str))
    return EngineUse(df.assign(label=label), bin_ns, window is not None, steps)


def per_step_utilisation(use: EngineUse) -> pd.DataFrame:
    """step, engine label, utilisation (0..1): the mean of the bins inside each step."""
    rows: list[dict[str, Any]] = []
    bins, bin_ns = use.bins, use.bin_ns or 1
    for _, step in use.steps.iterrows():
        lo, hi = int(step["ts"]), int(step["ts"] + step["dur"])
        inside = bins[(bins["ts"] >= lo) & (bins["ts"] + bin_ns <= hi)]
        for label, group in inside.groupby("label", sort=True):
            rows.append({"step": int(step["step"]) if "step" in step else len(rows),
                         "engine": str(label), "utilisation": float(group["utilisation"].mean())})
    return pd.DataFrame(rows, columns=["step", "engine", "utilisation"])


def utilisation_figure(use: EngineUse | None) -> go.Figure:
    """Share of each time bin every engine was executing, one line per engine."""
    if use is None:
        return empty_figure("no engine utilisation (it needs device engine events)")
    df = use.bins
    origin = int(df["ts"].min())
    colours = use.colours
    lines = [{
        "type": "scatter", "mode": "lines", "name": str(label),
        "x": ((group["ts"] - origin) / 1e3).tolist(), "y": (group["utilisation"] * 100).tolist(),
        "line": {"shape": "hv", "width": 1.5, "color": colours[label]},
        "hovertemplate": f"{label}: " + "%{y:.1f}%<extra>%{x:.1f} µs</extra>",
    } for label, group in df.groupby("label", sort=True)]
    return new_figure(lines, {
        "xaxis": {"title": {"text": ("time since the first step" if use.over_steps
                                     else "time since first sample")},
                  "gridcolor": GRID_COLOUR, **time_ticks(origin, int(df["ts"].max()), origin)},
        "yaxis": {"title": {"text": "busy (%)"}, "range": [0, 105], "gridcolor": GRID_COLOUR},
        "legend": {"orientation": "h", "y": 1.12},
    }, height=380)


def per_step_figure(use: EngineUse | None) -> go.Figure:
    """Share of each step each engine ran (a bar per engine per step); for a trace without
    steps, each engine's mean over the trace."""
    if use is None:
        return empty_figure("no engine utilisation (it needs device engine events)")
    colours = use.colours
    if not use.over_steps:
        means = use.bins.groupby("label", sort=True)["utilisation"].mean() * 100
        return new_figure([{
            "type": "bar", "x": means.index.tolist(), "y": means.tolist(),
            "marker": {"color": [colours.get(e, "#9aa5b1") for e in means.index]},
            "hovertemplate": "%{x}: %{y:.1f}%<extra></extra>",
        }], {"yaxis": {"title": {"text": "mean busy (%)"}, "range": [0, 100],
                       "gridcolor": GRID_COLOUR}},
            height=300)
    per_step = per_step_utilisation(use)
    if per_step.empty:
        return empty_figure("no engine ran during the recorded steps")
    bars = [{
        "type": "bar", "name": engine, "x": [f"step {s}" for s in group["step"]],
        "y": (group["utilisation"] * 100).tolist(),
        "marker": {"color": colours.get(engine, "#9aa5b1")},
        "hovertemplate": f"{engine}: " + "%{y:.1f}%<extra>%{x}</extra>",
    } for engine, group in per_step.groupby("engine", sort=True)]
    return new_figure(bars, {
        "barmode": "group",
        "yaxis": {"title": {"text": "busy (%)"}, "range": [0, 100], "gridcolor": GRID_COLOUR},
        "legend": {"orientation": "h", "y": 1.12}}, height=320)
