"""`Trace.critical_path()`: the chain that sets each step's length, walked back from its
end across the host, launches, device queues and waits; its segments sum to the step."""

from __future__ import annotations

import json

import neuron_explorer
import pytest
from neuron_explorer.report import render_report

STEP_US = 1000


def _x(cat, name, pid, tid, ts, dur, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": args}


def _trace(tmp_path, events) -> neuron_explorer.Trace:
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": [
        _x("user_annotation", "ProfilerStep#0", 1, 1, 0, STEP_US), *events]}))
    return neuron_explorer.load(path)


def _launch(ts, corr):
    return _x("cuda_runtime", "cudaLaunchKernel", 1, 1, ts, 2, correlation=corr)


def _kernel(name, ts, dur, corr, stream=7):
    return _x("kernel", name, 0, stream, ts, dur, correlation=corr, device=0, stream=stream)


def _summed(path) -> dict:
    return path.groupby("category")["dur"].sum().div(1000).to_dict()


def test_a_device_bound_step_runs_through_its_kernels(tmp_path):
    """The host launches a, b, c by 10 us and waits [20, 1000) us; the kernels run back to
    back [12, 400), [400, 700), [700, 950): the path is the host until a's launch returns,
    a's launch latency, the three kernels, then the host noticing the end (sync latency)."""
    trace = _trace(tmp_path, [
        _launch(1, 1), _launch(4, 2), _launch(7, 3),
        _x("cuda_runtime", "cudaStreamSynchronize", 1, 1, 20, 980),
        _kernel("a", 12, 388, 1), _kernel("b", 400, 300, 2), _kernel("c", 700, 250, 3)])
    path = trace.critical_path()
    assert path["dur"].sum() == STEP_US * 1000
    assert list(path[path["category"] == "kernel"]["name"]) == ["a", "b", "c"]
    # a's launch call runs [1, 3) us, the host's own work; from its return to a's start
    # is the launch
    assert _summed(path) == pytest.approx({"python": 1, "op_dispatch": 2, "launch": 9,
                                           "kernel": 938, "sync": 50})
    assert (path["ts"].diff().dropna() > 0).all()  # contiguous, in time order
    assert ((path["ts"] + path["dur"]).shift().dropna() == path["ts"].iloc[1:]).all()


def test_a_host_bound_step_is_the_hosts(tmp_path):
    """The host launches a kernel of 10 us every 100 us and never waits: the device is
    never on the path."""
    events = []
    for i in range(9):
        events += [_launch(100 * i + 5, i + 1), _kernel("k", 100 * i + 12, 10, i + 1)]
    path = _trace(tmp_path, events).critical_path()
    assert set(path["kind"]) == {"host"}
    assert path["dur"].sum() == STEP_US * 1000


def test_a_kernel_waiting_on_another_queue_leads_to_that_queue(tmp_path):
    """b (stream 9) is launched at 5 us but starts at 600, when copy (stream 7) ends: the
    path runs through the copy, not a launch."""
    trace = _trace(tmp_path, [
        _launch(1, 1), _launch(5, 2),
        _x("cuda_runtime", "cudaStreamSynchronize", 1, 1, 10, 990),
        _kernel("copy", 100, 500, 1), _kernel("b", 600, 300, 2, stream=9)])
    path = trace.critical_path()
    assert list(path[path["category"] == "kernel"]["name"]) == ["copy", "b"]
    assert path["dur"].sum() == STEP_US * 1000


@pytest.mark.parametrize("name", ["mlp_eager.pftrace", "item_in_loop.pftrace",
                                  "gpt_compiled.pftrace"])
def test_every_step_of_a_sample_sums_to_the_step(repo_root, name):
    trace = neuron_explorer.load(repo_root / "sample_traces" / name)
    path = trace.critical_path()
    steps = trace.steps.set_index("step")["dur"]
    total = path.groupby("step")["dur"].sum()
    assert len(total) and (total == steps.reindex(total.index)).all()
    text = render_report(trace, "text")
    assert "Critical path (what sets the step's length" in text
