"""A device that needs longer per step than its host, with nothing in a step waiting for
it, falls further behind every step: the run goes at the device's pace, which the host's
step windows do not show."""

from __future__ import annotations

import neuron_explorer
from neuron_explorer.report import render_report
from scenarios import STEP, Scenario


def _launches_each_step(tmp_path, kernel_ns: int, steps: int = 5):
    """One op per 10 us host step, launching a kernel of `kernel_ns` that starts when the
    device is free (no sync anywhere)."""
    sc = Scenario()
    free = 0
    for n in range(steps):
        t = sc.step(n)
        start = max(t + 100, free)
        free = start + kernel_ns
        sc.op(t, 500, "aten::mm", n + 1, n, kernel=(start, kernel_ns),
              busy={"tensor": kernel_ns}, flops=1_000_000, nbytes=1000, instructions=False)
    return neuron_explorer.load(sc.write(tmp_path, f"paced_{kernel_ns}"))


def test_a_device_behind_its_host_paces_the_run(tmp_path) -> None:
    trace = _launches_each_step(tmp_path, kernel_ns=13_000)
    s = trace.summary()
    assert s["host_step_ns"] == STEP  # the host's windows
    assert s["device_paced_step_ns"] == 13_000  # the device ends a step every 13 us
    assert s["step_time_ns"] == 13_000  # ... and so sets the run's pace
    # the first step lasts until its own kernel is done: 100 ns of launch latency + 13 us
    assert s["total_ns"] == 13_100 + 4 * 13_000
    assert s["device_busy_share"] == 5 * 13_000 / s["total_ns"]
    eff = trace.efficiency()
    assert eff["dur"].tolist() == [13_100] + [13_000] * 4  # MFU and MBU per paced step
    # the steps as timed, beside the host's windows `steps` holds
    times = trace.step_times()
    assert times["dur"].tolist() == [13_100] + [13_000] * 4
    assert times["host_dur"].tolist() == trace.steps["dur"].tolist() == [STEP] * 5
    assert times["dur"].sum() == s["total_ns"]
    text = render_report(trace, "text")
    assert "13 us (the device's pace)" in text
    line = next(x for x in text.splitlines() if x.startswith("host's step windows"))
    assert "10 us" in line and "3 us a step more than its host" in line
    assert "the device paces the run" in text


def test_a_device_that_keeps_up_adds_no_line(tmp_path) -> None:
    trace = _launches_each_step(tmp_path, kernel_ns=8_000)
    s = trace.summary()
    assert s["device_paced_step_ns"] == STEP  # each step's work ends a step apart
    assert s["step_time_ns"] == s["host_step_ns"] == STEP
    assert s["total_ns"] == 5 * STEP
    assert trace.step_times()["dur"].tolist() == [STEP] * 5
    text = render_report(trace, "text")
    assert "host's step windows" not in text and "device's pace" not in text
    assert "Critical path (what sets the step's length" in text


def test_windows_that_alternate_are_not_read_as_a_device_behind(tmp_path) -> None:
    """A rank that waits for another every other step: its windows alternate 3 and 9 us and
    its device work ends with each window. The medians of the windows (6 us, between the
    two) and of the device's intervals (9 us) fall on different steps; step by step the
    device keeps up."""
    sc = Scenario()
    start = 0
    for n, length in enumerate([3_000, 9_000] * 4):
        sc.b.slice(sc.host, start, length, f"step {n}", "step", {"step": n})
        sc.op(start, 200, "aten::mm", n + 1, n, kernel=(start + length - 1_000, 900),
              busy={"tensor": 900}, flops=1_000_000, nbytes=1000, instructions=False)
        start += length
    trace = neuron_explorer.load(sc.write(tmp_path, "alternating"))
    s = trace.summary()
    assert s["host_step_ns"] == 6_000 and s["device_paced_step_ns"] == 9_000
    assert not s["device_paces"] and s["step_time_ns"] == 6_000
    text = render_report(trace, "text")
    assert "device's pace" not in text and "host's step windows" not in text
