"""What a faster device saves on the steps (`critical_path.device_time_saving`): the
device's time beyond the host's own work, never more than the device time saved."""

from __future__ import annotations

import json

import neuron_explorer
import scenarios
from neuron_explorer.analyses.critical_path import device_time_saving

STEPS = 2


def _steps(tmp_path, name, kernel_ns: int, sync_ns: int = 0) -> neuron_explorer.Trace:
    """10 us host steps, each launching one kernel of `kernel_ns` at 500 ns (launched
    back to back: a kernel longer than the step makes the device lag behind the host);
    with `sync_ns`, the host waits that long for the device, until the step's kernel
    ends."""
    sc = scenarios.Scenario()
    end = 0
    for n in range(STEPS):
        t = sc.step(n)
        start = max(t + 500, end)
        end = start + kernel_ns
        sc.op(t, 400, "aten::mm", n + 1, n, kernel=(start, kernel_ns),
              busy={"tensor": kernel_ns}, instructions=False)
        if sync_ns:
            sc.b.slice(sc.host, end - sync_ns, sync_ns, "sync", "sync",
                       {"kind": "item", "device": 0, "step": n})
    return neuron_explorer.load(sc.write(tmp_path, name))


def test_a_host_bound_run_saves_nothing_from_a_faster_device(tmp_path):
    trace = _steps(tmp_path, "host_bound", kernel_ns=2_000)
    assert device_time_saving(trace, 1_000) == 0


def test_a_device_that_lags_its_host_saves_its_lead_at_most(tmp_path):
    # 15 us of kernel per 10 us host step: the device ends 10.5 us after the host's
    # steps (its first kernel launched 500 ns into the first)
    trace = _steps(tmp_path, "lagging", kernel_ns=15_000)
    assert device_time_saving(trace, 4_000) == 4_000
    assert device_time_saving(trace, 20_000) == STEPS * 5_000 + 500


def test_a_host_that_waits_saves_its_waits_at_most(tmp_path):
    trace = _steps(tmp_path, "synced", kernel_ns=8_000, sync_ns=3_000)
    assert device_time_saving(trace, 2_000) == 2_000
    assert device_time_saving(trace, 10_000) == STEPS * 3_000


def test_a_pytorch_profiler_trace_keeps_its_device_time(tmp_path):
    """Its host windows are no floor: a full launch queue blocks inside cudaLaunchKernel,
    which no trace marks as a wait."""
    path = tmp_path / "kineto.json"
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1,
               "tid": 1, "ts": 0, "dur": 1000, "args": {}},
              {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 10,
               "dur": 100, "args": {"device": 0, "stream": 7, "correlation": 1}}]
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    assert device_time_saving(neuron_explorer.load(path), 50_000) == 50_000



def _behind_after_warm_up(tmp_path) -> tuple[neuron_explorer.Trace, int]:
    """6 steps of 10 us: the host's Python runs 6 us before step 0's first launch, a 14 us
    kernel (the warm-up's), then 9.8 us kernels launched at 500 ns into each step. The
    device ends 9 us after the host, though its busy time is only 3 us over the host's
    windows (it idled 6 us before its first kernel)."""
    sc = scenarios.Scenario()
    end = 0
    for n in range(6):
        t = sc.step(n)
        kernel, offset = (14_000, 6_000) if n == 0 else (9_800, 500)
        start = max(t + offset, end)
        end = start + kernel
        sc.op(t + offset - 100, 100, "aten::mm", n + 1, n, kernel=(start, kernel),
              busy={"tensor": kernel}, instructions=False)
    return neuron_explorer.load(sc.write(tmp_path, "warm_up_backlog")), end - 6 * scenarios.STEP


def test_a_device_behind_since_its_warm_up_saves_what_ends_its_work_sooner(tmp_path):
    """Re-timed: 6 us less device time ends the work 6 us sooner (the device stays
    behind; its lead as busy time less the host's windows said 3 us), and 15 us less
    ends it only 9 us sooner: the device catches up by step 3, and the host ends the
    steps."""
    trace, behind = _behind_after_warm_up(tmp_path)
    assert behind == 9_000
    assert abs(device_time_saving(trace, 6_000) - 6_000) <= 10  # kernel lengths in ns
    assert device_time_saving(trace, 15_000) == behind
