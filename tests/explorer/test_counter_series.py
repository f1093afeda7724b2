"""Counter series: one summary row per series, its mean weighted by how long each value
held; a figure of every series."""

from __future__ import annotations

import neuron_explorer
import pytest
from synthetic import TraceBuilder


def _trace(tmp_path):
    """HBM in use on device 0: 100 for 10 us, 400 for 30 us, then 0 (the last sample)."""
    b = TraceBuilder()
    host = b.thread()
    b.metadata(host, {"hardware": "trn2"})
    b.slice(host, 0, 40_000, "step 0", "step", {"step": 0})
    hbm = b.counter_track(0, "HBM in use (bytes)")
    for ts, value in ((0, 100.0), (10_000, 400.0), (40_000, 0.0)):
        b.counter(hbm, ts, value)
    return neuron_explorer.load(b.write_pftrace(tmp_path / "c.pftrace"))


def test_the_mean_over_time_weights_each_value_by_how_long_it_held(tmp_path):
    summary = _trace(tmp_path).counter_summary()
    assert len(summary) == 1
    row = summary.iloc[0]
    assert row["series"] == "HBM in use (bytes)" and row["device"] == 0
    assert (row["samples"], row["min"], row["max"], row["last"]) == (3, 0.0, 400.0, 0.0)
    assert row["mean"] == pytest.approx(500 / 3)
    assert row["time_weighted_mean"] == pytest.approx((100 * 10 + 400 * 30) / 40)
    assert (row["first_ts"], row["last_ts"]) == (0, 40_000)


def test_our_recording_has_memory_and_engine_series(repo_root):
    trace = neuron_explorer.load(repo_root / "sample_traces" / "gpt_eager.pftrace")
    summary = trace.counter_summary().set_index("series")
    assert {"HBM in use (bytes)", "Tensor Engine utilisation (%)"} <= set(summary.index)
    engine = summary.loc["Tensor Engine utilisation (%)"]
    assert 0 <= engine["min"] <= engine["time_weighted_mean"] <= engine["max"] <= 100
    figure = trace.plot.counters()
    assert {line.name for line in figure.data} == set(summary.index)
    assert max(max(line.y) for line in figure.data) == pytest.approx(100)


def test_a_trace_without_counters_has_no_rows_and_says_so(load_real):
    trace = load_real("critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz")
    assert trace.counter_summary().empty
    assert "no counters" in str(trace.plot.counters().layout.annotations[0].text)


def test_the_report_lists_each_series(repo_root):
    from neuron_explorer.report import render_report

    trace = neuron_explorer.load(repo_root / "sample_traces" / "gpt_eager.pftrace")
    section = render_report(trace, "text").split("Counters (the whole trace)")[1]
    section = section.split("Top ops")[0]
    row = next(line.split() for line in section.splitlines()
               if line.startswith("Tensor Engine utilisation (%)"))
    assert row[4:] == ["0", "156", "0.4594", "40.38", "0"]
