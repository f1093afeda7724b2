"""The Generation page on a recording of examples/generate.py: each token's time as a bar
(the prefill's first, then one per decode step), the KV cache growing a token a step, the
figures that bound each part, and the table per generation; a trace without generation
says what would show there."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import neuron_explorer
import plotly.io.json as pio_json
import pytest
from cli_runner import run_cli

EXAMPLES = Path(__file__).parents[2] / "examples"


@pytest.fixture(scope="module")
def generation_trace(tmp_path_factory: pytest.TempPathFactory) -> neuron_explorer.Trace:
    out = tmp_path_factory.mktemp("generation") / "generate.pftrace"
    run_cli("record", "--level", "op", "-o", str(out), "--", sys.executable,
            str(EXAMPLES / "generate.py"), "--new-tokens", "8", cwd=out.parent, modelled=True)
    return neuron_explorer.load(out, cache=False)


def _figure(component, graph_id: str) -> dict:
    """The figure of the graph with this id, as the browser receives it."""
    def walk(node):
        if isinstance(node, dict):
            if node.get("props", {}).get("id") == graph_id:
                return node["props"]["figure"]
            for value in node.values():
                found = walk(value)
                if found is not None:
                    return found
        if isinstance(node, list):
            for value in node:
                found = walk(value)
                if found is not None:
                    return found
        return None

    figure = walk(json.loads(pio_json.to_json_plotly(component)))
    assert figure is not None, graph_id
    return figure


def test_the_page_shows_each_token_the_cache_and_the_bounds(generation_trace, app_context):
    from neuron_explorer.webapp.pages import generation

    trace = generation_trace
    page = generation.layout(trace, "generate.pftrace", {}, app_context)
    text = pio_json.to_json_plotly(page)
    for label in ("time to first token", "per output token", "prefill MFU", "decode MBU",
                  "KV cache per token", "Per generation"):
        assert label in text, label
    assert "2 KiB" in text  # k and v of 2 layers of width 128 in fp32, per sequence

    tokens = trace.token_times()
    bars = {bar["name"]: bar for bar in _figure(page, "generation-tokens")["data"]}
    assert set(bars) == {"prefill", "decode"}
    assert len(bars["prefill"]["y"]) == 1 and len(bars["decode"]["y"]) == len(tokens) - 1
    serving = trace.serving().iloc[0]
    # the prefill's bar is the time to first token, the decode bars the time per token
    assert bars["prefill"]["y"][0] == pytest.approx(serving["ttft_ns"] / 1e6)
    decode_ms = sorted(bars["decode"]["y"])
    assert decode_ms[len(decode_ms) // 2] == pytest.approx(serving["tpot_median_ns"] / 1e6,
                                                           rel=0.2)

    (line,) = _figure(page, "generation-kv-cache")["data"]
    held = trace.kv_cache()
    assert len(line["y"]) == len(held)
    grown = [b - a for a, b in zip(line["y"][2:], line["y"][3:], strict=False)]
    assert all(g == pytest.approx(4 * 2048 / 2**20) for g in grown)  # a token, 4 sequences


def test_a_trace_without_generation_says_what_would_show(app_context):
    from neuron_explorer.webapp.pages import generation

    trace = app_context.store.get("run_a.pftrace")
    text = pio_json.to_json_plotly(generation.layout(trace, "run_a.pftrace", {}, app_context))
    assert "No prefill or decode steps in this trace" in text
    assert "neuron_explorer.phase('prefill')" in text


def test_the_notebook_draws_the_same_figures(generation_trace):
    trace = generation_trace
    bars = {bar.name: bar for bar in trace.plot.tokens().data}
    assert set(bars) == {"prefill", "decode"}
    assert len(bars["decode"].y) == len(trace.token_times()) - 1
    (line,) = trace.plot.kv_cache().data
    assert len(line.y) == len(trace.kv_cache())


def test_a_generation_without_a_cache_shows_none(tmp_path, app_context):
    from neuron_explorer.webapp.pages import generation

    out = tmp_path / "no_cache.pftrace"
    run_cli("record", "--level", "op", "-o", str(out), "--", sys.executable,
            str(EXAMPLES / "generate.py"), "--new-tokens", "8", "--no-cache", cwd=tmp_path,
            modelled=True)
    page = generation.layout(neuron_explorer.load(out, cache=False), "no_cache.pftrace", {},
                             app_context)
    text = pio_json.to_json_plotly(page)
    assert "each call feeds the whole sequence so far" in text
    assert "No KV cache" in text and "generation-kv-cache" not in text
    assert "KV cache per token" not in text
