"""`Trace.critical_path()`: the chain that sets each step's length, walked back from its
end across the host, launches, device queues and waits; its segments sum to the step."""

from __future__ import annotations

import json
from pathlib import Path

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


@pytest.mark.parametrize("name", ["fsdp.run/rank0.pftrace", "straggler.run/rank2.pftrace",
                                  "serve.pftrace", "gpt_compiled.pftrace",
                                  "amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz",
                                  "mtia_trace_single_rank__mtia_rank_0.json.gz"])
def test_compiled_walk_gives_the_python_walks_path(name: str, real_traces_dir,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Traces with many kernels walk their critical path compiled: the same segments,
    names and tracks as the Python walk (collectives and their waits, syncs of no length,
    launches, dependencies, every step and one step), on our recordings and real ones."""
    import pandas as pd
    from neuron_explorer.analyses import critical_path as cp

    sample = Path(__file__).parents[2] / "sample_traces" / name
    trace = neuron_explorer.load(sample if sample.exists() else real_traces_dir / name)
    steps = [None, *trace.steps["step"].tolist()[:2]]
    python = [cp.critical_path(trace, step) for step in steps]
    monkeypatch.setattr(cp, "COMPILED_WALK_MIN", 0)
    compiled = [cp.critical_path(trace, step) for step in steps]
    assert len(python[0]) > 0
    for want, got in zip(python, compiled, strict=True):
        pd.testing.assert_frame_equal(want, got)


def test_compiled_walk_on_random_timelines() -> None:
    """Random host and device timelines on a coarse clock (many equal times: the ties of
    the walk's choices): the compiled walk takes the Python walk's every step."""
    import pandas as pd
    from neuron_explorer.analyses import critical_path_compiled as cc
    from neuron_explorer.analyses.critical_path import (
        _DeviceQueues,
        _HostTimeline,
        _segment_texts,
        _walk,
    )

    rng = np.random.default_rng(7)
    for _ in range(150):
        n_host, n_dev = int(rng.integers(1, 12)), int(rng.integers(0, 14))
        hs = pd.DataFrame({"kind": rng.choice(["sync", "op", "dataloader", "compile",
                                               "python"], n_host),
                           "ts": rng.integers(0, 40, n_host), "dur": rng.integers(0, 8, n_host),
                           "name": [f"h{i}" for i in range(n_host)], "track_id": 1})
        blocks = rng.integers(0, 40, 2), rng.integers(0, 5, 2)
        ts = rng.integers(0, 40, n_dev)
        launch = np.maximum(ts - rng.integers(0, 6, n_dev), 0)
        work = pd.DataFrame({"ts": ts, "dur": rng.integers(0, 6, n_dev),
                             "name": [f"k{i}" for i in range(n_dev)],
                             "wait": rng.integers(-1, 3, n_dev),
                             "collective": rng.random(n_dev) < 0.2,
                             "track": rng.integers(2, 5, n_dev), "launch": launch,
                             "launch_end": launch + rng.integers(0, 3, n_dev)})
        host, dev = _HostTimeline(hs, *blocks), _DeviceQueues(work)
        budget = 4 * (len(dev.ts) + len(host.sync_end)) + 16
        python = _walk(0, 48, host, dev, 1)
        seg_ts, seg_dur, what, ref = cc.walk(0, 48, budget, host, dev)
        kept = seg_dur > 0
        assert list(zip(seg_ts[kept].tolist(), seg_dur[kept].tolist(), strict=True)) == \
            [(s[0], s[1]) for s in python]
        # which segment each is: the categories the rows get from it
        _, kinds, categories, tracks = _segment_texts(what[kept], ref[kept], host, dev, 1)
        assert list(zip(kinds, categories, tracks.tolist(), strict=True)) == \
            [(s[3], s[4], s[5]) for s in python]
