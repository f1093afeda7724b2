"""launch_delay: kernels launched onto an idle queue that start long after their launch
returned; the saving is the part of the delays on the steps' critical path."""

from __future__ import annotations

from pathlib import Path

import neuron_explorer
import pytest
from neuron_explorer.analyses.launch_stats import launch_outliers
from neuron_explorer.rules import dependency_idle, launch_delay
from scenarios import Scenario

STEP_NS = 2_000_000
STEPS = 4
SAMPLED_0 = "trace_filter__sampled_rank-0.json.gz"
ALEXNET = "critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz"


def _trace(tmp: Path, delay_ns: int, a_ns: int = 100_000,
           b_launch: int = 200_000) -> neuron_explorer.Trace:
    """Per 2 ms step: op a [0, 20) us launches kernel a at 30 us (`a_ns` long); op b,
    launched at `b_launch` for 20 us, launches kernel b, which starts `delay_ns` after
    op b returns or when a ends, whichever is later; the host syncs until b ends."""
    sc = Scenario()
    for n in range(STEPS):
        t = n * STEP_NS
        sc.b.slice(sc.host, t, STEP_NS, f"step {n}", "step", {"step": n})
        sc.op(t, 20_000, "aten::a", 10 * n + 1, n, kernel=(t + 30_000, a_ns))
        b0 = max(t + b_launch + 20_000 + delay_ns, t + 30_000 + a_ns)
        sc.op(t + b_launch, 20_000, "aten::b", 10 * n + 2, n, kernel=(b0, 50_000))
        sync0 = t + b_launch + 30_000
        sc.b.slice(sc.host, sync0, b0 + 60_000 - sync0, "sync", "sync",
                   {"kind": "item", "source": "train.py:42", "device": 0, "step": n})
    return neuron_explorer.load(sc.write(tmp, f"delay_{delay_ns}_{a_ns}_{b_launch}"))


def _analysed(trace: neuron_explorer.Trace) -> int:
    from neuron_explorer.analyses.steady_state import analysed_steps

    return len(analysed_steps(trace).steps)


def test_a_kernel_that_starts_long_after_its_launch_on_an_idle_queue(tmp_path):
    """b is launched 70 us after a ended and starts 150 us after its launch returned: the
    path runs through the delay (7.5% of each step, under dependency_idle's 10%)."""
    trace = _trace(tmp_path, 150_000)
    assert not dependency_idle.check(trace)
    steps = _analysed(trace)
    delays = launch_delay.idle_delays(trace)
    assert len(delays) == steps and (delays["launch_delay_ns"] == 150_000).all()
    (f,) = launch_delay.check(trace)
    assert f.time_lost_ns == 150_000 * steps == f.symptom_ns
    assert f.severity == "medium" and f.share_of_step == pytest.approx(0.075)
    assert f.saving_basis.startswith("critical path")


def test_a_short_delay_is_a_launch_latency_not_a_finding(tmp_path):
    """80 us, under HTA's 100 us cutoff."""
    trace = _trace(tmp_path, 80_000)
    assert not len(launch_delay.idle_delays(trace)) and not launch_delay.check(trace)


def test_a_delay_behind_queued_work_is_the_device_being_busy(tmp_path):
    """b is launched while a 400 us kernel a runs and starts when a ends: HTA counts a
    launch delay of 260 us, but the queue was busy all along."""
    trace = _trace(tmp_path, 0, a_ns=400_000, b_launch=150_000)
    assert len(launch_outliers(trace.launch_stats())["delayed"]) == STEPS
    assert not len(launch_delay.idle_delays(trace)) and not launch_delay.check(trace)


def test_dependency_idle_reports_the_delays_where_it_fires(tmp_path):
    """A 300 us delay (15% of the step) is also a device-wide wait: dependency_idle's."""
    trace = _trace(tmp_path, 300_000)
    assert dependency_idle.check(trace) and len(launch_delay.idle_delays(trace))
    assert not launch_delay.check(trace)


def test_fires_on_htas_sampled_trace(load_real):
    """HTA's sampled rank 0 has 937 delayed kernels (20.5 s of delay, mostly queued behind
    other work); 28 of them were launched onto an idle queue (297 ms), 65 ms of which
    lies on the critical path, but a step saves no more than its host's waits on the
    device: 11.1 ms in the first step (59 ms on its path), 6.5 ms in the second."""
    trace = load_real(SAMPLED_0)
    assert len(launch_outliers(trace.launch_stats())["delayed"]) == 937
    (f,) = launch_delay.check(trace)
    assert "(28 launches)" in f.title
    assert f.symptom_ns == pytest.approx(296.98e6, rel=0.01)
    assert f.time_lost_ns == pytest.approx(17.61e6, rel=0.01)
    assert f.severity == "low"


def test_silent_where_the_delays_cost_little_or_queue_behind_work(repo_root, load_real):
    """AlexNet's one idle-queue delay (432 us) is under 1% of its 43 s; the fp32 matmul
    recording's delayed kernels (25: HTA's launch delay over 100 us) all waited behind
    queued work (the matmuls, the optimizer's passes)."""
    alexnet = load_real(ALEXNET)
    assert launch_delay.idle_delays(alexnet)["launch_delay_ns"].tolist() == [432_000]
    assert not launch_delay.check(alexnet)
    fp32 = neuron_explorer.load(repo_root / "sample_traces" / "fp32_matmul.pftrace")
    assert len(launch_outliers(fp32.launch_stats())["delayed"]) == 25
    assert not len(launch_delay.idle_delays(fp32)) and not launch_delay.check(fp32)
