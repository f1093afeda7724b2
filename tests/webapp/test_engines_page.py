"""The Engines page reads per step, over the recorded steps (#12 item 6: averaged over the
whole trace, startup included, every bar read about 0%)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "mlp_eager.pftrace"


def _busy_share(ins, engine: str, lo: int, hi: int) -> float:
    """Share of [lo, hi) covered by the engine's instructions (intervals merged)."""
    part = ins[ins["engine"].astype(str).str.startswith(engine)]
    a = np.clip(part["ts"].to_numpy(), lo, hi)
    b = np.clip((part["ts"] + part["dur"]).to_numpy(), lo, hi)
    order = np.argsort(a)
    covered, end = 0, lo
    for x, y in zip(a[order], b[order], strict=True):
        if y > end:
            covered += y - max(x, end)
            end = y
    return covered / (hi - lo)


@pytest.fixture(scope="module")
def page():
    import neuron_explorer
    import plotly.io.json as pio_json
    from neuron_explorer.webapp.pages import engines

    trace = neuron_explorer.load(SAMPLE)
    return trace, json.loads(pio_json.to_json_plotly(engines.layout(trace, SAMPLE.name, {}, None)))


def _figure(tree, graph_id: str):
    if isinstance(tree, dict):
        if tree.get("props", {}).get("id") == graph_id:
            return tree["props"]["figure"]
        for value in tree.values():
            found = _figure(value, graph_id)
            if found:
                return found
    if isinstance(tree, list):
        for value in tree:
            found = _figure(value, graph_id)
            if found:
                return found
    return None


def test_each_step_shows_the_share_of_the_step_each_engine_ran(page):
    trace, tree = page
    figure = _figure(tree, "engines-per-step")
    assert figure is not None, "no per-step chart"
    bars = {bar["name"]: dict(zip(bar["x"], bar["y"], strict=True)) for bar in figure["data"]}
    ins = trace.instructions
    for _, step in trace.steps.iterrows():
        lo, hi = int(step["ts"]), int(step["ts"] + step["dur"])
        for engine in ("tensor", "vector"):
            expected = 100 * _busy_share(ins, engine, lo, hi)
            shown = bars[engine][f"step {int(step['step'])}"]
            assert shown == pytest.approx(expected, abs=1.5), engine
    # not the ~0.02% of a whole-trace average (startup and exit included)
    assert max(max(v.values()) for v in bars.values()) > 2


def test_utilisation_over_time_covers_the_steps_not_the_whole_run(page):
    trace, tree = page
    figure = _figure(tree, "engines-timeline")
    xs = [x for line in figure["data"] for x in line["x"]]
    steps = trace.steps
    span_us = (int((steps["ts"] + steps["dur"]).max()) - int(steps["ts"].min())) / 1e3
    assert max(xs) - min(xs) <= span_us * 1.01
