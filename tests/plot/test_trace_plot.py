"""`trace.plot.*` and `run.plot.*` return plotly Figures with the expected traces and axes, on
our trace and on a PyTorch-profiler (Kineto) trace; the timeline keeps its level of detail."""

from __future__ import annotations

import base64
import sys
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import pytest

REPO = Path(__file__).resolve().parents[2]
OURS = REPO / "sample_traces" / "mlp_eager.pftrace"
RUN = REPO / "sample_traces" / "ddp.run"
KINETO = "amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz"
CPU_ONLY = "cpu_only__rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"


@pytest.fixture(scope="module")
def ours():
    import neuron_explorer

    return neuron_explorer.load(OURS)


@pytest.fixture(scope="module")
def kineto(real_traces_dir):
    import neuron_explorer

    return neuron_explorer.load(real_traces_dir / KINETO)


def values(array) -> np.ndarray:
    """A trace's array, decoded when it is a typed array ({'dtype', 'bdata'})."""
    if isinstance(array, dict) and "bdata" in array:
        return np.frombuffer(base64.b64decode(array["bdata"]), dtype=array["dtype"])
    return np.asarray(array)


def test_breakdown_stacks_host_and_device_by_category(ours, kineto):
    for trace in (ours, kineto):
        fig = trace.plot.breakdown()
        assert isinstance(fig, go.Figure) and fig.layout.barmode == "stack"
        assert fig.data and all(t.type == "bar" and t.orientation == "h" for t in fig.data)
        assert {y for t in fig.data for y in t.y} <= {"host", "device"}
        assert fig.layout.xaxis.title.text == "ms per step"
    names = {t.name for t in ours.plot.breakdown().data}
    assert {"tensor", "vector", "idle"} <= names
    mean = ours.breakdown().groupby(["side"])["ns"].sum() / ours.breakdown()["step"].nunique()
    drawn = sum(x for t in ours.plot.breakdown().data
                for x, y in zip(t.x, t.y, strict=True) if y == "device")
    assert drawn == pytest.approx(mean["device"] / 1e6)


def test_timeline_draws_every_row_over_the_window_asked(ours, kineto):
    for trace in (ours, kineto):
        fig = trace.plot.timeline(interactive=False)
        assert type(fig) is go.Figure
        bars = [t for t in fig.data if t.type == "bar"]
        assert bars and fig.layout.yaxis.ticktext == tuple(trace.plot.timeline_index().labels)
    steps = ours.steps
    t0 = int(steps["ts"].iloc[1])
    t1 = t0 + int(steps["dur"].iloc[1])
    fig = ours.plot.timeline(t0, t1, interactive=False)
    origin = ours.plot.timeline_index().start_ns
    assert fig.layout.xaxis.range == pytest.approx(((t0 - origin) / 1e3, (t1 - origin) / 1e3))
    starts = np.concatenate([values(t.base) for t in fig.data if t.type == "bar"])
    ends = starts + np.concatenate([values(t.x) for t in fig.data if t.type == "bar"])
    assert (ends >= (t0 - origin) / 1e3).all() and (starts <= (t1 - origin) / 1e3).all()
    assert {t.name for t in fig.data if t.type == "bar"} >= {"op", "kernel", "instruction"}


def test_timeline_of_chosen_tracks_and_a_clear_error_for_an_unknown_one(ours):
    from neuron_explorer.common.errors import NeuronExplorerError

    fig = ours.plot.timeline(tracks=["Kernels"], interactive=False)
    assert fig.layout.yaxis.ticktext == ("Kernels",)
    assert {t.name for t in fig.data if t.type == "bar"} == {"kernel"}
    with pytest.raises(NeuronExplorerError, match="no track named Nope"):
        ours.plot.timeline(tracks=["Nope"])


