"""Overview: the hardware, step time, where the time goes, utilisation, and the ranked findings."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import dash
from dash import Input, Output, dcc, html
from dash.exceptions import PreventUpdate
from neuron_explorer.analyses.summary import mean_step_apart, summary_device_paced
from neuron_explorer.plot.figures import breakdown_figure
from neuron_explorer.rules.finding import NO_SAVING_TITLE, Finding
from neuron_explorer.webapp import formatting as fmt
from neuron_explorer.webapp.components import graph, metric, notice, page_title, page_url, section
from neuron_explorer.webapp.page_data import fetch

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace
    from neuron_explorer.webapp.context import AppContext

PATH = "/"
TITLE = "Overview"


def layout(trace: Trace, name: str, params: dict[str, str], ctx: AppContext) -> html.Div:
    summary = fetch(trace.summary, "summary")
    s = summary.value or {}
    return html.Div([
        page_title(TITLE, name),
        html.Div(_metrics(s), className="metrics"),
        None if summary.ok else notice(summary.missing or "", "warning"),
        html.Div([
            section("Where the time goes", _breakdown(trace, s),
                    subtitle=_breakdown_subtitle(s)),
        ], className="row"),
        section("Findings",
                dcc.Loading(html.Div(html.P("Looking for bottlenecks…", className="hint"),
                                     id="overview-findings"), type="dot"),
                dcc.Store(id="overview-trace", data=name),
                subtitle="Bottlenecks ranked by the time they cost; each links to its evidence"),
    ])


def _metrics(s: dict) -> list[html.Div]:
    hardware = s.get("hardware") or "unknown"
    source = s.get("source_format")
    analysed = s.get("steps_analysed")
    n_steps = s.get("n_steps")
    return [
        metric("hardware", str(hardware), str(source) if source else None),
        metric("steps", fmt.count(n_steps) if n_steps is not None else "–",
               f"{len(analysed)} analysed" if analysed and len(analysed) != n_steps else None),
        metric("step time", fmt.duration(s.get("step_time_ns")),
               (f"the device's pace; the host's windows {fmt.duration(s['host_step_ns'])}"
                if summary_device_paced(s) else "median per step")
               + (f"; mean {fmt.duration(mean)}: the steps vary"
                  if (mean := mean_step_apart(s)) is not None else "")),
        # total_ns covers the analysed steps only (the trace may span seconds of setup more)
        metric("time analysed", fmt.duration(s.get("total_ns")),
               "the analysed steps" if analysed else "the whole trace"),
        metric("MFU", fmt.share(s.get("mfu")), "model FLOPs / peak"),
        metric("MBU", fmt.share(s.get("mbu")), "HBM bytes / peak bandwidth"),
        metric("device busy", fmt.share(s.get("device_busy_share"))),
    ]


def _breakdown_subtitle(s: dict) -> str:
    """Which steps the mean is over: the warm-up and compile steps are often left out."""
    if not s.get("steps_analysed"):
        return "Time on the device and on the host over the whole trace (it has no steps)"
    windows = (" (the host's step windows: the device paces the run)"
               if summary_device_paced(s) else "")
    return (f"Mean time per step on the device and on the host, over "
            f"{s.get('steps_analysed_text')}{windows}")


def _breakdown(trace: Trace, s: dict) -> html.Div | dcc.Graph:
    data = fetch(trace.breakdown, "time breakdown")
    if data.value is None:
        return notice(str(data.missing))
    axis = "ms per step" if s.get("steps_analysed") else "ms in the whole trace"
    return graph(breakdown_figure({"": data.value}, axis_title=axis), "overview-breakdown")


def findings(trace: Trace, name: str) -> html.Div:
    """The findings as cards, worst first (filled in after the rest of the page: rules take
    longest)."""
    data = fetch(trace.bottlenecks, "findings")
    if data.value is None:
        missing = str(data.missing)
        return notice(missing if "Could not" in missing else "No bottlenecks found in this trace.")
    # in the rules' order: a finding whose saving waits on another fix comes after that
    # fix's, whatever the two savings; those saving nothing now under their own heading
    cards: list[Any] = [_finding_card(f, i, name)
                        for i, f in enumerate(data.value) if f.saves_time]
    rest = [(i, f) for i, f in enumerate(data.value) if not f.saves_time]
    if rest:
        cards.append(html.H4(NO_SAVING_TITLE, className="findings-none-now"))
        cards += [_finding_card(f, i, name) for i, f in rest]
    return html.Div(cards, className="findings")


def _finding_card(finding: Finding, rank: int, name: str) -> html.Div:
    severity = finding.severity.lower()
    evidence = finding.evidence
    link = None
    if evidence:
        first = evidence[0]
        ts, dur = int(first.get("ts", 0)), int(first.get("dur", 0))
        pad = max(dur // 2, 1000)
        ids = first.get("slice_ids") or []
        href = page_url("/timeline", name, start=ts - pad, end=ts + dur + pad,
                        select=int(ids[0]) if len(ids) else None)
        places = f"{len(evidence)} place{'s' if len(evidence) != 1 else ''}"
        link = dcc.Link(f"Show in timeline ({places}) ▸", href=href, className="finding-link",
                        id={"type": "finding-link", "rank": rank})
    return html.Div([
        html.Div([
            html.Span(severity, className=f"badge badge-{severity}"),
            html.H3(finding.title),
            html.Div([
                *([html.Span(fmt.duration(finding.time_lost_ns), className="lost"),
                   html.Span(" lost · " + (f"{finding.per_step()} · " if finding.per_step()
                                            else "")
                             + f"{fmt.share(finding.share_of_step)} of {finding.share_base}")]
                  if finding.saves_time else [html.Span("no time to save now")]),
            ], className="finding-cost"),
        ], className="finding-head"),
        html.P(finding.explanation, className="finding-explanation"),
        html.P([html.Strong("Recommendation: "), finding.recommendation],
               className="finding-recommendation"),
        *([html.P(finding.saving_note(), className="finding-saving")]
          if finding.saving_note() else []),
        html.Div([
            html.Span(f"rule {finding.rule_id}", className="rule-id"),
            link,
        ], className="finding-foot"),
    ], className=f"finding finding-{severity}")


def register(app: dash.Dash, ctx: AppContext) -> None:
    @app.callback(Output("overview-findings", "children"), Input("overview-trace", "data"))
    def show_findings(name):
        if not name:
            raise PreventUpdate
        return findings(ctx.store.get(name), name)
