"""The Compile page (#12 item 6): real graphs only, times in ms, and what each graph runs named
as the user wrote it (`LayerNorm`, `F.layer_norm`) beside the aten ops it became."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pandas as pd
import plotly.io.json as pio_json
import pytest
from cli_runner import run_command
from neuron_explorer.webapp.pages import compile_page

SCRIPT = textwrap.dedent("""
    import torch
    import torch.nn.functional as F
    from torch import nn


    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(32)
            self.proj = nn.Linear(32, 32)

        def forward(self, x):
            y = F.gelu(self.proj(self.norm(x)))
            return F.layer_norm(y, (32,)) + torch.softmax(y, dim=-1)


    model = torch.compile(Block().to("neuron"), backend="neuron")
    for _ in range(2):
        with torch.no_grad():
            model(torch.randn(8, 32, device="neuron")).sum().item()
""")


@pytest.fixture(scope="module")
def compiled_trace(tmp_path_factory) -> Path:
    """A compiled script recorded with `neuron-explorer record` (a real trace)."""
    folder = tmp_path_factory.mktemp("compiled")
    (folder / "block.py").write_text(SCRIPT)
    # as a user runs it (forked after a recording's imports: cli_runner)
    proc = run_command("record", "-o", "block.pftrace", "block.py", cwd=folder,
                       env=dict(os.environ), timeout=300)
    assert proc.returncode == 0, proc.stderr
    return folder / "block.pftrace"


def _page(trace) -> str:
    page = compile_page.layout(trace, "t.pftrace", {}, None)
    return json.dumps(json.loads(pio_json.to_json_plotly(page)))


def _rows(page: str, table_id: str) -> list[dict]:
    def find(node):
        if isinstance(node, dict):
            if node.get("props", {}).get("id") == table_id:
                return node["props"]["rowData"]
            for value in node.values():
                found = find(value)
                if found is not None:
                    return found
        elif isinstance(node, list):
            for value in node:
                found = find(value)
                if found is not None:
                    return found
        return None

    return find(json.loads(page))


@pytest.mark.slow
def test_graph_sections_are_named_as_the_user_wrote_them(compiled_trace):
    import neuron_explorer

    page = _page(neuron_explorer.load(compiled_trace))
    rows = _rows(page, "compile-sections")
    assert rows, "the page lists what the graph runs"
    written = {r["aten ops"]: r["as written"] for r in rows}
    norms = [r for r in rows if "aten::native_layer_norm" in r["aten ops"]]
    assert len(norms) == 2  # the module and the function call
    assert {r["as written"].split(", ")[0] for r in norms} == {"LayerNorm", "F.layer_norm"}, written
    assert any("Linear" in r["as written"] and "F.gelu" in r["as written"] for r in rows), written
    assert any("torch.softmax" in r["as written"] for r in rows), written
    norm = next(r for r in norms if r["as written"] == "LayerNorm")
    assert norm["module"] == "norm" and norm["source"].startswith("block.py:")
    assert all(r["runs"] == 2 and r["engine time per run (ms)"] > 0 for r in rows)


@pytest.mark.slow
def test_a_recorded_compile_counts_its_graph_and_reads_in_ms(compiled_trace):
    import neuron_explorer

    trace = neuron_explorer.load(compiled_trace)
    summary = trace.compile_summary()
    page = _page(trace)
    graphs = summary["graphs"]
    real = graphs[graphs["graph_id"] >= 0]
    assert len(real) >= 1
    assert f'"children": "{len(real)}", "className": "metric-value"' in page.replace("\n", "")
    rows = _rows(page, "compile-graphs")
    assert [round(r["compile (ms)"], 6) for r in rows] == [round(d / 1e6, 6) for d in real["dur"]]
    assert all(0 <= r["at (s)"] < 600 for r in rows)  # seconds since the trace's start
    assert '"graph_id": -1' not in page


class _StandIn:
    """A trace whose compile summary has a span outside every graph (tracing before a graph
    exists), which a small recording does not reliably make."""

    T0 = 5_000_000_000

    def __init__(self) -> None:
        t0 = self.T0
        self.graphs = pd.DataFrame({"graph_id": [-1, 0, 1],
                                    "name": ["dynamo", "graph 0", "graph 1"],
                                    "ts": [t0, t0 + 1_000_000, t0 + 900_000_000],
                                    "dur": [2_500_000, 1_250_000_000, 40_000_000],
                                    "spans": [3, 5, 2], "step": [0, 0, 2]})
        self.breaks = pd.DataFrame({"id": [7], "ts": [t0 + 2_000_000_000],
                                    "reason": ["data-dependent"], "source": ["a.py:3"],
                                    "step": [3]})
        self.slices = pd.DataFrame({"ts": [t0], "dur": [1], "category": ["compile"], "id": [1],
                                    "parent_id": [-1]})

    def compile_summary(self) -> dict:
        return {"graphs": self.graphs, "graph_breaks": self.breaks,
                "recompiles": self.breaks.iloc[:0],
                "totals": pd.DataFrame([{"compile_ns": 1_292_500_000, "graphs": 2,
                                         "graph_breaks": 1, "recompiles": 0}])}

    def table(self, name: str) -> pd.DataFrame:
        return self.slices


def test_a_span_outside_any_graph_is_not_counted_as_a_graph():
    page = _page(_StandIn())
    assert '"children": "2", "className": "metric-value"' in page.replace("\n", "")
    assert "belongs to no graph" in page
    assert '"graph_id": -1' not in page
    assert '"compile (ms)": 1250.0' in page and '"at (s)": 0.9' in page
    assert "1250000000" not in page
