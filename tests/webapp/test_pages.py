"""Every page renders for a full trace, and says what is missing for a trace that lacks data."""

from __future__ import annotations

import json
from pathlib import Path

import plotly.io.json as pio_json
import pytest
from neuron_explorer.plot.timeline import build_index, timeline_figure
from neuron_explorer.webapp.app import PAGES
from synthetic_trace import load_synthetic


def rendered(component) -> str:
    """The JSON the browser would receive for a layout."""
    return json.dumps(json.loads(pio_json.to_json_plotly(component)))


CPU_ONLY = Path(__file__).resolve().parents[1] / "data" / "real_traces" / \
    "cpu_only__rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.TITLE)
def test_each_page_renders_a_full_trace(page, app_context):
    trace = app_context.store.get("run_a.pftrace")
    text = rendered(page.layout(trace, "run_a.pftrace", {"other": "run_b.pftrace"}, app_context))
    assert page.TITLE in text
    assert "Could not" not in text and "has no" not in text or page.TITLE == "Compile"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.TITLE)
def test_each_page_says_what_a_sparse_trace_lacks(page, app_context):
    """A CPU-only PyTorch-profiler trace: slices and threads, no device analyses."""
    import neuron_explorer

    sparse = neuron_explorer.load(CPU_ONLY)
    app_context.store.add("cpu.json", sparse)
    text = rendered(page.layout(sparse, "cpu.json", {}, app_context))
    assert page.TITLE in text
    # an analysis that raised shows as a notice too: that is a failure, not a sparse trace
    assert "Could not compute" not in text
    if page.TITLE in ("Engines", "Roofline", "Memory", "Compile"):
        assert "notice" in text


def test_overview_ranks_findings_and_links_them_to_the_timeline(app_context):
    from neuron_explorer.webapp.pages import overview

    text = rendered(overview.findings(app_context.store.get("run_a.pftrace"), "run_a.pftrace"))
    first = text.index("Device waits on the host to launch work")
    assert first < text.index("Host waits on the device")
    assert "/timeline?trace=run_a.pftrace&start=" in text and "select=" in text


def test_overview_keeps_the_rules_order_and_sets_findings_saving_nothing_apart():
    """The page sorted the findings by time lost again, so a saving that waits on another
    fix came before that fix (the report's order is after it); and one saving nothing read
    "0 ns lost" among the ranked bottlenecks."""
    from neuron_explorer.rules.finding import NO_SAVING_TITLE, Finding, ranked
    from neuron_explorer.webapp.pages import overview

    def finding(rule_id: str, lost: int, after: str = "") -> Finding:
        return Finding(rule_id, f"title of {rule_id}", "medium", lost, lost / 10_000,
                       after=after)

    findings = ranked([finding("small_dma", 3_000, after="host_bound"),
                       finding("host_bound", 2_000), finding("exposed_communication", 0)])

    class Shown:
        def bottlenecks(self):
            return findings

        def summary(self):
            return {"steps_analysed": [0, 1]}

    text = rendered(overview.findings(Shown(), "t.pftrace"))
    assert (text.index("title of host_bound") < text.index("title of small_dma")
            < text.index(NO_SAVING_TITLE) < text.index("title of exposed_communication"))
    assert "no time to save now" in text and "0 ns" not in text


def test_timeline_figure_payload_is_compact_typed_arrays(tmp_path):
    trace = load_synthetic(tmp_path, n_steps=4, ops_per_step=2000)
    index = build_index(trace)
    window = index.query(index.start_ns, index.end_ns, 1600)
    figure = timeline_figure(index, window, selected=int(trace.ops["id"].iloc[0]),
                             flow_partners=[int(trace.kernels["id"].iloc[0])])
    payload = json.loads(pio_json.to_json_plotly(figure))
    bars = [t for t in payload["data"] if t["type"] == "bar"]
    assert bars and all("bdata" in t["base"] and "bdata" in t["x"] for t in bars)
    assert sum(len(t["text"]) for t in bars) == window.n_bars
    assert len(payload["layout"]["shapes"]) == 2  # the selection outline and one flow line
    assert len(json.dumps(payload)) < 2_000_000


