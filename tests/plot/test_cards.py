"""Findings, the findings list, a diff and a run render as HTML in Jupyter, with the
dashboard's severity colours."""

from __future__ import annotations

import re
from html import escape
from pathlib import Path

import pytest
from neuron_explorer.plot.theme import SEVERITY_COLOURS
from neuron_explorer.rules.finding import Finding, Findings

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "sample_traces"


def finding(severity: str = "high", title: str = "Host waits <on> the device") -> Finding:
    return Finding("sync_in_step", title, severity, 2_500_000, 0.25,
                   [{"ts": 10, "dur": 1_000, "slice_ids": [3], "description": "loss.item()"}] * 5,
                   "The host waits at each .item().", "Log the loss every N steps.")


def test_a_finding_is_a_card_in_its_severity_colour():
    html = finding()._repr_html_()
    ink, background = SEVERITY_COLOURS["high"]
    assert ink in html and background in html
    assert "Host waits &lt;on&gt; the device" in html  # text is escaped
    assert "2.5 ms lost · 25.0% of the analysed steps" in html
    assert "Log the loss every N steps." in html
    assert html.count("loss.item()") == 3 and "and 2 more" in html
    assert SEVERITY_COLOURS["medium"][0] in finding("medium")._repr_html_()


def test_the_findings_of_a_trace_render_as_cards_worst_first():
    import neuron_explorer

    findings = neuron_explorer.load(SAMPLES / "item_in_loop.pftrace").bottlenecks()
    assert isinstance(findings, Findings) and findings
    html = findings._repr_html_()
    assert f"({len(findings)}, worst first)" in html
    positions = [html.index(escape(f.title)) for f in findings[:3]]
    assert positions == sorted(positions)
    assert "no bottleneck found" in Findings()._repr_html_()


def test_a_diff_renders_its_sections_as_tables():
    import neuron_explorer

    html = neuron_explorer.diff(SAMPLES / "gpt_eager.pftrace",
                                SAMPLES / "gpt_compiled.pftrace")._repr_html_()
    assert "gpt_eager.pftrace" in html and "gpt_compiled.pftrace" in html
    assert "Summary (per step)" in html and "step time" in html
    assert html.count("<table") >= 3


@pytest.mark.slow  # 10-14 s in a CI run
def test_a_run_renders_its_ranks():
    import neuron_explorer

    run = neuron_explorer.load(SAMPLES / "ddp.run")
    html = run._repr_html_()
    assert f"{len(run)} ranks" in html
    assert all(f"rank{r}.pftrace" in html for r in run.ranks)
    assert "step time" in html and "communication" in html


@pytest.mark.parametrize("severity", ["high", "medium", "low"])
def test_the_dashboard_style_sheet_uses_the_same_severity_colours(severity):
    css = (REPO / "webapp" / "assets" / "style.css").read_text()
    ink, background = SEVERITY_COLOURS[severity]
    variables = dict(re.findall(r"--(\w+):\s*(#[0-9a-f]{6})", css))
    badge = re.search(rf"\.badge-{severity}[^{{]*\{{([^}}]*)\}}", css).group(1)
    colour = re.search(r"color:\s*var\(--(\w+)\)", badge).group(1)
    assert variables[colour] == ink and f"background: {background}" in badge
