"""The queue figures: queue length, idle by HTA category, kernel sequences, annotations."""

from __future__ import annotations

import neuron_explorer
import pytest

SAMPLED = "trace_filter__sampled_rank-0.json.gz"


def test_queue_length_has_a_line_per_stream_ending_empty(load_real):
    trace = load_real(SAMPLED)
    figure = trace.plot.queue_length()
    series = trace.queue_length()
    assert sorted(line.name for line in figure.data) == sorted(series["stream"].unique())
    deepest = next(line for line in figure.data if line.name == "stream 7")
    assert max(deepest.y) == series.loc[series["stream"] == "stream 7", "queue_length"].max()
    assert all(line.y[-1] == 0 for line in figure.data)  # every queue drains


def test_stream_idle_stacks_the_categories_per_stream(load_real):
    trace = load_real(SAMPLED)
    figure = trace.plot.stream_idle()
    assert [bar.name for bar in figure.data] == ["host_wait", "kernel_wait", "other"]
    other = next(bar for bar in figure.data if bar.name == "other")
    at = list(other.y).index("stream 7")
    idle = trace.stream_idle().set_index(["stream", "idle_category"])["idle_ns"]
    assert other.x[at] == pytest.approx(idle[("stream 7", "other")] / 1e6)


def test_kernel_sequences_and_annotations_rank_by_time(load_real):
    trace = load_real(SAMPLED)
    sequences = trace.plot.kernel_sequences(n=3, top=5)
    table = trace.kernel_sequences(3).sort_values("total_ns", ascending=False)
    assert len(sequences.data[0].x) == 5
    assert sequences.data[0].x[-1] == pytest.approx(table["total_ns"].iloc[0] / 1e6)
    regions = trace.plot.annotations(top=3)
    notes = trace.annotations().sort_values("device_total_ns", ascending=False)
    assert list(regions.data[0].hovertext)[::-1] == notes["path"].head(3).tolist()


def test_a_trace_without_device_work_says_so(load_real):
    cpu_only = load_real("cpu_only__rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")
    for figure in (cpu_only.plot.queue_length(), cpu_only.plot.stream_idle(),
                   cpu_only.plot.kernel_sequences()):
        assert not figure.data and figure.layout.annotations[0].text.startswith("no ")


def test_our_recording_draws_its_queue(repo_root):
    trace = neuron_explorer.load(repo_root / "sample_traces" / "fp32_matmul.pftrace")
    figure = trace.plot.queue_length()
    assert figure.data and max(max(line.y) for line in figure.data) >= 3  # device-bound


def test_the_report_lists_regions_and_repeated_sequences(load_real, repo_root):
    from neuron_explorer.report import render_report

    text = render_report(load_real(SAMPLED), "text")
    regions = text.split("Annotated regions (device time, the whole trace)")[1]
    first = regions.splitlines()[3]  # after the rule and the header
    assert first.split()[:2] == ["DistributedDataParallel.forward", "1"]
    assert "188.7 ms" in first  # the most device time, nested regions' work included
    mlp = render_report(neuron_explorer.load(repo_root / "sample_traces" / "mlp_eager.pftrace"),
                        "text")
    sequences = mlp.split("Frequent kernel sequences (3 kernels, the whole trace)")[1]
    row = next(line for line in sequences.splitlines() if line.startswith("_foreach_lerp"))
    # Adam's foreach kernels, once in each of the 6 steps: a fusion candidate; each
    # occurrence's kernels, and its ops compiled into one program (fused along the recorded
    # data flow, each tensor is read once: memory-bound foreach kernels gain a little)
    assert row.split()[-8:] == ["6", "411.9", "us", "22.0%", "68.65", "us", "65.24", "us"]
    kineto = text.split("Frequent kernel sequences (3 kernels, the whole trace)")[1]
    assert "compiled" not in kineto.split("\n\n")[0]  # no op keys: nothing to compile
    assert "Annotated regions" not in mlp  # no record_function ranges recorded