def test_time_axis_ticks_are_round_and_read_in_a_fitting_unit():
    from neuron_explorer.plot.timeline import time_ticks

    ticks = time_ticks(2_221_000_000, 2_229_000_000, origin=0)
    assert ticks["ticktext"][:2] == ["2.221 s", "2.222 s"]
    assert ticks["tickvals"][0] == 2_221_000.0  # µs since the origin, the axis unit
    assert time_ticks(5_000_000, 5_200_000, origin=0)["ticktext"][1] == "5.05 ms"
    assert time_ticks(1_000, 1_050, origin=1_000)["ticktext"][0] == "0.00 µs"


ALEXNET = "critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz"
SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


def test_overview_names_the_analysed_steps_and_a_small_models_mfu(app_context):
    """A recorded window of steps 1–3: the page says the time is of those steps (not the
    trace's length, seconds longer), and a toy model's MFU reads in two significant digits
    (0.007%), not 0.0%."""
    import neuron_explorer
    from neuron_explorer.webapp.pages import overview

    trace = neuron_explorer.load(SAMPLES / "slow_dataloader.pftrace")
    text = rendered(overview.layout(trace, "slow_dataloader.pftrace", {}, app_context))
    assert "trace length" not in text and "time analysed" in text
    assert "over steps 1\\u20133 of 1\\u20133" in text
    mfu = trace.summary()["mfu"]
    assert 0 < mfu < 0.0005  # a toy model: its share must not round to 0.0%
    assert '"0.0%"' not in text and f"{mfu * 100:.2g}%" in text


def test_overview_of_a_trace_without_steps_does_not_speak_of_steps(app_context):
    import neuron_explorer
    from neuron_explorer.webapp.pages import overview

    no_steps = neuron_explorer.load(CPU_ONLY.parent / ALEXNET)  # a Kineto trace without step marks
    text = rendered(overview.layout(no_steps, ALEXNET, {}, app_context))
    assert "whole trace" in text and "ms per step" not in text


def test_memory_holders_say_when_the_peak_is_as_the_chart_does(app_context):
    """The holders' peak time read as a raw clock value (8,055,345,501) beside a chart in
    seconds after the first sample; it now reads like the "reached at" card."""
    import neuron_explorer
    from neuron_explorer.webapp.formatting import duration
    from neuron_explorer.webapp.pages import memory

    trace = neuron_explorer.load(SAMPLES / "odd_dims.pftrace")
    text = rendered(memory.layout(trace, "odd_dims.pftrace", {}, app_context))
    assert '"peak_ts"' not in text and '"peak_at"' in text
    reached = trace.memory_timeline()
    peak_at = int(reached.loc[reached["in_use_bytes"].idxmax(), "ts"]) - int(reached["ts"].min())
    assert f'"peak_at": "{duration(peak_at)}"'.replace("µ", "\\u00b5") in text


def test_findings_of_a_trace_without_steps_give_their_share_of_the_trace(app_context, tmp_path):
    """A Kineto trace with no step marks: "27.5% of step" named a step the trace does not
    have. Here a host-bound GPU loop without ProfilerStep ranges: 20 kernels of 10 us,
    each launched 100 us after the last."""
    import neuron_explorer
    from neuron_explorer.webapp.pages import overview

    events = []
    for i in range(20):
        t = 100 * i
        events += [
            {"ph": "X", "cat": "cpu_op", "name": "aten::relu", "pid": 1, "tid": 1, "ts": t,
             "dur": 20, "args": {"External id": i + 1}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
             "ts": t + 5, "dur": 5, "args": {"correlation": i + 1}},
            {"ph": "X", "cat": "kernel", "name": "relu_kernel", "pid": 0, "tid": 7,
             "ts": t + 12, "dur": 10, "args": {"correlation": i + 1, "device": 0, "stream": 7}}]
    path = tmp_path / "loop.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    text = rendered(overview.findings(neuron_explorer.load(path), "loop.json"))
    assert "% of the trace" in text and "% of step" not in text


