"""`Trace.critical_path()`: the chain that sets each step's length, walked back from its
end across the host, launches, device queues and waits; its segments sum to the step."""

from __future__ import annotations

import json

import neuron_explorer
import numpy as np
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


def test_kernel_ending_last_by_a_time_found_by_search() -> None:
    """The walk asks, once per kernel on the path, which kernel (of all, or of one queue)
    ended last at or before a time, other than one: a binary search over the kernels by
    end time gives what a scan of every kernel gives, ties (the lowest index) included."""
    from neuron_explorer.analyses.critical_path import _EndOrder

    def scanned(end, queue_of, t, queue, exclude):
        mask = end <= t
        if queue is not None:
            mask &= queue_of == queue
        if exclude >= 0:
            mask[exclude] = False
        idx = np.flatnonzero(mask)
        return int(idx[np.argmax(end[idx])]) if len(idx) else -1

    rng = np.random.default_rng(1)
    for _ in range(200):
        n = int(rng.integers(0, 40))
        end = rng.integers(0, 15, n).astype(np.int64)  # few distinct ends: many ties
        queue_of = rng.integers(0, 3, n).astype(np.int64)
        every = _EndOrder(np.arange(n), end)
        queues = {int(q): _EndOrder(np.flatnonzero(queue_of == q), end)
                  for q in np.unique(queue_of)}
        for _ in range(30):
            t, exclude = int(rng.integers(-2, 17)), int(rng.integers(-1, n)) if n else -1
            queue = None if rng.random() < 0.5 else int(rng.integers(0, 4))
            searched = every.last_by(t, exclude) if queue is None else \
                queues[queue].last_by(t, exclude) if queue in queues else -1
            assert searched == scanned(end, queue_of, t, queue, exclude)


def test_host_time_cut_into_runs_of_one_category() -> None:
    """The walk reads the host's category at any time from runs cut once: the first
    category in priority order covering a stretch, python where none does."""
    from neuron_explorer.analyses.critical_path import _host_runs, _HostTimeline
    from neuron_explorer.common.intervals import Union

    def union(*spans: tuple[int, int]) -> Union:
        return Union(np.array([a for a, _ in spans]), np.array([b for _, b in spans]))

    empty = union()
    assert _host_runs({"dataloader": empty, "compile": empty, "op_dispatch": empty})[1] == \
        ["python"]
    starts, categories = _host_runs({"dataloader": union((10, 20)), "compile": union((15, 40)),
                                     "op_dispatch": union((0, 12), (30, 50))})
    assert starts[1:].tolist() == [0, 10, 20, 40, 50]
    assert categories == ["python", "op_dispatch", "dataloader", "compile", "op_dispatch",
                          "python"]
    host = _HostTimeline.__new__(_HostTimeline)
    host._run_start, host._run_category = starts, categories
    assert host.work(5, 45, 7) == [(40, 5, "op_dispatch", "host", "op_dispatch", 7),
                                   (20, 20, "compile", "host", "compile", 7),
                                   (10, 10, "dataloader", "host", "dataloader", 7),
                                   (5, 5, "op_dispatch", "host", "op_dispatch", 7)]
    assert host.work(60, 70, 1) == [(60, 10, "python", "host", "python", 1)]
    assert host.work(3, 3, 1) == []
