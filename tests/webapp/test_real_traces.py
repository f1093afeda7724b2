"""Traces from other devices (PyTorch-profiler JSON) open with what they have, on every page."""

from __future__ import annotations

import json

import plotly.io.json as pio_json
import pytest
from neuron_explorer.webapp.app import PAGES, AppContext
from neuron_explorer.webapp.pages import overview, roofline, timeline
from neuron_explorer.webapp.trace_store import TraceStore

KINETO = [
    "critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz",  # A100, flows
    "cpu_only__rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",  # no device at all
    "amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz",  # ROCm
]


def _text(component) -> str:
    """A component as the JSON the browser gets."""
    return json.dumps(json.loads(pio_json.to_json_plotly(component)))


@pytest.fixture(scope="module")
def context(real_traces_dir):
    store = TraceStore(real_traces_dir)
    yield AppContext(store)
    store.close()


@pytest.mark.slow  # the first: ~10 s, the Ranks page loads the folder's 8 traces as a run
@pytest.mark.parametrize("name", KINETO)
def test_every_page_renders_a_pytorch_profiler_trace(context, name):
    trace = context.store.get(name)
    for page in PAGES:
        text = _text(page.layout(trace, name, {}, context))
        assert page.TITLE in text
        assert "Could not compute" not in text, (page.TITLE, text[:2000])
    found = _text(overview.findings(trace, name))
    assert "Could not compute" not in found
    page = _text(roofline.layout(trace, name, {}, context))
    assert "no hardware figures" in page or "notice" in page  # a GPU trace has no Trainium roof


def test_clicked_kineto_op_shows_its_args_and_flows(context):
    name = KINETO[0]
    trace = context.store.get(name)
    index = timeline.timeline_index(context.store, name)
    flows = trace.flows
    op_id = int(flows["src_id"].iloc[0])
    text = _text(timeline.slice_details(trace, index, op_id))
    assert "Linked slices" in text and "leads to" in text
    kernel_id = int(flows["dst_id"].iloc[0])
    back = _text(timeline.slice_details(trace, index, kernel_id))
    assert "comes from" in back


def test_compare_two_pytorch_profiler_traces_with_the_explorers_diff(context):
    from neuron_explorer.webapp.pages import compare

    text = _text(compare.comparison(context, KINETO[0], KINETO[2]))
    assert "Change in time per step" in text and "Ops that changed" in text
    assert "Could not compare" not in text
