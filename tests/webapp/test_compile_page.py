"""The Compile page counts real graphs only and reads in ms (#12 item 6)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pandas as pd
import plotly.io.json as pio_json
from neuron_explorer.webapp.pages import compile_page

T0 = 5_000_000_000


def _trace():
    graphs = pd.DataFrame({"graph_id": [-1, 0, 1], "name": ["dynamo", "graph 0", "graph 1"],
                           "ts": [T0, T0 + 1_000_000, T0 + 900_000_000], "dur": [2_500_000, 1_250_000_000, 40_000_000],
                           "spans": [3, 5, 2], "step": [0, 0, 2]})
    breaks = pd.DataFrame({"id": [7], "ts": [T0 + 2_000_000_000], "reason": ["data-dependent"], "source": ["a.py:3"],
                           "step": [3]})
    summary = {"graphs": graphs, "graph_breaks": breaks, "recompiles": breaks.iloc[:0],
               "totals": pd.DataFrame([{"compile_ns": 1_292_500_000, "graphs": 2, "graph_breaks": 1, "recompiles": 0}])}
    slices = pd.DataFrame({"ts": [T0], "dur": [1], "category": ["compile"], "id": [1], "parent_id": [-1]})
    return SimpleNamespace(compile_summary=lambda: summary, table=lambda name: slices)


def _page() -> str:
    return json.dumps(json.loads(pio_json.to_json_plotly(compile_page.layout(_trace(), "t.pftrace", {}, None))))


def test_a_span_outside_any_graph_is_not_counted_as_a_graph():
    page = _page()
    assert '"children": "2", "className": "metric-value"' in page.replace("\n", "")
    assert "belongs to no graph" in page
    assert '"graph_id": -1' not in page


def test_times_read_in_seconds_since_start_and_durations_in_ms():
    page = _page()
    assert '"compile (ms)": 1250.0' in page and '"compile (ms)": 40.0' in page
    assert '"at (s)": 0.9' in page and '"at (s)": 2.0' in page
    assert "1250000000" not in page
