"""Crafted callback input gets a 4xx or an in-page message, never an HTTP 500 (#20 item 9)."""

from __future__ import annotations

import json
import math

import pytest
from dash_requests import call

STATE = {"trace": "run_a.pftrace", "t0": 0, "t1": 5_000_000, "selected": None, "fold": True}


@pytest.mark.parametrize("output, values, changed", [
    ("tables-body.children", {"tables-tab.value": "ops", "tables-trace.data": "nope.json"},
     "tables-tab.value"),
    ("tables-body.children", {"tables-tab.value": "ops", "tables-trace.data": "../../etc/passwd"},
     "tables-tab.value"),
    ("overview-findings.children", {"overview-trace.data": "nope.json"}, "overview-trace.data"),
    ("timeline-graph.figure", {"timeline-state.data": {**STATE, "trace": "nope.json"},
                               "timeline-zoom-in.n_clicks": 1}, "timeline-zoom-in.n_clicks"),
    ("timeline-graph.figure", {"timeline-state.data": "not a dict", "timeline-zoom-in.n_clicks": 1},
     "timeline-zoom-in.n_clicks"),
    ("timeline-graph.figure", {"timeline-state.data": {**STATE, "t0": "x"},
                               "timeline-zoom-in.n_clicks": 1}, "timeline-zoom-in.n_clicks"),
    ("tables-selection.children",
     {"stats-table.selectedRows": [99], "tables-kind.data": "ops",
      "tables-trace.data": "run_a.pftrace"}, "stats-table.selectedRows"),
    ("tables-selection.children",
     {"stats-table.selectedRows": {"name": "a"}, "tables-kind.data": "ops",
      "tables-trace.data": "run_a.pftrace"}, "stats-table.selectedRows"),
    ("tables-selection.children",
     {"stats-table.selectedRows": [{"name": "a"}], "tables-kind.data": "nope",
      "tables-trace.data": "run_a.pftrace"}, "stats-table.selectedRows"),
    ("stats-table.filterModel",
     {"tables-search.value": 12, "tables-name-column.data": "name", "stats-table.filterModel": {}},
     "tables-search.value"),
])
def test_a_bad_name_or_value_in_a_callback_is_a_client_error(live_server, output, values, changed):
    status, body = call(live_server, output, values, changed)
    assert 400 <= status < 500, (status, body[:300])
    assert "error" in json.loads(body)


@pytest.mark.parametrize("lo, hi", [(-1e30, 1e30), (1e30, 2e30), (math.nan, 10.0), (0.0, math.inf),
                                    ("NaN", "1")])
def test_timeline_ranges_out_of_any_scale_never_fail_the_server(live_server, lo, hi):
    values = {"timeline-relayout.data": {"xaxis.range[0]": lo, "xaxis.range[1]": hi},
              "timeline-state.data": STATE}
    status, body = call(live_server, "timeline-graph.figure", values, "timeline-relayout.data")
    assert status < 500, (status, body[:300])
    if status == 200:  # a huge range is clamped to the trace
        state = json.loads(body)["response"]["timeline-state"]["data"]
        assert abs(state["t0"]) < 1e12 and abs(state["t1"]) < 1e12


@pytest.mark.parametrize("click", [{"points": []}, {"points": [{}]}, {"nope": 1},
                                   {"points": ["x"]}])
def test_a_click_that_hit_nothing_changes_nothing(live_server, click):
    values = {"timeline-graph.clickData": click, "timeline-state.data": STATE}
    status, body = call(live_server, "timeline-graph.figure", values, "timeline-graph.clickData")
    assert status in (204, 400), (status, body[:300])


@pytest.mark.parametrize("query", ["?trace=run_a.pftrace&select=1e30",
                                   "?trace=run_a.pftrace&select=nan",
                                   "?trace=run_a.pftrace&start=-1e30&end=1e30",
                                   "?trace=run_a.pftrace&select=-9e18"])
def test_timeline_url_with_huge_values_opens_the_page(live_server, query):
    values = {"url.pathname": "/timeline", "url.search": query}
    status, body = call(live_server, "page.children", values, "url.search")
    assert status == 200, (status, body[:300])
    text = body.decode()
    assert "unexpected" not in text and "Zoom in" in text


