"""What each timeline action does to the window and the selection."""

from __future__ import annotations

import pytest
from dash.exceptions import PreventUpdate
from neuron_explorer.plot.timeline import build_index
from neuron_explorer.webapp.pages.timeline import new_window
from synthetic_trace import load_synthetic


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    return build_index(load_synthetic(tmp_path_factory.mktemp("trace"), n_steps=2, ops_per_step=40))


def state(index, **kw):
    return {"trace": "t", "t0": index.start_ns, "t1": index.end_ns, "selected": None, **kw}


def test_zoom_buttons_halve_and_double_the_window_around_its_centre(index):
    s = state(index, t0=1_000, t1=9_000)
    assert new_window(s, index, "timeline-zoom-in", None, None) == (3_000, 7_000, None)
    assert new_window(s, index, "timeline-zoom-out", None, None) == (-3_000, 13_000, None)
    assert new_window(s, index, "timeline-reset", None, None)[:2] == (index.start_ns, index.end_ns)


def test_pan_and_zoom_from_the_graph_read_the_axis_in_microseconds(index):
    origin = index.start_ns
    got = new_window(state(index), index, "timeline-graph.relayoutData",
                     {"xaxis.range[0]": 10.5, "xaxis.range[1]": 20}, None)
    assert got == (origin + 10_500, origin + 20_000, None)
    got = new_window(state(index), index, "timeline-graph.relayoutData",
                     {"xaxis.range": [1, 2]}, None)
    assert got[:2] == (origin + 1_000, origin + 2_000)
    with pytest.raises(PreventUpdate):  # plotly's own resize events change nothing
        new_window(state(index), index, "timeline-graph.relayoutData", {"autosize": True}, None)


def test_clicking_a_slice_selects_it_and_a_merged_bar_zooms_into_it(index):
    picked = new_window(state(index), index, "timeline-graph.clickData", None,
                        {"points": [{"customdata": 7, "base": 1.0, "x": 2.0}]})
    assert picked[2] == 7
    origin = index.start_ns
    # x is the bar's end
    zoomed = new_window(state(index), index, "timeline-graph.clickData", None,
                        {"points": [{"customdata": -1, "base": 100.0, "x": 300.0}]})
    assert zoomed[0] < origin + 100_000 < origin + 300_000 < zoomed[1]
    assert zoomed[1] - zoomed[0] == pytest.approx(240_000, rel=0.01)


def test_following_a_link_brings_the_target_into_view(index):
    far = int(index.slice_rows[-1].ids[-1])
    s = state(index, t0=index.start_ns, t1=index.start_ns + 1_000)
    t0, t1, selected = new_window(s, index, {"type": "timeline-link", "slice": far}, None, None)
    r = index.slice_rows[-1]
    assert selected == far and t0 <= int(r.ts[-1]) and int(r.end[-1]) <= t1


def test_a_kernels_details_read_in_units():
    """SBUF/PSUM bytes and the per-engine busy time of a kernel read as sizes and durations,
    not as raw integers and a JSON dict."""
    from pathlib import Path

    import neuron_explorer
    from dash import html
    from neuron_explorer.plot.timeline import build_index
    from neuron_explorer.webapp.pages.timeline import slice_details

    trace = neuron_explorer.load(Path(__file__).parents[2] / "sample_traces" / "odd_dims.pftrace")
    kernels = trace.kernels
    kernel = int(kernels.loc[kernels["psum_bytes"].idxmax(), "id"])
    table = next(p for p in slice_details(trace, build_index(trace), kernel)
                 if isinstance(p, html.Table))
    fields = {row.children[0].children: row.children[1].children
              for row in table.children.children}
    assert fields["psum_bytes"].split(" (")[0].endswith(("KiB", "MiB")), fields["psum_bytes"]
    busy = fields["engine_busy_ns"]
    assert "{" not in busy and "s" in busy, busy