def test_timeline_window_that_misses_the_trace_says_where_its_events_are(ours):
    """Seconds, or ns from 0 rather than the trace's clock, drew an empty figure."""
    from neuron_explorer.common.errors import NeuronExplorerError

    index = ours.plot.timeline_index()
    where = f"events run from ts {index.start_ns} to {index.end_ns} ns"
    with pytest.raises(NeuronExplorerError, match=f"holds no events: this trace's {where}"):
        ours.plot.timeline(1.0, 2.0, interactive=False)
    t0 = int(ours.steps["ts"].iloc[1])
    with pytest.raises(NeuronExplorerError, match="give start_ns < end_ns"):
        ours.plot.timeline(t0 + 1000, t0, interactive=False)


def test_roofline_puts_ops_under_the_hardware_roofs(ours, kineto):
    fig = ours.plot.roofline()
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    markers = [t for t in fig.data if t.mode == "markers"]
    roofs = [t for t in fig.data if t.mode == "lines"]
    assert markers and {t.name for t in roofs} == {"roof (bfloat16)", "roof (float32)"}
    assert sum(len(t.x) for t in markers) == int(
        ((ours.roofline()["intensity"] > 0)
         & (ours.roofline()["achieved_flops_per_s"] > 0)).sum())
    empty = kineto.plot.roofline()  # no FLOPs or bytes in this trace: a note, not a failure
    assert not empty.data and "FLOPs" in empty.layout.annotations[0].text


def test_memory_draws_hbm_in_use_over_time(ours, kineto):
    fig = ours.plot.memory()
    (line,) = fig.data
    assert line.type == "scatter" and line.line.shape == "hv"
    assert max(line.y) == pytest.approx(ours.memory_timeline()["in_use_bytes"].max() / 2**20)
    assert fig.layout.yaxis.title.text == "HBM in use (MiB)"
    assert not kineto.plot.memory().data  # no HBM counters


def test_engines_over_the_steps_and_one_step(ours, kineto):
    fig = ours.plot.engines()
    assert {t.name for t in fig.data} >= {"tensor", "vector", "scalar", "gpsimd"}
    assert all(t.type == "scatter" and max(t.y) <= 100 for t in fig.data)
    assert fig.layout.yaxis.title.text == "busy (%)"
    every = max(len(t.x) for t in fig.data)
    one = ours.plot.engines(step=1)
    assert 0 < max(len(t.x) for t in one.data) <= every
    per_step = ours.plot.engines_per_step()
    assert all(t.type == "bar" for t in per_step.data)
    assert set(per_step.data[0].x) == {f"step {s}" for s in ours.steps["step"]}
    assert isinstance(kineto.plot.engines(), go.Figure)  # GPU streams, no engines


def test_engines_of_a_step_that_is_not_there_says_which_are(ours):
    from neuron_explorer.common.errors import NeuronExplorerError

    with pytest.raises(NeuronExplorerError, match="no step 999"):
        ours.plot.engines(step=999)


def test_op_stats_shows_the_longest_ops_first(ours, kineto):
    for trace in (ours, kineto):
        fig = trace.plot.op_stats(n=5)
        device = next(t for t in fig.data if t.name == "device")
        assert len(device.y) == 5
        top = trace.op_stats().sort_values("device_ns", ascending=False).head(5)
        assert list(device.y)[::-1] == top["name"].tolist()  # the longest is drawn on top
    assert {t.name for t in ours.plot.op_stats().data} == {"device", "host"}


def test_a_cpu_only_trace_draws_what_it_has(real_traces_dir):
    import neuron_explorer

    trace = neuron_explorer.load(real_traces_dir / CPU_ONLY)
    assert trace.plot.timeline(interactive=False).data
    for figure in (trace.plot.roofline(), trace.plot.memory(), trace.plot.engines(),
                   trace.plot.op_stats()):
        assert isinstance(figure, go.Figure)  # empty with a note, never an error


@pytest.mark.slow  # 10-11 s in a CI run
def test_run_plot_step_times_communication_and_collectives():
    import neuron_explorer

    run = neuron_explorer.load(RUN)
    (heat,) = run.plot.step_times().data
    assert heat.type == "heatmap" and list(heat.y) == [f"rank {r}" for r in run.ranks]
    assert np.asarray(heat.z).shape == run.step_times().shape
    comm = run.plot.communication()
    assert [t.name for t in comm.data] == ["overlapped with compute", "moving data, not hidden",
                                           "waiting for the last rank"]
    assert all(list(t.x) == [f"rank {r}" for r in run.ranks] for t in comm.data)
    collectives = run.plot.collectives()
    assert [t.name for t in collectives.data] == ["waiting", "moving data", "same call"]


