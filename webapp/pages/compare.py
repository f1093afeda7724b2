"""Compare: two traces side by side (summary figures, breakdowns) and the explorer's diff."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import dash
import pandas as pd
from dash import Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate
from neuron_explorer.common.errors import NeuronExplorerError
from neuron_explorer.plot.figures import breakdown_figure
from neuron_explorer.webapp import formatting as fmt
from neuron_explorer.webapp import whatif_control
from neuron_explorer.webapp.components import data_table, graph, notice, page_title, section
from neuron_explorer.webapp.page_data import fetch

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace
    from neuron_explorer.webapp.context import AppContext

log = logging.getLogger("neuron_explorer.webapp")
PATH = "/compare"
TITLE = "Compare"
SUMMARY_ROWS = [
    ("step time", "step_time_ns", fmt.duration), ("steps", "n_steps", fmt.count),
    ("time analysed", "total_ns", fmt.duration), ("MFU", "mfu", fmt.share),
    ("HFU", "hfu", fmt.share),
    ("MBU", "mbu", fmt.share), ("device busy", "device_busy_share", fmt.share),
    ("hardware", "hardware", str), ("source", "source_format", str),
]


DIFF_TITLES = {
    "summary": "Change in the headline figures", "breakdown": "Change in time per step",
    "ops": "Ops that changed", "modules": "Modules that changed",
    "engines": "Engine utilisation change",
}


def layout(trace: Trace, name: str, params: dict[str, str], ctx: AppContext) -> html.Div:
    others = [n for n in ctx.store.list_traces() if n != name]
    other = params.get("other") if params.get("other") in others else None
    return html.Div([
        page_title(TITLE, name),
        dcc.Store(id="compare-base", data=name),
        html.Div([
            html.Span("Compare ", className="label"), html.Strong(name, className="trace-a"),
            html.Span(" with ", className="label"),
            dcc.Dropdown(id="compare-other", options=[{"label": n, "value": n} for n in others],
                         value=other, placeholder="pick a second trace…", clearable=False,
                         className="compare-picker"),
        ], className="toolbar"),
        html.Div(comparison(ctx, name, other) if other else notice(
            "Pick a second trace to compare with." if others else
            "There is no other trace in the served folder: upload one or serve a folder of "
            "traces."),
            id="compare-body"),
        whatif_control.layout(name),
    ])


def comparison(ctx: AppContext, name_a: str, name_b: str) -> list:
    """The side-by-side summary, both breakdowns and the diff tables."""
    try:
        a, b = ctx.store.get(name_a), ctx.store.get(name_b)
    except NeuronExplorerError as exc:
        return [notice(ctx.store.public_message(f"Cannot open {name_b}: {exc}"), "error")]
    except Exception as exc:  # an unexpected loader failure: report it, keep the page up
        log.exception("opening %s failed", name_b)
        return [notice(ctx.store.public_message(
            f"Cannot open {name_b}: unexpected {type(exc).__name__}: {exc}"), "error")]
    sa, sb = fetch(a.summary, "summary").value or {}, fetch(b.summary, "summary").value or {}
    header = html.Tr([html.Th(""), html.Th(name_a), html.Th(name_b)])
    rows = [html.Tr([html.Th(label), html.Td(_show(sa.get(key), f)),
                     html.Td(_show(sb.get(key), f))])
            for label, key, f in SUMMARY_ROWS]
    parts = [section("Summary", html.Table([html.Thead(header), html.Tbody(rows)],
                                           className="compare-table"))]
    stepless = [n for n, summary in ((name_a, sa), (name_b, sb))
                if not summary.get("steps_analysed")]
    labels = [_bar_label(n, stepless) for n in (name_a, name_b)]
    parts.append(section("Time per step", breakdown_comparison(a, b, *labels),
                         subtitle=_stepless_note(stepless)))
    try:
        result = ctx.differ(a, b)
    except NeuronExplorerError as exc:
        parts.append(section("Differences", notice(ctx.store.public_message(str(exc)), "warning")))
        return parts
    except Exception as exc:  # the rest of the page stays useful
        log.exception("comparing %s with %s failed", name_a, name_b)
        parts.append(section("Differences", notice(ctx.store.public_message(
            f"Could not compare these traces: {exc}"), "error")))
        return parts
    for attr, df in result_frames(result):
        title = DIFF_TITLES.get(attr, attr.replace("_", " ").capitalize())
        if attr == "summary":
            df = _readable_summary(df)
        parts.append(section(title, data_table(df, f"diff-{attr}", page_size=15)))
    return parts


def _readable_summary(df: pd.DataFrame) -> pd.DataFrame:
    """The headline diff with each figure in its unit ('28.69 ms', '0.07%', '802'), not raw
    ns and fractions, labelled as the Summary table above it; the ratio stays a number."""
    if not {"metric", "a", "b", "delta"} <= set(df.columns):
        return df
    known = {key: (label, f) for label, key, f in SUMMARY_ROWS}

    def label_and_format(metric: str) -> tuple[str, Any]:
        if metric in known:
            return known[metric]
        name = metric.removesuffix("_ns").removeprefix("n_").replace("_", " ")
        if metric.endswith("_ns"):
            return name, fmt.duration
        return name, fmt.count if metric.startswith("n_") else str

    shown = [label_and_format(str(m)) for m in df["metric"]]
    readable = df.copy()
    for column in ("a", "b", "delta"):
        readable[column] = [f(v) for (_, f), v in zip(shown, df[column], strict=True)]
    readable["metric"] = [label for label, _ in shown]
    return readable


def _bar_label(name: str, stepless: list[str]) -> str:
    """A trace without steps is drawn whole: its bars must not pass for a step."""
    return f"{name} (whole trace)" if name in stepless else name


def _stepless_note(stepless: list[str]) -> str | None:
    if not stepless:
        return None
    if len(stepless) == 1:
        return f"{stepless[0]} has no step marks: its bars are the whole trace, not a step"
    return "Neither trace has step marks: the bars are each whole trace"


def _show(value, f) -> str:
    return "–" if value is None else f(value)


def result_frames(result: Any) -> list[tuple[str, pd.DataFrame]]:
    """The diff's public DataFrame attributes, the known ones first."""
    out = []
    rank = {attr: i for i, attr in enumerate(DIFF_TITLES)}
    for attr in sorted(dir(result), key=lambda a: (rank.get(a, len(rank)), a)):
        if attr.startswith("_"):
            continue
        value = getattr(result, attr, None)
        if isinstance(value, pd.DataFrame) and not value.empty:
            out.append((attr, value))
    return out


def breakdown_comparison(a: Trace, b: Trace, name_a: str, name_b: str) -> html.Div | dcc.Graph:
    frames = {label: data.value for label, data in ((name_a, fetch(a.breakdown, "time breakdown")),
                                                    (name_b, fetch(b.breakdown, "time breakdown")))
              if data.value is not None}
    if not frames:
        return notice("Neither trace has a time breakdown.")
    return graph(breakdown_figure(frames), "compare-breakdown")


def register(app: dash.Dash, ctx: AppContext) -> None:
    whatif_control.register(app, ctx)
    @app.callback(
        Output("compare-body", "children"),
        Input("compare-other", "value"),
        State("compare-base", "data"),
        prevent_initial_call=True,
    )
    def compare(other, base):
        if not other or not base:
            raise PreventUpdate
        return comparison(ctx, base, other)