def test_compare_with_a_trace_without_steps_says_its_bars_are_the_whole_trace(app_context):
    """Its 43 s drew as "ms per step" beside a 22 ms step, as if it were one step."""
    import neuron_explorer
    from neuron_explorer.webapp.pages import compare

    app_context.store.add("odd_dims.pftrace", neuron_explorer.load(SAMPLES / "odd_dims.pftrace"))
    app_context.store.add(ALEXNET, neuron_explorer.load(CPU_ONLY.parent / ALEXNET))
    text = rendered(compare.comparison(app_context, "odd_dims.pftrace", ALEXNET))
    assert f"{ALEXNET} has no step marks" in text
    assert f"{ALEXNET} (whole trace) \\u00b7 device" in text
    assert "odd_dims.pftrace \\u00b7 device" in text


def test_compare_and_tables_show_durations_in_units_not_raw_ns(app_context):
    """The headline diff gave a step time of 28686297.5 and the tables 'device_ns' columns
    of raw nanoseconds."""
    import neuron_explorer
    from neuron_explorer.webapp.components import data_table
    from neuron_explorer.webapp.pages import compare

    for name in ("gpt_eager.pftrace", "gpt_compiled.pftrace"):
        app_context.store.add(name, neuron_explorer.load(SAMPLES / name))
    parts = compare.comparison(app_context, "gpt_eager.pftrace", "gpt_compiled.pftrace")
    (headline,) = [grid for p in parts for c in p.children for grid in _grids(c)
                   if grid.id == "diff-summary"]
    step = next(r for r in headline.rowData if r["metric"] == "step time")
    assert step["a"].endswith(" ms") and step["b"].endswith(" ms")
    mfu = next(r for r in headline.rowData if r["metric"] == "MFU")
    assert mfu["a"].endswith("%")

    ops = neuron_explorer.load(SAMPLES / "gpt_eager.pftrace").op_stats()
    (table,) = _grids(data_table(ops, "t"))
    headers = {c["field"]: c["headerName"] for c in table.columnDefs}
    assert not any(i.endswith("_ns") for i in headers)
    assert headers["device_us"] == "device (µs)"


def _grids(component) -> list:
    """The AG Grids in a component tree."""
    import dash_ag_grid as dag

    if isinstance(component, dag.AgGrid):
        return [component]
    children = getattr(component, "children", None)
    children = children if isinstance(children, list | tuple) else [children]
    return [grid for child in children if child is not None for grid in _grids(child)]


def test_tables_format_filter_sort_page_and_export_as_the_data_asks():
    """Each column's filter, formatting and type follow its data; the grid pages, and the
    Export button names its grid (assets/grid_export.js exports that grid)."""
    import pandas as pd
    from neuron_explorer.webapp.components import data_table

    df = pd.DataFrame({"name": ["a", None], "count": [3, 4], "device_ns": [1500.0, None],
                       "share_of_step": [0.25, 0.5], "ratio": [1.5, 2.0]})
    table = data_table(df, "t", page_size=7, selectable=True)
    export, grid = table.children
    assert export.className == "grid-export" and getattr(export, "data-grid") == "t"
    columns = {c["field"]: c for c in grid.columnDefs}
    assert columns["name"]["filter"] == "agTextColumnFilter"
    formats = {field: c.get("valueFormatter", {}).get("function", "")
               for field, c in columns.items()}
    assert "d3.format(',')" in formats["count"] and "d3.format(',.1f')" in formats["device_us"]
    assert "d3.format('.2~%')" in formats["share_of_step"]
    assert "d3.format(',.4~r')" in formats["ratio"] and formats["name"] == ""
    assert all(columns[f]["filter"] == "agNumberColumnFilter"
               for f in ("count", "device_us", "ratio"))
    assert grid.rowData == [
        {"name": "a", "count": 3, "device_us": 1.5, "share_of_step": 0.25, "ratio": 1.5},
        {"name": "", "count": 4, "device_us": None, "share_of_step": 0.5, "ratio": 2.0}]
    assert grid.defaultColDef["sortable"] and grid.defaultColDef["floatingFilter"]
    options = grid.dashGridOptions
    assert options["pagination"] and options["paginationPageSize"] == 7
    assert options["rowSelection"]["mode"] == "singleRow"
    assert "rowSelection" not in data_table(df, "u").children[1].dashGridOptions
