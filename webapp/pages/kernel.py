"""Kernel: an NKI kernel's source with time and engine per line (its line profile), next
to its engine timeline, with the profile's figures and why the kernel takes its time."""

from __future__ import annotations

from typing import Any

import dash
import pandas as pd
from dash import Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate
from neuron_explorer.analyses.kernel_lines import line_profile, nki_kernels
from neuron_explorer.common.engine_profile import ENGINE_COLUMNS
from neuron_explorer.kernel_report import kernel_summary
from neuron_explorer.plot.kernel import kernel_figure
from neuron_explorer.webapp import formatting as fmt
from neuron_explorer.webapp.components import data_table, graph, metric, notice, page_title, section

PATH = "/kernel"
TITLE = "Kernel"


def layout(trace: Any, name: str, params: dict, ctx: Any) -> html.Div:
    parts: list = [page_title(TITLE, name)]
    try:
        kernels = nki_kernels(trace)
    except (AttributeError, KeyError):  # a trace without our kernel tables (Kineto JSON)
        kernels = []
    if not kernels:
        parts.append(section("NKI kernels", notice(
            "No NKI kernel in this trace. Call an @nki.jit kernel with neuron tensors while "
            "recording with --level engine to see its line profile here.")))
        return html.Div(parts)
    asked = params.get("kernel")
    chosen = asked if isinstance(asked, str) and asked in kernels else kernels[0]
    parts.append(html.Div([
        html.Label("Kernel", htmlFor="kernel-picker", className="control-label"),
        dcc.Dropdown(id="kernel-picker", options=[{"label": k, "value": k} for k in kernels],
                     value=chosen, clearable=False, className="kernel-picker"),
        dcc.Store(id="kernel-trace", data=name),
    ], className="controls"))
    parts.append(html.Div(kernel_body(trace, chosen), id="kernel-body"))
    return html.Div(parts)


def kernel_body(trace: Any, kernel: str) -> list:
    lines = line_profile(trace, kernel)
    if not len(lines):
        return [notice(f"{kernel} was recorded without engine instructions: record with "
                       "--level engine to get its line profile.")]
    s = kernel_summary(trace, kernel)
    shapes = (f"{s['runs']} runs at {s['shapes']}, the most-run of {s['shape_count']} "
              "input shapes" if s["shape_count"] > 1 else "")
    metrics = html.Div([
        metric("duration (mean)", fmt.duration(s["duration_ns"]), shapes),
        metric("critical engine", s["critical_engine"]),
        metric("DMA under compute", f"{s['dma_compute_overlap_pct']:.0f}%"),
        metric("SBUF high-water", f"{s['sbuf_bytes'] / 2**10:,.0f} KiB"),
        metric("PSUM high-water", f"{s['psum_bytes'] / 2**10:,.0f} KiB"),
        *([metric("SBUF spills", f"{s['spill_bytes'] / 2**20:,.1f} MiB",
                  f"stores and reloads; {fmt.duration(s['spill_ns'])} not under compute")]
          if s.get("spill_bytes") else []),
        *[metric(f"{e} busy", f"{s['busy_pct'][e]:.0f}%") for e in ENGINE_COLUMNS
          if s["busy_pct"][e] > 0],
    ], className="metrics")
    return [
        metrics,
        section("Why", html.Ul([html.Li(w) for w in s["why"]], id="kernel-why")),
        section("Line profile and engine timeline",
                graph(kernel_figure(trace, kernel, lines), "kernel-figure"),
                subtitle="Left: each source line's time per engine (DMA summed over its "
                         "queues). Right: the first run's instructions, coloured by the line "
                         "that issued them"),
        section("Source", data_table(source_table(lines), "kernel-lines", page_size=50),
                subtitle="Each line of the kernel that issued instructions, with its time, engine "
                         "and stall (compute engines idle just before it, waiting for inputs)"),
    ]


def source_table(lines: pd.DataFrame) -> pd.DataFrame:
    """The line profile as the page's table: line, code, engine, µs per engine, stall, share."""
    out = pd.DataFrame({"line": lines["line"], "code": lines["code"].str.strip(),
                        "engine": lines["engine"]})
    for e in ENGINE_COLUMNS:
        if lines[f"{e}_ns"].any():
            out[f"{e} (µs)"] = lines[f"{e}_ns"] / 1e3
    return out.assign(**{"stall (µs)": lines["stall_ns"] / 1e3, "share": lines["share"],
                         "instructions": lines["instructions"]})


def register(app: dash.Dash, ctx: Any) -> None:
    @app.callback(
        Output("kernel-body", "children"),
        Input("kernel-picker", "value"),
        State("kernel-trace", "data"),
        prevent_initial_call=True,
    )
    def pick_kernel(kernel, name):
        if not name or not kernel:
            raise PreventUpdate
        trace = ctx.store.get(name)
        if kernel not in nki_kernels(trace):
            raise PreventUpdate
        return kernel_body(trace, kernel)