def test_a_timeline_widget_draws_each_new_window_from_the_index(ours):
    pytest.importorskip("ipywidgets")
    pytest.importorskip("anywidget")
    widget = ours.plot.timeline(interactive=True)
    assert isinstance(widget, go.FigureWidget)
    origin = ours.plot.timeline_index().start_ns
    op = ours.ops.iloc[len(ours.ops) // 2]
    lo, hi = (int(op["ts"]) - origin) / 1e3, (int(op["ts"] + op["dur"]) - origin) / 1e3
    before = {t.name: len(t.text) for t in widget.data if t.type == "bar"}
    widget.layout.xaxis.range = [lo, hi]  # what a zoom in the notebook does
    after = {t.name: list(t.text) for t in widget.data if t.type == "bar"}
    assert op["name"] in after["op"] and len(after["op"]) < before["op"]
    assert widget.layout.xaxis.tickvals[0] >= lo  # ticks follow the new window


def test_outside_jupyter_the_timeline_is_a_static_figure(ours):
    assert type(ours.plot.timeline()) is go.Figure


@pytest.mark.slow
def test_a_million_event_timeline_draws_a_few_thousand_marks(tmp_path):
    sys.path.insert(0, str(REPO / "tests" / "webapp"))
    import neuron_explorer
    from synthetic_trace import events_in, write_trace

    path = write_trace(tmp_path / "big.pftrace", n_steps=20, ops_per_step=6250)
    assert events_in(20, 6250) >= 1_000_000
    trace = neuron_explorer.load(path)
    for window in ((None, None), (int(trace.steps["ts"].iloc[3]), int(trace.steps["ts"].iloc[4]))):
        fig = trace.plot.timeline(*window, interactive=False)
        drawn = sum(values(t.base if t.type == "bar" else t.x).size for t in fig.data)
        assert 0 < drawn <= 6_000, drawn


def test_kernel_figure_shows_each_line_and_the_engine_timeline():
    import neuron_explorer
    from neuron_explorer.analyses.kernel_lines import line_profile, nki_kernels

    trace = neuron_explorer.load(REPO / "sample_traces" / "nki_kernels.pftrace")
    kernel = nki_kernels(trace)[0]
    fig = trace.plot.kernel(kernel)
    assert isinstance(fig, go.Figure)
    bars = [t for t in fig.data if t.type == "bar"]
    segments = [t for t in fig.data if t.type == "scatter"]
    assert bars and segments
    lines = line_profile(trace, kernel)
    assert all(len(b.y) == len(lines) for b in bars)  # one bar per source line, per engine
    assert {t.xaxis for t in segments} == {"x2"}  # the timeline sits beside the profile


def test_the_timeline_draws_the_critical_path_over_its_tracks(ours):
    path = ours.critical_path()
    figure = ours.plot.timeline(critical_path=True, interactive=False)
    (line,) = [t for t in figure.data if t.name == "critical path"]
    index = ours.plot.timeline_index()
    first_row = {}
    for i, row in enumerate(index.slice_rows):
        first_row.setdefault(int(row.track_id), i)
    x, y = values(line.x), values(line.y)
    shown = path[(path["ts"] + path["dur"] > index.start_ns)]
    assert len(x) == len(y) == 2 * len(shown) > 0
    # each segment from its start to its end, on the top edge of its track's first row
    origin = index.start_ns
    assert np.allclose(x[0::2], (shown["ts"].to_numpy() - origin) / 1000)
    assert np.allclose(x[1::2], (shown["ts"] + shown["dur"] - origin).to_numpy() / 1000)
    assert np.allclose(y[0::2], [first_row[int(t)] - 0.45 for t in shown["track"]])
    assert all(name.startswith("critical path: ") for name in line.text)
    plain = ours.plot.timeline(interactive=False)
    assert not [t for t in plain.data if t.name == "critical path"]
