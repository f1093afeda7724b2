"""The Ranks page: a run folder served by `view`, its figures built from the run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import plotly.io.json as pio_json
import pytest
from neuron_explorer.webapp.app import AppContext
from neuron_explorer.webapp.pages import ranks
from neuron_explorer.webapp.trace_store import TraceStore


def _explorer_scenarios():
    """tests/explorer/run_scenarios.py, imported without leaving tests/explorer on sys.path
    (its conftest would then shadow this folder's)."""
    here = str(Path(__file__).parents[1] / "explorer")
    sys.path.insert(0, here)
    try:
        import run_scenarios
    finally:
        sys.path.remove(here)
    return run_scenarios


rs = _explorer_scenarios()


def rendered(component) -> str:
    return json.dumps(json.loads(pio_json.to_json_plotly(component)))


@pytest.fixture
def run_context(tmp_path: Path):
    rs.two_ranks(tmp_path / "train.run")
    (tmp_path / "alone.pftrace").write_bytes((tmp_path / "train.run" / "rank0.pftrace")
                                             .read_bytes())
    store = TraceStore(tmp_path)
    yield AppContext(store)
    store.close()


def test_a_rank_of_a_run_folder_shows_the_whole_run(run_context):
    name = "train.run/rank1.pftrace"
    trace = run_context.store.get(name)
    text = rendered(ranks.layout(trace, name, {}, run_context))
    assert "train.run: 2 ranks" in text
    assert "Rank 1 is a straggler" in text
    assert "rank 1" in text  # the stragglers card
    page = ranks.layout(trace, name, {}, run_context)
    figures = {g.id: json.loads(pio_json.to_json_plotly(g.figure)) for g in _graphs(page)}
    heat = figures["ranks-steps"]["data"][0]
    assert heat["y"] == ["rank 0", "rank 1"] and heat["z"] == [[1.0] * 4, [1.0] * 4]
    aligned = figures["ranks-aligned"]["data"]
    waiting, _moving, links = aligned
    assert sum(x > 0 for x in waiting["x"]) == 4  # rank 0 waits at each of the 4 calls
    assert pytest.approx(max(waiting["x"])) == 100.0  # µs
    assert len([x for x in links["x"] if x is None]) == 4  # one line per call
    comm = figures["ranks-comm"]["data"]
    assert [b["name"] for b in comm] == ["overlapped with compute", "moving data, not hidden",
                                         "waiting for the last rank"]
    assert comm[1]["y"] == [1.2, 0.8]  # ms: rank 0's exposed 300 us per step moving data


def test_a_trace_on_its_own_is_told_what_the_page_needs(run_context):
    trace = run_context.store.get("alone.pftrace")
    text = rendered(ranks.layout(trace, "alone.pftrace", {}, run_context))
    assert "single process" in text and "torchrun" in text


def _graphs(component):
    from dash import dcc

    found = []
    stack = [component]
    while stack:
        c = stack.pop()
        if isinstance(c, dcc.Graph):
            found.append(c)
        children = getattr(c, "children", None)
        if isinstance(children, (list, tuple)):
            stack.extend(children)
        elif children is not None and hasattr(children, "children"):
            stack.append(children)
    return found


def test_a_folder_of_unrelated_traces_is_no_run(run_context, tmp_path):
    """Two traces named for the same rank (two jobs' rank 0): a notice, not an error."""
    other = tmp_path / "jobs"
    other.mkdir()
    for job in ("a", "b"):
        (other / f"{job}_rank0.pftrace").write_bytes(
            (tmp_path / "train.run" / "rank0.pftrace").read_bytes())
    trace = run_context.store.get("jobs/a_rank0.pftrace")
    text = rendered(ranks.layout(trace, "jobs/a_rank0.pftrace", {}, run_context))
    assert "do not load as one run" in text and "two traces are rank 0" in text


def test_the_run_step_time_is_a_step_not_the_sum_of_the_analysed_steps(run_context):
    """The card said "step time per rank" over the total of all analysed steps: several times
    the step time the per-rank table shows just below it."""
    name = "train.run/rank0.pftrace"
    trace = run_context.store.get(name)
    run = ranks.load_folder(ranks.run_folder(trace, run_context, name))
    slowest = max(float(run[r].summary()["step_time_ns"]) for r in run)
    text = rendered(ranks.layout(trace, name, {}, run_context))
    assert "step time per rank" not in text
    assert json.dumps(ranks.duration(slowest)) in text and "median per step, slowest rank" in text