@pytest.mark.parametrize("state, text", [
    ({**STATE, "t0": "x"}, "op"), ({**STATE, "match": "nan", "search": "op"}, "op"), (STATE, 12),
    (STATE, None),
])
def test_a_crafted_search_is_a_client_error_or_no_change(live_server, state, text):
    values = {"timeline-search.n_submit": 1, "timeline-search.value": text,
              "timeline-state.data": state}
    status, body = call(live_server, "timeline-graph.figure", values, "timeline-search.n_submit")
    assert status < 500, (status, body[:300])


@pytest.mark.parametrize("body", [
    {"output": "timeline-graph.figure", "inputs": [], "state": []},
    {"output": "nope.children", "inputs": [], "state": []},
    {"inputs": []}, [], "x",
])
def test_a_malformed_callback_request_is_a_client_error(live_server, body):
    from dash_requests import request

    status, _, data = request(live_server, "POST", "/_dash-update-component",
                              json.dumps(body).encode(), {"Content-Type": "application/json"})
    assert 400 <= status < 500, (status, data[:300])


def _raw_callback(live_server, body: bytes) -> int:
    from dash_requests import request

    return request(live_server, "POST", "/_dash-update-component", body,
                   {"Content-Type": "application/json"})[0]


def _findings_body(value) -> dict:
    return {"output": "overview-findings.children",
            "outputs": {"id": "overview-findings", "property": "children"},
            "inputs": [{"id": "overview-trace", "property": "data", "value": value}],
            "state": [], "changedPropIds": ["overview-trace.data"]}


@pytest.mark.parametrize("body", [
    b"[" * 5000 + b"]" * 5000,  # deeper than any request the dashboard makes
    json.dumps(_findings_body(1.0)).replace("1.0", "NaN").encode(),  # NaN is not JSON
    json.dumps(_findings_body({"a": 1})).encode(),  # a trace name that is an object
    json.dumps(_findings_body(7)).encode(),  # ... or a number
    json.dumps({**_findings_body("run_a.pftrace"), "inputs": ["not an item"]}).encode(),
    json.dumps({**_findings_body("run_a.pftrace"),
                "inputs": [{"id": 3, "property": "data"}]}).encode(),
    json.dumps({"output": "timeline-relayout.data", "outputs": {}, "inputs": [],
                "state": []}).encode(),
])
def test_malformed_callback_requests_are_client_errors(live_server, body):
    """Each once answered 500: a 400 with a reason now, and the server keeps serving."""
    assert _raw_callback(live_server, body) == 400
    assert _raw_callback(live_server, json.dumps(_findings_body("run_a.pftrace")).encode()) == 200


def test_every_page_store_of_a_trace_name_is_checked():
    """A new page's `<page>-trace` store must be in TRACE_NAME_STORES to be checked."""
    import re
    from pathlib import Path

    from neuron_explorer.webapp.app import TRACE_NAME_STORES

    pages = Path(__file__).resolve().parents[2] / "webapp" / "pages"
    found = {m for p in pages.glob("*.py")
             for m in re.findall(r'dcc\.Store\(id="([a-z]+-trace)"', p.read_text())}
    assert found == set(TRACE_NAME_STORES)


def test_pattern_matching_ids_are_well_formed():
    """A pattern-matching input's id is an object (it once raised TypeError in the check)."""
    from neuron_explorer.webapp.app import well_formed

    assert well_formed({"id": {"type": "finding-link", "rank": 0}, "property": "n_clicks"})
    assert well_formed([{"id": {"type": "row", "index": 1}, "property": "value", "value": 3}])
    assert not well_formed({"id": ["a"], "property": "value"})


def test_the_critical_path_toggle_draws_it_over_the_window(live_server):
    values = {"timeline-path.value": ["path"], "timeline-state.data": STATE}
    status, body = call(live_server, "timeline-graph.figure", values, "timeline-path.value")
    assert status == 200, body[:300]
    response = json.loads(body)["response"]
    names = [t.get("name") for t in response["timeline-graph"]["figure"]["data"]]
    assert "critical path" in names
    assert response["timeline-state"]["data"]["path"] is True
    values["timeline-path.value"] = []
    status, body = call(live_server, "timeline-graph.figure", values, "timeline-path.value")
    figure = json.loads(body)["response"]["timeline-graph"]["figure"]
    names = [t.get("name") for t in figure["data"]]
    assert status == 200 and "critical path" not in names
