"""examples/analysis.ipynb and examples/compare.ipynb run top to bottom on a headless kernel,
so they cannot rot, and show the explorer's figures and cards (not hand-made plots)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
PLOTLY = "application/vnd.plotly.v1+json"
WIDGET = "application/vnd.jupyter.widget-view+json"


def executed(name: str) -> list[dict]:
    """The outputs of every code cell, in order, after running the notebook."""
    nb = nbformat.read(EXAMPLES / name, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(EXAMPLES)}}).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    errors = [f"{o.ename}: {o.evalue}" for o in outputs if o.output_type == "error"]
    assert not errors, errors
    return outputs


def html_of(outputs: list[dict]) -> str:
    return "".join(o.get("data", {}).get("text/html", "") for o in outputs)


@pytest.mark.slow
def test_analysis_notebook_draws_the_dashboards_figures() -> None:
    outputs = executed("analysis.ipynb")
    figures = [o["data"][PLOTLY] for o in outputs if PLOTLY in o.get("data", {})]
    assert len(figures) >= 9  # breakdown, op stats, roofline, engines, memory, HTA's views
    titles = {str(f["layout"].get("yaxis", {}).get("title", {}).get("text")) for f in figures}
    assert {"kernels queued", "share of the series' peak (%)"} <= titles  # queues, counters
    assert any(t.get("type") == "scatter" and "roof" in str(t.get("name"))
               for f in figures for t in f["data"])
    # the timeline: a FigureWidget where ipywidgets is installed, else a sixth static figure
    assert any(WIDGET in o.get("data", {}) for o in outputs) or len(figures) >= 6
    cards = html_of(outputs)
    assert "worst first" in cards and "Recommendation:" in cards  # the findings as cards
    assert not any("image/png" in o.get("data", {}) for o in outputs)  # no hand-made matplotlib


@pytest.mark.slow
def test_compare_notebook_shows_eager_against_compiled_and_two_ranks() -> None:
    outputs = executed("compare.ipynb")
    figures = [o["data"][PLOTLY] for o in outputs if PLOTLY in o.get("data", {})]
    bars = {y for t in figures[0]["data"] for y in t["y"]}
    assert {"eager · device", "compiled · device"} <= bars
    assert any(t["type"] == "heatmap" for f in figures for t in f["data"])  # step time per rank
    html = html_of(outputs)
    assert "Summary (per step)" in html and "straggler.run" in html and "3 ranks" in html
