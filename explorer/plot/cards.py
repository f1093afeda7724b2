"""HTML for Jupyter's rich display (`_repr_html_`): findings as cards with the dashboard's
severity colours, a diff and a run as tables. Plain HTML with inline styles: it must read
the same in JupyterLab, VS Code and an exported notebook, with no style sheet."""

from __future__ import annotations

import html
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import pandas as pd
from neuron_explorer.plot.theme import FONT_FAMILY, MUTED_COLOUR, severity_colours
from neuron_explorer.render import fmt_ns, fmt_share

if TYPE_CHECKING:
    from neuron_explorer.rules.finding import Finding
    from neuron_explorer.runs.run import Run
    from neuron_explorer.trace_diff import TraceDiff

MAX_EVIDENCE_SHOWN = 3
MAX_DIFF_ROWS = 10
_BOX = f"font-family:{FONT_FAMILY};font-size:13px;line-height:1.45;max-width:900px"


def _e(value: Any) -> str:
    return html.escape(str(value))


def finding_card(finding: Finding) -> str:
    """One finding: severity badge, title, time lost, explanation, recommendation, evidence."""
    ink, background = severity_colours(finding.severity)
    badge = (f"<span style='background:{background};color:{ink};font-size:11px;font-weight:650;"
             f"text-transform:uppercase;letter-spacing:.5px;padding:2px 8px;border-radius:10px'>"
             f"{_e(finding.severity)}</span>")
    each = f"{finding.per_step()} · " if finding.per_step() else ""
    cost = (f"{fmt_ns(finding.time_lost_ns)} lost · {each}"
            f"{fmt_share(finding.share_of_step)} of {finding.share_base}"
            if finding.saves_time else "no time to save now")
    evidence = "".join(
        f"<li>{_e(fmt_ns(item.get('dur', 0)))} at {int(item.get('ts', 0)) / 1e9:.6f} s: "
        f"{_e(item.get('description', ''))}</li>"
        for item in finding.evidence[:MAX_EVIDENCE_SHOWN])
    more = len(finding.evidence) - MAX_EVIDENCE_SHOWN
    if more > 0:
        evidence += f"<li>and {more} more</li>"
    return (
        f"<div style='border:1px solid #d5dae0;border-left:4px solid {ink};border-radius:6px;"
        f"padding:10px 14px;margin:8px 0;background:#fff'>"
        f"<div style='display:flex;gap:10px;align-items:baseline;flex-wrap:wrap'>{badge}"
        f"<b style='flex:1;font-size:15px'>{_e(finding.title)}</b>"
        f"<span style='color:{MUTED_COLOUR}'>{_e(cost)}</span></div>"
        f"<p style='margin:8px 0 4px'>{_e(finding.explanation)}</p>"
        f"<p style='margin:4px 0'><b>Recommendation:</b> {_e(finding.recommendation)}</p>"
        + (f"<p style='margin:4px 0;color:{MUTED_COLOUR}'>{_e(finding.saving_note())}</p>"
           if finding.saving_note() else "")
        + (f"<ul style='margin:4px 0;color:{MUTED_COLOUR}'>{evidence}</ul>" if evidence else "")
        + f"<div style='color:{MUTED_COLOUR};font-size:12px'>"
          f"rule {_e(finding.rule_id)}</div></div>")


def findings_cards(findings: Iterable[Finding], title: str = "Findings") -> str:
    """The findings, in their order (worst first), under a title with their count."""
    items = list(findings)
    if not items:
        return f"<div style='{_BOX}'><b>{_e(title)}</b>: no bottleneck found.</div>"
    return (f"<div style='{_BOX}'><b>{_e(title)}</b> ({len(items)}, worst first)"
            + "".join(finding_card(f) for f in items) + "</div>")


def _table(frame: pd.DataFrame) -> str:
    return frame.to_html(index=False, border=0, escape=True, na_rep="-")


def diff_tables(diff: TraceDiff) -> str:
    """The diff's sections: the headline figures, then each table's largest changes."""
    parts = [f"<div style='{_BOX}'><b>{_e(diff.a)}</b> → <b>{_e(diff.b)}</b>"]
    for section in diff.sections(top=MAX_DIFF_ROWS):
        content = section.content
        if isinstance(content, dict):
            body = "".join(f"<tr><th style='text-align:left;padding-right:12px'>{_e(k)}</th>"
                           f"<td>{_e(v)}</td></tr>" for k, v in content.items())
            body = f"<table>{body}</table>"
        elif isinstance(content, pd.DataFrame):
            if content.empty:
                continue
            body = _table(content)
        else:
            body = "<br>".join(_e(line) for line in content)
        parts.append(f"<h4 style='margin:12px 0 4px'>{_e(section.title)}</h4>{body}")
    return "".join(parts) + "</div>"


def readable_rank_summary(run: Run) -> pd.DataFrame:
    """`run.rank_summary()` with its times as a person reads them."""
    summary = run.rank_summary()
    shown = pd.DataFrame({"rank": summary["rank"], "trace": summary["path"],
                          "steps": summary["steps"]})
    for column in ("step_time_ns", "compute_ns", "communication_ns", "exposed_ns", "wait_ns",
                   "wait_caused_ns"):
        shown[column.removesuffix("_ns").replace("_", " ")] = [fmt_ns(v) for v in summary[column]]
    return shown


def run_table(run: Run) -> str:
    """A run: its ranks with their step time, compute, communication and waits."""
    shown = readable_rank_summary(run)
    where = run.path or f"{len(run)} files"
    return (f"<div style='{_BOX}'><b>Neuron Explorer run</b> {_e(where)}: {len(run)} ranks"
            f"{_table(shown)}</div>")
